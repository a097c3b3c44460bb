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

from fedray.algorithms.baselines import fedavg
from fedray.algorithms.baselines.fedavg import State, evaluate, init, models  # noqa: F401 - FedAvg's, part of the record
from fedray.algorithms.rounds import class_count_update
from fedray.config.hparams import bound
from fedray.engine.client import Client
from fedray.engine.update import Batch, Step
from fedray.federation import Federation
from fedray.records import Record

FLOOR = 1e-8  # the floor on class counts (FL-bench)


@dataclass
class Hparams(fedavg.ServerHparams):
    # calibration strength (FedConcat tunes {0.1, 1, 5})
    tau: float = field(default=1.0, metadata=bound(ge=0))


def calibration(counts: np.ndarray, tau: float) -> np.ndarray:
    """tau * n_c^(-1/4), with n_c floored at 1e-8."""
    return tau * np.maximum(np.asarray(counts, dtype=np.float64), FLOOR) ** -0.25


def calibrated(model: Any, batch: Batch, context: dict) -> Step:
    """Cross-entropy on the logits minus the offsets (context ``per_class``); the reported logits
    are the raw ones."""
    out = model(batch.x)
    ce = batch.cross_entropy(out - context["per_class"])
    return Step(out, ce, ce)


def fedlc_update(client: Client, cstate: Any, msg: dict, tau: float):
    """FedAvg's client update with the loss on logits minus the client's calibration offsets."""
    return (yield from class_count_update(client, cstate, msg, partial(calibration, tau=tau), calibrated))


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    return fedavg.fedavg_round(state, fed, hp, rnd, partial(fedlc_update, tau=hp.tau))
