"""FedEM: Marfoq, Neglia, Bellet, Kameni, Vidal, "Federated Multi-Task Learning under a Mixture of
Distributions", NeurIPS 2021 (ALGORITHMS.md §4.1), as the FedRC codebase runs it; and the mixture
skeleton FedRC extends (ALGORITHMS.md §3(a), `fedrc.py`).

K global models. Each participant, per round (client state: gamma K x n, omega K, and with
``persistent_optimizer`` one SGD buffer set per model):

1. E-step with the received models: per-sample losses l_kj on its training split (eval mode),
   gamma_kj = softmax_k(log omega_k - l_kj) (FedRC: minus log C_{y_j,k}); omega_k = mean_j gamma_kj;
2. trains each model with omega_k > 0 for the local epochs on (1/|B|) sum_b gamma_bk CE_b, from
   the received weights (drop_last batches, as the code's loaders);
3. reports per-class gamma sums S[k, y] (FedRC's label prior; FedEM ignores them).

The server averages each model over every sampled client (weights n_i over the participants, the
paper's Algorithm 1 and the FedRC code): a participant that skipped model k (omega_k = 0) counts
with the model it received, so a model few clients train moves little (FedEM's own code weighs over
all clients, the same at full participation).
Model k starts from its own init (seed + k, as the code). Replies are folded into the per-model
averages one at a time (`Federation.map_fold`), so the coordinator never holds every client's K
models. Prediction is the omega-weighted softmax
ensemble (``hard_predict``: the argmax model's). ``accuracy`` is that ensemble on the global test
set with the population's omega (the size-weighted mean of the clients' omega). With the shift
preset's test clients it is their mean accuracy: after every round (as the FedRC code does at its
default log_freq of 1, whatever the evaluation interval) each test client takes the new models, runs
one E-step (FedEM's form: test clients never get the label prior) on its 90% and keeps its omega;
an evaluation reads its ensemble on its 10%, so the number at a round does not depend on
``eval_every``. ``local_accuracy`` is each client's ensemble on its test split, ``train_accuracy``
on its training split (pooled; FedRC reads its numbers at the round of best train accuracy:
``fedray report --at best-train``).
Per round, every participant's omega goes to ``assignments/`` (one row per model, weight omega_k).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from fedray import mixture
from fedray.client import Client
from fedray.clustering import purity
from fedray.evaluation import test_client_records
from fedray.export import SavedModel, cluster_models
from fedray.federation import Federation
from fedray.hparams import bound
from fedray.params import Params, WeightedSum, get_params
from fedray.records import Record, assign, rec
from fedray.train import TrainStats, load_optimizer_state, local_train, optimizer_state, sample_losses, sgd


@dataclass
class Hparams:
    num_clusters: int = field(default=3, metadata=bound(ge=1))  # K: mixture components (global models)
    # predict with the client's argmax-omega model instead of the omega-weighted ensemble
    hard_predict: bool = False
    # each client keeps its SGD buffers per model across rounds (the code does)
    persistent_optimizer: bool = True
    drop_last: bool = True  # drop each epoch's last partial batch (the code's loaders)


@dataclass
class State:
    models: dict[int, Params]  # model id -> theta_k (ids stay fixed when FedRC removes a model)
    prior: np.ndarray | None = None  # FedRC: C_{y,k}, K x C over the live models (None: FedEM)
    stats: dict[int, np.ndarray] = field(default_factory=dict)  # FedRC: each client's last reported S, K x C
    shares: np.ndarray | None = None  # FedRC: each live model's share of all responsibilities, last round


def models(state: State, hp: Hparams) -> list[SavedModel]:
    """The K component models (ids fixed: a model FedRC removed is missing)."""
    return cluster_models(state.models)


def init(fed: Federation, hp: Hparams) -> State:
    return State(fed.task.init_models(hp.num_clusters))


# ---- client side --------------------------------------------------------------------------------


@dataclass
class ClientMixture:
    """A client's persistent mixture state (plain arrays)."""

    ids: list[int]  # the live model ids the rows below belong to
    gamma: np.ndarray  # K x n responsibilities of its training samples
    omega: np.ndarray  # K mixture weights
    nu: np.ndarray | None = None  # FedRC-Adam's first moment of gamma (K x n)
    a: np.ndarray | None = None  # FedRC-Adam's second moment
    opt: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)  # model id -> SGD buffers


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


def e_step(client: Client, state: ClientMixture, models: list[Params], msg: dict) -> ClientMixture:
    """gamma and omega from the received models (with the label prior and Adam where the message says)."""
    losses = sample_losses(client, models, client.eval_train_batches)
    gamma = mixture.e_step(losses, state.omega, client.train_labels(), msg.get("prior"))
    nu, a = state.nu, state.a
    if msg.get("adam") is not None:
        zero = np.zeros_like(gamma)
        gamma, nu, a = mixture.adam_gamma(
            state.gamma, gamma, zero if nu is None else nu, zero if a is None else a, msg["adam"]
        )
    return replace(state, gamma=gamma, omega=mixture.omega_update(gamma), nu=nu, a=a)


def train_models(
    client: Client, state: ClientMixture, models: list[Params], msg: dict
) -> tuple[list, TrainStats]:
    """Each model with omega_k > 0 trained on the gamma-weighted loss; None for skipped models."""
    out, total = [], TrainStats()
    for row, (mid, params) in enumerate(zip(state.ids, models, strict=True)):
        if state.omega[row] <= 0:
            out.append(None)
            continue
        model = client.model(params)
        opt = sgd(model.parameters(), client)
        if msg["persistent_optimizer"] and mid in state.opt:
            load_optimizer_state(opt, model, state.opt[mid])
        stats = local_train(model, client, msg["round"], optimizer=opt, weights=state.gamma[row],
                            drop_last=msg["drop_last"])  # fmt: skip
        if msg["persistent_optimizer"]:
            state.opt[mid] = optimizer_state(opt, model)
        out.append(get_params(model))
        for f in ("samples", "loss_sum", "correct", "steps"):
            setattr(total, f, getattr(total, f) + getattr(stats, f))
    return out, total


def mixture_update(client: Client, cstate: Any, msg: dict) -> tuple[dict, Any]:
    """Client function: E-step, omega, label statistics, then the weighted training of each model."""
    ids, models = msg["ids"], msg["models"]
    state = e_step(client, aligned(cstate, ids, client.num_examples), models, msg)
    stats = mixture.label_stats(state.gamma, client.train_labels(), client.task.spec.num_classes)
    if msg.get("xi", 0.0) > 0:  # FedRC's privacy variant: Gaussian noise on what leaves the client
        stats = stats + client.task.rng("fedrc/noise", client.cid, msg["round"]).normal(
            0.0, msg["xi"], stats.shape
        )
    trained, ts = train_models(client, state, models, msg)
    reply = {
        "models": trained,
        "num_examples": client.num_examples,
        "stats": stats,
        "omega": state.omega,
        "train_loss_sum": ts.loss_sum, "train_correct": ts.correct, "train_samples": ts.samples, "steps": ts.steps,
    }  # fmt: skip
    return reply, state


@torch.no_grad()
def ensemble_eval(client: Client, state: ClientMixture, models: list[Params], hard: bool, batches) -> dict:
    """Correct predictions and summed NLL of the omega-weighted softmax ensemble on ``batches``."""
    probas, labels = [], []
    for params in models:
        model = client.model(params)
        model.eval()
        out = []
        for x, y in batches():
            out.append(torch.softmax(model(x), 1).cpu().numpy())
            if not probas:  # the labels once, from the first model's pass
                labels.append(y.cpu().numpy())
        probas.append(np.concatenate(out))
    ys = np.concatenate(labels)
    p = mixture.ensemble_proba(np.stack(probas), state.omega, hard)
    return {
        "correct": int((p.argmax(1) == ys).sum()),
        "samples": len(ys),
        "loss_sum": float(-np.log(np.maximum(p[np.arange(len(ys)), ys], 1e-12)).sum()),
    }


def own_ensemble_eval(client: Client, cstate: Any, msg: dict) -> tuple[dict, Any]:
    """Client function: the client's ensemble (its omega) on its training split and, if it has one,
    its test split (FedRC's train and local accuracy). State unchanged."""
    state = aligned(cstate, msg["ids"], client.num_examples)
    out = {"train": ensemble_eval(client, state, msg["models"], msg["hard"], client.eval_train_batches)}
    if client.num_test_examples:
        out["test"] = ensemble_eval(client, state, msg["models"], msg["hard"], client.test_batches)
    return out, cstate


def pooled(replies: dict, part: str) -> float:
    got = [r[part] for r in replies.values() if part in r]
    return sum(g["correct"] for g in got) / max(1, sum(g["samples"] for g in got))


def global_ensemble_eval(client: Client, cstate: Any, msg: dict) -> tuple[list, Any]:
    """test_map function: the ensemble with the population's omega on a shard of the global test set."""
    state = ClientMixture(msg["ids"], np.zeros((0, 0)), np.asarray(msg["omega"]))
    return [ensemble_eval(client, state, msg["models"], msg["hard"], client.test_batches)], cstate


def test_client_e_step(client: Client, cstate: Any, msg: dict) -> tuple[None, Any]:
    """Client function for a FedRC test client, after every round: one E-step (FedEM's form: test
    clients never get the label prior) and omega update on its 90% part with the round's models,
    kept (ALGORITHMS.md §3(a), evaluation protocol)."""
    return None, e_step(client, aligned(cstate, msg["ids"], client.num_examples), msg["models"], {})


def test_client_eval(client: Client, cstate: Any, msg: dict) -> tuple[dict, Any]:
    """Client function for a FedRC test client: its ensemble (the omega of its latest E-step) on its
    10% part. State unchanged."""
    state = aligned(cstate, msg["ids"], client.num_examples)
    return ensemble_eval(client, state, msg["models"], msg["hard"], client.test_batches), cstate


def update_test_clients(fed: Federation, state: State) -> None:
    """The shift preset's test clients take the round's models and run their E-step."""
    if fed.test_client_ids:
        ids = sorted(state.models)
        fed.map(
            test_client_e_step, fed.test_client_ids, {"ids": ids, "models": [state.models[i] for i in ids]}
        )


def report_omega(client: Client, cstate: Any, msg: dict) -> tuple[np.ndarray, Any]:
    """Client function (evaluation): the client's current omega over the live models."""
    return aligned(cstate, msg["ids"], client.num_examples).omega, cstate


# ---- server side --------------------------------------------------------------------------------


class MixtureAverage:
    """Per-model FedAvg over every sampled client (the paper's Algorithm 1, line 11, and the FedRC
    code's aggregator): theta_k = sum_i n_i theta_ik / sum_i n_i, where a client that skipped model
    k (omega_ik = 0) brings the model it received. Fed one reply at a time."""

    def __init__(self, received: dict[int, Params]) -> None:
        self.received = received
        self.sums = {mid: WeightedSum() for mid in received}
        self.trained = dict.fromkeys(received, 0)  # clients that trained each model

    def add(self, trained: list[Params | None], n: float) -> None:
        for mid, params in zip(self.sums, trained, strict=True):
            if params is not None:
                self.trained[mid] += 1
            self.sums[mid].add(self.received[mid] if params is None else params, n)

    def result(self) -> dict[int, Params]:
        return {mid: s.result() for mid, s in self.sums.items() if s.count}


def mixture_round(
    state: State, fed: Federation, hp: Hparams, rnd: int, extra: dict
) -> tuple[State, list, dict]:
    """The sampled clients' update and the per-model FedAvg; ``extra`` goes into the message (FedRC:
    prior, Adam constants, noise). Returns the new state (models), the records and the replies."""
    ids = sorted(state.models)
    cids = fed.sample(fed.task.participation, fed.task.rng("sample", rnd=rnd))
    msg = {"ids": ids, "models": [state.models[i] for i in ids], "round": rnd,
           "persistent_optimizer": hp.persistent_optimizer, "drop_last": hp.drop_last, **extra}  # fmt: skip
    # Each reply is folded into the per-model sums as it arrives (3 models x 300 clients would be
    # gigabytes held at once); what is left of it (omega, statistics, counts) is small.
    agg = MixtureAverage({mid: state.models[mid] for mid in ids})

    def fold(replies: dict, cid: int, reply: dict) -> dict:
        agg.add(reply.pop("models"), reply["num_examples"])
        replies[cid] = copy.deepcopy(reply)  # owned copies: Ray's arrays are views that pin the whole reply
        return replies

    replies = fed.map_fold(mixture_update, cids, msg, fold, {})
    models = {**state.models, **agg.result()}
    records: list[Record] = [
        rec("participants", agg.trained[mid], scope="cluster", entity=mid) for mid in ids
    ]
    samples = sum(r["train_samples"] for r in replies.values())
    if samples:  # train_accuracy / train_loss come from evaluation: the ensembles on the training splits
        records.append(rec("sgd_loss", sum(r["train_loss_sum"] for r in replies.values()) / samples))
    records.append(rec("participants", len(cids)))
    records += [assign(c, mid, float(replies[c]["omega"][row])) for c in cids for row, mid in enumerate(ids)]
    return replace(state, models=models), records, replies


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    new, records, _ = mixture_round(state, fed, hp, rnd, {})
    update_test_clients(fed, new)
    return new, records


def evaluate(state: State, fed: Federation, hp: Hparams, rnd: int) -> list[Record]:
    ids = sorted(state.models)
    models = [state.models[i] for i in ids]
    omega = fed.map(report_omega, fed.client_ids, {"ids": ids})
    if fed.test_client_ids:
        msg = {"ids": ids, "models": models, "hard": hp.hard_predict}
        records = test_client_records(fed.map(test_client_eval, fed.test_client_ids, msg))
    else:
        n = fed.num_examples()
        population = sum(n[c] * omega[c] for c in omega) / sum(n.values())
        msg = {"ids": ids, "models": models, "omega": population, "hard": hp.hard_predict}
        parts = fed.test_map(global_ensemble_eval, msg)
        samples = sum(p["samples"] for p in parts)
        records = [rec("accuracy", sum(p["correct"] for p in parts) / samples),
                   rec("loss", sum(p["loss_sum"] for p in parts) / samples)]  # fmt: skip
    own = fed.map(own_ensemble_eval, fed.client_ids, {"ids": ids, "models": models, "hard": hp.hard_predict})
    records.append(rec("train_accuracy", pooled(own, "train")))  # FedRC's, to pick the reported round
    records.append(rec("train_loss", sum(r["train"]["loss_sum"] for r in own.values())
                       / max(1, sum(r["train"]["samples"] for r in own.values()))))  # fmt: skip
    if any("test" in r for r in own.values()):
        records += [rec("local_accuracy", r["test"]["correct"] / r["test"]["samples"], scope="client", entity=c)
                    for c, r in own.items() if "test" in r]  # fmt: skip
        records.append(rec("local_accuracy", pooled(own, "test")))
    if fed.groups is not None:
        records.append(rec("purity", purity({c: int(np.argmax(w)) for c, w in omega.items()}, fed.groups)))
    records += [rec("live_models", len(ids))]
    return records
