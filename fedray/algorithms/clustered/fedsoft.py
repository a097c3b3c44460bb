"""FedSoft: Ruan, Joe-Wong, "FedSoft: Soft Clustered Federated Learning with Proximal Local
Updating", AAAI 2022 (docs/algorithms/clustered.md#fedsoft, docs/algorithms/clustered.md#d2-fedsoft-in-the-fedrc-repository): the original rule (FS:servers.py,
FS:clients.py), not the FedRC repository's variant.

K cluster models theta_k and one personal model w_c per client, kept as client state and never
overwritten by the server.

1. Every ``tau`` rounds (round 0 included) every client counts, for each cluster k, its training
   samples on which theta_k has the smallest loss (first on ties), replaces a zero count by
   ``sigma`` * n_c and sets its importance weights u_ck = count_ck / n_c.
2. Aggregation weights v_kc = u_ck n_c / sum_c' u_c'k n_c'. With ``selection_size`` > 0 the server
   samples that many clients per cluster without replacement with probabilities v_k. (stream
   ``fedsoft/select``) and theta_k is the uniform average of the selected clients' personal models;
   with 0, the round's participants (FedAvg's sampling) train and theta_k = sum_c v_kc w_c with v
   renormalised over them.
3. Each client that trains minimises CE + (lam/2) sum_k u_ck ||w_c - theta_k||^2 from its personal
   model. The sum equals (lam/2) U ||w_c - theta_bar||^2 plus a constant, U = sum_k u_ck and
   theta_bar = sum_k u_ck theta_k / U, so it is FedProx's term with mu = lam U and anchor theta_bar
   (the same gradients; the loss differs by the constant). A personal model starts as theta_bar.

Evaluation: ``local_accuracy`` is each client's personal model on its test split (theta_bar for a
client that has not trained yet); each cluster model on the global test set (``accuracy``, scope
cluster), or with the shift preset's test clients their lowest-loss cluster model. ``assignments/``
holds every client's u (one row per cluster) after each estimation; with ground-truth groups,
``purity`` of the argmax-u clustering every round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedray.algorithms.clustered.fedsoft_client import (  # noqa: F401 - importance: the rule, tested
    anchor,
    estimate,
    importance,
    personal_eval,
    personal_update,
)
from fedray.algorithms.clustering import purity
from fedray.algorithms.evaluation import cluster_global_records, own_data_records, train_split_records
from fedray.algorithms.rounds import train_records
from fedray.config.hparams import bound
from fedray.federation import Federation
from fedray.params import Params, weighted_average
from fedray.records import Record, assignment_rec, rec
from fedray.storage.export import SavedModel, cluster_models


@dataclass
class Hparams:
    num_clusters: int = field(default=3, metadata=bound(ge=1))  # K: cluster models
    # importance weights re-estimated every tau rounds (estimation_interval; FS: 2)
    tau: int = field(default=2, metadata=bound(ge=1))
    # lambda: weight of the proximal pull towards the cluster models (reg_weight)
    lam: float = field(default=0.1, metadata=bound(ge=0))
    # a zero count becomes sigma * n_c (count_smoother)
    sigma: float = field(default=1e-4, metadata=bound(gt=0, le=1))
    # clients sampled per cluster by v_k (FS: 15); 0 = FedAvg's participants
    selection_size: int = field(default=0, metadata=bound(ge=0))


@dataclass
class State:
    models: list[Params]  # theta_k
    u: dict[int, np.ndarray] = field(default_factory=dict)  # client -> its importance weights (K)


def models(state: State, hp: Hparams) -> list[SavedModel]:
    return cluster_models(state.models)


def assignment(state: State) -> dict[int, int]:
    """Each client's cluster (the clustered-algorithm hook FedConcat's stage 2 reads): its most
    important one, argmax u."""
    return {c: int(np.argmax(u)) for c, u in state.u.items()}


def personal_model(cstate: Any) -> Params | None:
    """A client's personal model (its state), once it has trained one."""
    return cstate


def init(fed: Federation, hp: Hparams) -> State:
    models = fed.task.init_models(hp.num_clusters)
    return State([models[k] for k in range(hp.num_clusters)])


# ---- pure rules ---------------------------------------------------------------------------------


def aggregation_weights(u: dict[int, np.ndarray], n: dict[int, int]) -> dict[int, np.ndarray]:
    """v_kc = u_ck n_c / sum_c' u_c'k n_c' over the given clients: client -> its weight in each cluster."""
    cids = sorted(u)
    mass = np.stack([u[c] * n[c] for c in cids])  # clients x K
    v = mass / mass.sum(axis=0, keepdims=True)
    return {c: v[i] for i, c in enumerate(cids)}


# ---- server side --------------------------------------------------------------------------------


def select(v: dict[int, np.ndarray], size: int, rng: np.random.Generator) -> list[list[int]]:
    """Per cluster, ``size`` clients drawn without replacement with probabilities v_k. (all, if fewer)."""
    cids = sorted(v)
    out = []
    for k in range(len(next(iter(v.values())))):
        p = np.array([v[c][k] for c in cids])
        take = min(size, int(np.count_nonzero(p)))
        out.append(sorted(int(c) for c in rng.choice(cids, size=take, replace=False, p=p / p.sum())))
    return out


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    records: list[Record] = []
    u = state.u
    if rnd % hp.tau == 0 or not u:
        got = fed.map(estimate, fed.client_ids, {"models": state.models, "sigma": hp.sigma})
        u = {c: np.array(w) for c, w in got.items()}  # owned, writable copies (Ray's are read-only views)
        records += [assignment_rec(c, k, float(w)) for c in sorted(u) for k, w in enumerate(u[c])]
    n = fed.num_examples()
    if hp.selection_size:
        chosen = select(aggregation_weights(u, n), hp.selection_size, fed.task.rng("fedsoft/select", rnd=rnd))
        trainers = sorted({c for cs in chosen for c in cs})
    else:
        trainers = fed.sample(fed.task.participation, fed.task.rng("sample", rnd=rnd))
    # One message for all trainers (the models go into the object store once per round); each
    # client reads its own u from it.
    msg = {"models": state.models, "u": {c: u[c] for c in trainers}, "lam": hp.lam, "round": rnd}
    replies = fed.map(personal_update, trainers, msg)
    models = list(state.models)
    v = None if hp.selection_size else aggregation_weights({c: u[c] for c in trainers}, n)
    for k in range(hp.num_clusters):
        if hp.selection_size:
            members, weights = chosen[k], [1.0] * len(chosen[k])
        else:
            members, weights = trainers, [float(v[c][k]) for c in trainers]
        if members and sum(weights) > 0:
            models[k] = weighted_average([replies[c]["params"] for c in members], weights)
        records.append(rec("participants", len(members), scope="cluster", entity=k))
    if fed.groups is not None:  # each client in its most important cluster
        records.append(rec("purity", purity({c: int(np.argmax(w)) for c, w in u.items()}, fed.groups)))
    return State(models, u), records + train_records(replies)


def evaluate(state: State, fed: Federation, hp: Hparams, rnd: int) -> list[Record]:
    records = cluster_global_records(fed, state.models)
    with_test = [c for c, k in fed.num_test_examples(fed.eval_client_ids).items() if k > 0]
    if with_test:
        msg = {"models": state.models, "u": {c: state.u[c] for c in with_test if c in state.u}}
        records += own_data_records(fed, [(with_test, msg)], personal_eval, "local_accuracy", "")
    msg = {
        "models": state.models,
        "u": {c: state.u[c] for c in fed.eval_client_ids if c in state.u},
        "on": "train",
    }
    return records + train_split_records(fed, [(fed.eval_client_ids, msg)], personal_eval)
