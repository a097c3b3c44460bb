"""FedNova: Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020 (docs/algorithms/baselines.md#fednova; NIID-Bench
train_net_fednova, branch fednova).

Clients train as in FedAvg (tau_i local SGD steps with momentum rho = the config's momentum) and
report their model and tau_i (FedAvg's reply); the server computes
a_i = [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho) (tau_i when rho = 0), which the
reference code has the client send: the same value, and nothing more travels than in FedAvg. With p_i = n_i / sum_j n_j over the participants (``weights: samples``, the paper's data
sizes; ``weights: batches`` is NIID-Bench's code, whose n_i is ``len(train_dl_local)``, the client's
batches per epoch: docs/algorithms/baselines.md#d1-fednovas-client-weights), the server sets w <- w - (sum_i p_i a_i) sum_i p_i (w - w_i) / a_i. Computed as the p-weighted
average of w + r_i (w_i - w), r_i = (sum_j p_j a_j) / a_i, in float64: the same update, and with
equal a_i (equal steps) exactly FedAvg's average. Integer buffers are rounded back to integers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedray.algorithms.baselines.fedavg import State, evaluate, init, models  # noqa: F401 - FedAvg's, part of the record
from fedray.algorithms.rounds import local_update, train_records
from fedray.config.hparams import one_of
from fedray.federation import Federation
from fedray.params import Params, weighted_average
from fedray.records import Record

WEIGHTS = ("samples", "batches")


@dataclass
class Hparams:
    """rho is the config's momentum."""

    # p_i by the client's samples (the paper) or its batches per epoch (NIID-Bench's code)
    weights: str = field(default="samples", metadata=one_of(*WEIGHTS))


def normalizer(steps: int, rho: float) -> float:
    """a_i for tau_i = ``steps`` SGD steps with momentum ``rho``."""
    if rho == 0:
        return float(steps)
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


def nova_average(current: Params, locals_: list[Params], weights: list[float], a: list[float]) -> Params:
    """w - (sum p_i a_i) sum p_i (w - w_i) / a_i, p = weights normalised: the p-weighted average of
    w + r_i (w_i - w) with r_i = (sum_j p_j a_j) / a_i, in float64 (exactly FedAvg's when r_i = 1)."""
    p = np.asarray(weights, dtype=np.float64) / np.sum(weights)
    a_eff = float(np.dot(p, a))
    w = {k: np.asarray(v, np.float64) for k, v in current.items()}
    rescaled = [
        {k: w[k] + (a_eff / ai) * (np.asarray(wi[k], np.float64) - w[k]) for k in w}
        for wi, ai in zip(locals_, a, strict=True)
    ]
    return weighted_average(rescaled, list(p), like=current)


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    cids = fed.sample(fed.task.participation, fed.task.rng("sample", rnd=rnd))
    replies = fed.map(local_update, cids, {"params": state.params, "round": rnd})  # FedAvg's clients
    order = sorted(replies)
    params = nova_average(
        state.params,
        [replies[c]["params"] for c in order],
        [replies[c]["num_examples" if hp.weights == "samples" else "steps"] for c in order],
        [normalizer(replies[c]["steps"], fed.task.momentum) for c in order],
    )
    return State(params), train_records(replies)
