"""IFCA: Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for Clustered Federated Learning",
NeurIPS 2020 (docs/algorithms/clustered.md#ifca, docs/algorithms/clustered.md#d1-an-empty-clusters-model), as the FedRC codebase runs it.

K global models (model k from its own seeded init; model 0 is FedAvg's). Each round every
participant computes the mean training loss of each model on its training split, picks
k* = argmin (the first on ties) and trains only model k* for the local epochs; the server sets model
k to the n_i-weighted average of the participants that picked k.

Deviation from the FedRC code, said openly (docs/algorithms/clustered.md#d1-an-empty-clusters-model): a model no participant picked keeps its
weights and the round records an ``empty_cluster`` row for it. The code overwrites it with zeros
(its average of no models): ``empty_cluster: zero`` does the same, for side-by-side runs. A zeroed
model predicts the same for every input (its loss is ln C wherever it is evaluated), so clients
and test clients whose every trained model has a loss above that pick it; it learns only its last
bias from then on.
``persistent_optimizer`` keeps each client's SGD buffers per model across rounds, as the FedRC
code's learners do (off by default: the paper's fresh local SGD, and IFCA with K = 1 is FedAvg).
Prediction uses the client's chosen model: its last choice, or for a client that never took part
(and the shift preset's test clients) the lowest-loss one. Every participant's choice goes to
``assignments/``; with ground-truth groups, ``purity`` of the latest choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedray.algorithms.clustering import purity
from fedray.algorithms.evaluation import hard_cluster_records
from fedray.algorithms.rounds import fedavg_aggregate, kept_optimizer_update, train_records
from fedray.config.hparams import bound, one_of
from fedray.engine.client import Client
from fedray.engine.update import Evaluation
from fedray.federation import Federation
from fedray.params import Params
from fedray.records import Record, assignment_rec, rec
from fedray.storage.export import SavedModel, cluster_models, members_of

EMPTY = ("keep", "zero")  # keep its weights (the paper's average over its members); zero (the code's)


@dataclass
class Hparams:
    num_clusters: int = field(default=3, metadata=bound(ge=1))  # K: cluster models
    persistent_optimizer: bool = False  # each client keeps its SGD buffers per model (the FedRC code)
    drop_last: bool = False  # drop each epoch's last partial batch (the FedRC code's loaders)
    # a model no client picked: kept (paper) or zeroed (FedRC code)
    empty_cluster: str = field(default="keep", metadata=one_of(*EMPTY))


@dataclass
class State:
    models: list[Params]  # theta_k
    assigned: dict[int, int] = field(default_factory=dict)  # each client's latest choice


def models(state: State, hp: Hparams) -> list[SavedModel]:
    return cluster_models(state.models, members_of(state.assigned))


def assignment(state: State) -> dict[int, int]:
    """Each client's cluster (the clustered-algorithm hook FedConcat's stage 2 reads): its latest choice."""
    return dict(state.assigned)


def init(fed: Federation, hp: Hparams) -> State:
    models = fed.task.init_models(hp.num_clusters)
    return State([models[k] for k in range(hp.num_clusters)])


def ifca_update(client: Client, cstate: Any, msg: dict):
    """Client function: pick the lowest-loss model, train it (its kept SGD buffers, if any)."""
    losses = [s.loss for s in (yield [Evaluation(m) for m in msg["models"]])]
    k = int(np.argmin(losses))
    buffers = dict(cstate or {})
    reply, kept = yield from kept_optimizer_update(
        client,
        msg["models"][k],
        msg["round"],
        buffers.get(k),
        keep=msg["persistent_optimizer"],
    )
    if kept is not None:
        buffers[k] = kept
    return {**reply, "cluster": k, "losses": losses}, (buffers or None)


def zeroed(params: Params) -> Params:
    """The FedRC code's average of no models: every floating-point tensor set to 0, the rest kept."""
    return {k: np.zeros_like(v) if np.issubdtype(v.dtype, np.floating) else v for k, v in params.items()}


def aggregate(
    models: list[Params], replies: dict[int, dict], cluster: dict[int, int], empty: str = "keep"
) -> tuple[list[Params], list[Record]]:
    """Model k = the n_i-weighted average of the replies assigned to k; an empty cluster keeps its
    model (``empty="zero"``: zeroed, as the FedRC code does)."""
    new, records = list(models), []
    for k in range(len(models)):
        members = {c: r for c, r in replies.items() if cluster[c] == k}
        if members:
            new[k] = fedavg_aggregate(members)
        else:
            if empty == "zero":
                new[k] = zeroed(models[k])
            records.append(rec("empty_cluster", 1, scope="cluster", entity=k))
        records.append(rec("participants", len(members), scope="cluster", entity=k))
    return new, records


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    cids = fed.sample(fed.task.participation, fed.task.rng("sample", rnd=rnd))
    msg = {
        "models": state.models,
        "round": rnd,
        "persistent_optimizer": hp.persistent_optimizer,
    }
    return close_round(state, fed, fed.map(ifca_update, cids, msg), hp.empty_cluster)


def close_round(
    state: State, fed: Federation, replies: dict[int, dict], empty: str = "keep"
) -> tuple[State, list[Record]]:
    """The server's end of a hard-clustering round (IFCA, FeSEM): each reply names its cluster;
    per-cluster averages (``empty`` as `aggregate`'s), the latest assignments, their rows and purity."""
    chosen = {c: r["cluster"] for c, r in replies.items()}
    models, records = aggregate(state.models, replies, chosen, empty)
    assigned = {**state.assigned, **chosen}
    records += train_records(replies) + [assignment_rec(c, k) for c, k in chosen.items()]
    if fed.groups is not None:
        records.append(rec("purity", purity(assigned, fed.groups)))
    return State(models, assigned), records


def evaluate(state: State, fed: Federation, hp: Any, rnd: int) -> list[Record]:
    return hard_cluster_records(fed, state.models, state.assigned)
