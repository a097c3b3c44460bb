"""Reusable pieces of a FedAvg-style round (ALGORITHMS.md §0.2): local update, aggregation, train stats."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedray.client import Client
from fedray.params import Params, get_params, weighted_average
from fedray.records import Record, rec
from fedray.train import ExtraLoss, local_train


def local_sgd_reply(
    client: Client, params: Params, rnd: int, extra_loss: ExtraLoss | None = None
) -> dict[str, Any]:
    """Load ``params``, run the local epochs, and report the new params with the training stats."""
    model = client.model(params)
    stats = local_train(model, client, rnd, extra_loss=extra_loss)
    return {
        "params": get_params(model),
        "num_examples": client.num_examples,
        "train_loss_sum": stats.loss_sum,
        "train_correct": stats.correct,
        "train_samples": stats.samples,
        "steps": stats.steps,
    }


def fedavg_aggregate(replies: Mapping[int, Mapping[str, Any]]) -> Params:
    """w = sum_i (n_i / sum_j n_j) w_i over the replies, in sorted client order."""
    cids = sorted(replies)
    return weighted_average([replies[c]["params"] for c in cids], [replies[c]["num_examples"] for c in cids])


def train_records(replies: Mapping[int, Mapping[str, Any]], stage: str = "") -> list[Record]:
    """Sample-weighted training loss and accuracy of this round's local training."""
    samples = sum(r["train_samples"] for r in replies.values())
    if samples == 0:
        return []
    loss = sum(r["train_loss_sum"] for r in replies.values()) / samples
    acc = sum(r["train_correct"] for r in replies.values()) / samples
    return [
        rec("train_loss", loss, stage=stage),
        rec("train_accuracy", acc, stage=stage),
        rec("participants", len(replies), stage=stage),
    ]
