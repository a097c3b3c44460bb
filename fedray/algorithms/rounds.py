"""Reusable pieces of a FedAvg-style round (docs/algorithms/common.md#the-fedavg-core): local update, aggregation, train
stats, and the cluster-wise FedAvg round (docs/algorithms/fedconcat.md#stage-2-cluster-wise-fedavg step 7)."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import numpy as np

from fedray.engine.client import Client
from fedray.engine.update import LocalUpdate, Objective, Trained, cross_entropy
from fedray.federation import Federation
from fedray.params import Params, weighted_average
from fedray.records import Record, rec


def local_sgd_reply(
    client: Client,
    params: Params,
    rnd: int,
    objective: Objective = cross_entropy,
    context: Mapping[str, Any] | None = None,
    **update: Any,
) -> Generator[LocalUpdate, Trained, dict[str, Any]]:
    """Train ``params`` for the local epochs on ``objective`` (with its ``context``; ``update``: the
    other `LocalUpdate` fields) and give FedAvg's reply: the new params with the training stats. A
    client function says ``reply = yield from local_sgd_reply(...)``."""
    trained = yield LocalUpdate(params, rnd, objective, dict(context or {}), **update)
    return train_reply(client, trained.params, trained.stats)


def class_count_update(
    client: Client,
    cstate: Any,
    msg: dict,
    per_class: Callable[[np.ndarray], np.ndarray],
    objective: Objective,
) -> Generator[LocalUpdate, Trained, tuple[dict, Any]]:
    """FedAvg's client update whose objective reads a per-class vector of the client's own label
    counts (FedRS's softmax scales, FedLC's logit offsets) as its context ``per_class``, in float32."""
    v = np.asarray(per_class(client.label_counts()), dtype=np.float32)
    reply = yield from local_sgd_reply(client, msg["params"], msg["round"], objective, {"per_class": v})
    return reply, cstate


def train_reply(client: Client, params: Params, stats: Any) -> dict[str, Any]:
    """What a client sends back after local training: its parameters, its size and the training stats."""
    return {
        "params": params,
        "num_examples": client.num_examples,
        "train_loss_sum": stats.loss_sum,
        "train_correct": stats.correct,
        "train_samples": stats.samples,
        "steps": stats.steps,
    }


def kept_optimizer_update(
    client: Client,
    params: Params,
    rnd: int,
    buffers: dict | None,
    *,
    keep: bool,
    weights: np.ndarray | None = None,
) -> Generator[LocalUpdate, Trained, tuple[dict[str, Any], dict | None]]:
    """Train ``params`` for the local epochs with SGD whose buffers (momentum) continue from
    ``buffers`` when ``keep`` (the client's own optimizer across rounds: CFL, IFCA as the FedRC code
    runs them); gives FedAvg's reply and the buffers to keep (None without ``keep``). ``weights``:
    per-sample loss weights. A client function says ``reply, kept = yield from ...``."""
    trained = yield LocalUpdate(
        params,
        rnd,
        weights=weights,
        buffers=buffers if keep else None,
        keep_buffers=keep,
    )
    return train_reply(client, trained.params, trained.stats), (trained.buffers if keep else None)


def kept_update(client: Client, cstate: Any, msg: Mapping[str, Any]):
    """Client function with the FedRC code's local SGD (FedAvg with ``persistent_optimizer``, CFL):
    ``msg["params"]`` trained for the local epochs, the client's momentum buffers (its state)
    carried over with ``msg["persistent_optimizer"]``; the last partial batch dropped where the run
    drops it (`fedray.experiment.local.drops_last`: the algorithm's hp.drop_last or the config key)."""
    return (
        yield from kept_optimizer_update(
            client,
            msg["params"],
            msg["round"],
            cstate,
            keep=msg["persistent_optimizer"],
        )
    )


def msg_epochs(client: Client, msg: Mapping[str, Any]) -> int | None:
    """The local epochs a round's message gives this client (a straggler's, FedAvg's
    ``hp.stragglers``), or None: the task's."""
    return msg.get("epochs", {}).get(client.cid)


def local_update(client: Client, cstate: Any, msg: dict) -> Generator[LocalUpdate, Trained, tuple[dict, Any]]:
    """FedAvg's client function: train the received ``params`` for the round's local epochs (a
    straggler's fewer, where the message names it)."""
    reply = yield from local_sgd_reply(client, msg["params"], msg["round"], epochs=msg_epochs(client, msg))
    return reply, cstate


def reply_bytes(params: Params, copies: int = 1) -> int:
    """The size of a reply carrying ``copies`` models like ``params``: a folded round passes it to
    `Federation.map_fold` (``reply_bytes``), which gives each worker as many clients a call as its
    replies at a time hold (64 MB on the CPU, more on a GPU: `fedray.federation.host.fold_bytes`)."""
    return copies * sum(np.asarray(v).nbytes for v in params.values())


def train_stats(reply: Mapping[str, Any]) -> dict[str, Any]:
    """What `train_records` reads of a reply (a folded round keeps this much of each)."""
    return {k: reply[k] for k in ("train_loss_sum", "train_correct", "train_samples")}


def fedavg_aggregate(replies: Mapping[int, Mapping[str, Any]]) -> Params:
    """w = sum_i (n_i / sum_j n_j) w_i over the replies, in sorted client order."""
    cids = sorted(replies)
    return weighted_average([replies[c]["params"] for c in cids], [replies[c]["num_examples"] for c in cids])


def train_records(replies: Mapping[int, Mapping[str, Any]], stage: str = "") -> list[Record]:
    """Sample-weighted loss and accuracy of this round's local SGD steps, as they ran (``sgd_loss``,
    ``sgd_accuracy``; ``train_accuracy`` is the evaluation's: `evaluation.train_split_records`)."""
    samples = sum(r["train_samples"] for r in replies.values())
    if samples == 0:
        return []
    loss = sum(r["train_loss_sum"] for r in replies.values()) / samples
    acc = sum(r["train_correct"] for r in replies.values()) / samples
    return [
        rec("sgd_loss", loss, stage=stage),
        rec("sgd_accuracy", acc, stage=stage),
        rec("participants", len(replies), stage=stage),
    ]


def clustered_fedavg_round(
    fed: Federation, models: Sequence[Params], assignment: Mapping[int, int], rnd: int, stage: str = ""
) -> tuple[list[Params], list[Record]]:
    """One round of FedAvg in every cluster at once (docs/algorithms/fedconcat.md#stage-2-cluster-wise-fedavg step 7).

    The round's participants (FedAvg's sampling) train their cluster's model, every cluster in the
    same parallel dispatch; each cluster's model becomes the data-size-weighted average of its
    participants'. A cluster with no participant this round keeps its model. With one cluster this
    is FedAvg's round exactly (same sampling stream, messages and aggregation).
    """
    cids = fed.sample(fed.task.participation, fed.task.rng("sample", rnd=rnd))
    members = {k: [c for c in cids if assignment[c] == k] for k in range(len(models))}
    replies = fed.map_groups(
        local_update, [(m, {"params": models[k], "round": rnd}) for k, m in members.items() if m]
    )
    new = list(models)
    records = train_records(replies, stage)
    for k, m in members.items():
        if m:
            new[k] = fedavg_aggregate({c: replies[c] for c in m})
        records.append(rec("participants", len(m), scope="cluster", entity=k, stage=stage))
    return new, records
