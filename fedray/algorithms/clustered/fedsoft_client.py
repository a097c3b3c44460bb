"""FedSoft's client side (`fedsoft.py`): the importance weights each client estimates, the personal
model it trains with the proximal pull towards theta_bar, and that model's evaluation."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from fedray.algorithms.evaluation import stats_reply
from fedray.algorithms.rounds import local_sgd_reply
from fedray.engine.client import Client
from fedray.engine.stats import EvalStats
from fedray.engine.update import Evaluation, proximal
from fedray.params import Params, weighted_average


def importance(losses: np.ndarray, sigma: float) -> np.ndarray:
    """u_k = (number of samples on which model k has the smallest loss, a zero count as sigma * n) / n,
    from K x n losses."""
    k, n = losses.shape
    counts = np.bincount(np.argmin(losses, axis=0), minlength=k).astype(np.float64)
    counts[counts == 0] = sigma * n
    return counts / n


def anchor(models: list[Params], u: np.ndarray) -> Params:
    """theta_bar = sum_k u_k theta_k / sum_k u_k."""
    return weighted_average(models, list(u))


def estimate(client: Client, cstate: Any, msg: dict) -> Generator[list[Evaluation], list[np.ndarray], tuple]:
    """Client function: the client's importance weights under the current cluster models (each
    model's per-sample losses on its training split)."""
    losses = yield [Evaluation(m, per_sample="loss") for m in msg["models"]]
    return importance(np.stack(losses), msg["sigma"]), cstate


def personal_update(client: Client, cstate: Any, msg: dict):
    """Client function: the personal model (theta_bar the first time) trained with the proximal pull."""
    u, models = np.asarray(msg["u"][client.cid]), msg["models"]
    bar = anchor(models, u)
    start = bar if cstate is None else cstate
    context = {"anchor": bar, "mu": msg["lam"] * float(u.sum())}
    reply = yield from local_sgd_reply(client, start, msg["round"], proximal, context)
    return reply, reply["params"]


def personal_eval(
    client: Client, cstate: Any, msg: dict
) -> Generator[Evaluation, EvalStats, tuple[dict, Any]]:
    """Client function: the personal model (theta_bar if none yet) on the client's test split (or,
    with ``on: train``, its training split)."""
    params = cstate if cstate is not None else anchor(msg["models"], np.asarray(msg["u"][client.cid]))
    stats = yield Evaluation(params, "train" if msg.get("on") == "train" else "test")
    return stats_reply(stats), cstate
