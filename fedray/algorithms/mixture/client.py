"""A client of a mixture of K global models (FedEM, FedRC): its persistent state and its update.

Per round (`mixture_update`): an E-step with the received models (per-sample losses l_kj on its
training split, eval mode; gamma_kj = softmax_k(log omega_k - l_kj), FedRC: minus log C_{y_j,k};
omega_k = mean_j gamma_kj), the per-class gamma sums S[k, y] (FedRC's label prior; FedEM ignores
them), then each model with omega_k > 0 trained for the local epochs on (1/|B|) sum_b gamma_bk CE_b
from the received weights.

The losses l_kj are those of the models the last evaluation ran on the same split (its ensemble's
train accuracy): where every client takes part in every round, the evaluation keeps them in the
client's state (``next_losses``, for round ``next_round``) and the E-step reads them instead of a
second pass over the split with the same models (the same numbers; a fifth of a FedRC round on the
CPU). They are the losses of the models the run's state holds from that evaluation to the next
round, which sends the same ones (the algorithm's code keeps it so). A client that missed that
evaluation (``eval_clients``; a round of other model ids) evaluates them again.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fedray.algorithms import mixture
from fedray.engine.client import Client
from fedray.engine.stats import TrainStats
from fedray.engine.update import Evaluation, LocalUpdate
from fedray.params import Params
from fedray.storage.blobs import checkpoint_tag


@checkpoint_tag("mixture.ClientMixture", "fedray.mixture.client:ClientMixture")
@dataclass
class ClientMixture:
    """A client's persistent mixture state (plain arrays)."""

    ids: list[int]  # the live model ids the rows below belong to
    gamma: np.ndarray  # K x n responsibilities of its training samples
    omega: np.ndarray  # K mixture weights
    nu: np.ndarray | None = None  # FedRC-Adam's first moment of gamma (K x n)
    a: np.ndarray | None = None  # FedRC-Adam's second moment
    opt: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)  # model id -> SGD buffers
    # the per-sample losses (K x n) of the models round ``next_round`` sends, as the evaluation
    # before it found them on the training split (`fedray.algorithms.mixture.ensemble.own_ensemble_eval`)
    next_losses: np.ndarray | None = None
    next_round: int = -1


def fresh(ids: list[int], n: int) -> ClientMixture:
    k = len(ids)
    return ClientMixture(list(ids), np.full((k, n), 1.0 / k), np.full(k, 1.0 / k))


def aligned(cstate: ClientMixture | None, ids: list[int], n: int) -> ClientMixture:
    """The client's state for the live models ``ids``: fresh (1/K) the first time; rows of removed
    models dropped and the rest renormalised (FedRC's adaptive removal)."""
    if cstate is None:
        return fresh(ids, n)
    if cstate.ids == list(ids):
        return cstate
    keep = np.array([i in ids for i in cstate.ids])
    gamma, omega = mixture.drop_models(cstate.gamma, keep)
    nu = None if cstate.nu is None else cstate.nu[keep]
    a = None if cstate.a is None else cstate.a[keep]
    return ClientMixture(list(ids), gamma, omega, nu, a, {i: s for i, s in cstate.opt.items() if i in ids})


def e_step(
    client: Client, state: ClientMixture, models: list[Params], msg: dict
) -> Generator[list[Evaluation], list[np.ndarray], ClientMixture]:
    """gamma and omega from the received models (with the label prior and Adam where the message
    says): each model's per-sample losses on the training split, yielded (`fedray.Evaluation`), or
    those the last evaluation kept for this round (``next_losses``)."""
    kept = state.next_losses if "round" in msg and state.next_round == msg["round"] else None
    if kept is not None:  # kept for these models: `aligned` drops it where their ids changed
        # nothing to evaluate, yet a step as the others': a call's clients that kept losses and
        # those that evaluate again then yield their updates together (one stack, as without kept)
        yield []
        losses = kept
    else:
        losses = np.stack((yield [Evaluation(m, per_sample="loss") for m in models]))
    gamma = mixture.e_step(losses, state.omega, client.train_labels(), msg.get("prior"))
    nu, a = state.nu, state.a
    if msg.get("adam") is not None:
        zero = np.zeros_like(gamma)
        gamma, nu, a = mixture.adam_gamma(
            state.gamma, gamma, zero if nu is None else nu, zero if a is None else a, msg["adam"]
        )
    return replace(
        state, gamma=gamma, omega=mixture.omega_update(gamma), nu=nu, a=a, next_losses=None, next_round=-1
    )


def train_models(client: Client, state: ClientMixture, models: list[Params], msg: dict):
    """Each model with omega_k > 0 trained on the gamma-weighted loss (its kept SGD buffers with
    ``persistent_optimizer``), all of them yielded at once (one stack where the host trains
    batched); gives the trained models (None for skipped ones) and the summed training stats."""
    live = [row for row in range(len(state.ids)) if state.omega[row] > 0]
    keep = msg["persistent_optimizer"]
    updates = [
        LocalUpdate(
            models[r],
            msg["round"],
            weights=state.gamma[r],
            buffers=state.opt.get(state.ids[r]) if keep else None,
            keep_buffers=keep,
        )
        for r in live
    ]
    trained = (yield updates) if updates else []
    out, total = [None] * len(state.ids), TrainStats()
    for r, t in zip(live, trained, strict=True):
        out[r] = t.params
        if keep:
            state.opt[state.ids[r]] = t.buffers
        total.add(t.stats)
    return out, total


def mixture_update(client: Client, cstate: Any, msg: dict):
    """Client function: E-step, omega, label statistics, then the weighted training of each model."""
    ids, models = msg["ids"], msg["models"]
    state = yield from e_step(client, aligned(cstate, ids, client.num_examples), models, msg)
    stats = mixture.label_stats(state.gamma, client.train_labels(), client.task.spec.num_classes)
    if msg.get("xi", 0.0) > 0:  # FedRC's privacy variant: Gaussian noise on what leaves the client
        stats = stats + client.task.rng("fedrc/noise", client.cid, msg["round"]).normal(
            0.0, msg["xi"], stats.shape
        )
    trained, ts = yield from train_models(client, state, models, msg)
    reply = {
        "models": trained,
        "num_examples": client.num_examples,
        "stats": stats,
        "omega": state.omega,
        "train_loss_sum": ts.loss_sum,
        "train_correct": ts.correct,
        "train_samples": ts.samples,
        "steps": ts.steps,
    }
    return reply, state


def test_client_e_step(client: Client, cstate: Any, msg: dict) -> Generator[Any, Any, tuple[None, Any]]:
    """Client function for a test client (FedEM, FedRC), after every round: one E-step (FedEM's
    form: test clients never get the label prior) and omega update on its E-step split (the shift
    preset's 90%, a client file's x_train) with the round's models, kept (docs/algorithms/mixture.md#procedure,
    evaluation protocol)."""
    state = yield from e_step(client, aligned(cstate, msg["ids"], client.num_examples), msg["models"], {})
    return None, state


def report_omega(client: Client, cstate: Any, msg: dict) -> tuple[np.ndarray, Any]:
    """Client function (evaluation): the client's current omega over the live models."""
    return aligned(cstate, msg["ids"], client.num_examples).omega, cstate
