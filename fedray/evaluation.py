"""Evaluation of models: the global test set spread over the workers, local test splits on the clients."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedray.client import Client
from fedray.federation import Federation
from fedray.models import TASK, Arch
from fedray.params import Params
from fedray.records import Record, rec
from fedray.train import EvalStats, evaluate, evaluate_batches, total


def model_msg(params: Params, arch: Arch = TASK) -> dict:
    """A message carrying a model: its parameters, and its arch when it is not the task's model."""
    return {"params": params} if arch == TASK else {"params": params, "arch": arch}


def received_model(client: Client, msg: dict) -> torch.nn.Module:
    return client.model(msg["params"], arch=msg.get("arch", TASK))


def eval_batches(client: Client, cstate: Any, msg: dict) -> tuple[list[EvalStats], Any]:
    """Client function: per-batch stats of the model ``msg["params"]`` on the client's test split."""
    return evaluate_batches(received_model(client, msg), client.test_batches()), cstate


def evaluate_global(fed: Federation, params: Params, arch: Arch = TASK) -> EvalStats:
    """The model ``params`` on the full global test set, spread over the workers (their devices)."""
    return total(fed.test_map(eval_batches, model_msg(params, arch)))


def local_eval(client: Client, cstate: Any, msg: dict) -> tuple[dict, Any]:
    """Client function: the received model on the client's own test split. State unchanged."""
    stats = evaluate(received_model(client, msg), client.test_batches())
    return {"correct": stats.correct, "samples": stats.samples, "loss_sum": stats.loss_sum}, cstate


def single_model_records(fed: Federation, params: Params, stage: str = "", arch: Arch = TASK) -> list[Record]:
    """accuracy/loss on the global test set, plus local_accuracy on clients' own test splits if they have them."""
    g = evaluate_global(fed, params, arch)
    records = [rec("accuracy", g.accuracy, stage=stage), rec("loss", g.loss, stage=stage)]
    with_test = [c for c, n in fed.num_test_examples().items() if n > 0]
    if with_test:
        replies = fed.map(local_eval, with_test, model_msg(params, arch))
        correct = np.array([replies[c]["correct"] for c in with_test])
        samples = np.array([replies[c]["samples"] for c in with_test])
        for c, k, n in zip(with_test, correct, samples, strict=True):
            records.append(rec("local_accuracy", k / n, scope="client", entity=c, stage=stage))
        records.append(rec("local_accuracy", correct.sum() / samples.sum(), stage=stage))
    return records
