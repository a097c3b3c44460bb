"""FedLC: Zhang, Li, Li, Xu, Zhu, Sun, "Federated Learning with Label Distribution Skew via Logits
Calibration", ICML 2022 (docs/algorithms/baselines.md#fedlc; the authors' code was not found: the behaviour
FL-bench's fedlc.py and fluke agree on).

FedAvg's round; in local training the logits are calibrated to f_c(x) - tau n_c^(-1/4), n_c being
the client's count of class c, floored at 1e-8 (FL-bench; an absent class gets the offset
100 tau), and the loss is the usual softmax cross-entropy over all classes. Evaluation uses the raw
logits. tau = 0 is FedAvg exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch

from fedray.algorithms.baselines import fedavg
from fedray.algorithms.baselines.fedavg import State, evaluate, init, models  # noqa: F401 - FedAvg's, part of the record
from fedray.algorithms.rounds import class_count_update, stacked_replies
from fedray.batched import register_batched
from fedray.client import Client
from fedray.federation import Federation
from fedray.hparams import bound
from fedray.records import Record
from fedray.train import Objective, Step

FLOOR = 1e-8  # the floor on class counts (FL-bench)


@dataclass
class Hparams(fedavg.ServerHparams):
    # calibration strength (FedConcat tunes {0.1, 1, 5})
    tau: float = field(default=1.0, metadata=bound(ge=0))


def calibration(counts: np.ndarray, tau: float) -> np.ndarray:
    """tau * n_c^(-1/4), with n_c floored at 1e-8."""
    return tau * np.maximum(np.asarray(counts, dtype=np.float64), FLOOR) ** -0.25


def calibrated(offset: torch.Tensor) -> Objective:
    def objective(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Step:
        out = model(x)
        ce = torch.nn.functional.cross_entropy(out - offset, y)
        return Step(out, ce, ce)

    return objective


def fedlc_update(client: Client, cstate: Any, msg: dict, tau: float) -> tuple[dict, Any]:
    """FedAvg's client update with the loss on logits minus the client's calibration offsets."""
    return class_count_update(client, cstate, msg, partial(calibration, tau=tau), calibrated)


@register_batched(fedlc_update)
def fedlc_update_batched(clients: list[Client], cstates: list[Any], msgs: list[dict], tau: float) -> list[tuple[dict, Any]]:
    offsets = [calibration(c.label_counts(), tau) for c in clients]
    return stacked_replies(clients, cstates, msgs, adjust=lambda out, v, params: out - v, per_client=offsets)


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    return fedavg.fedavg_round(state, fed, hp, rnd, partial(fedlc_update, tau=hp.tau))
