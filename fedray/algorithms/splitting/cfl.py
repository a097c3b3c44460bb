"""CFL: Sattler, Müller, Samek, "Clustered Federated Learning: Model-Agnostic Distributed Multitask
Optimization Under Privacy Constraints", IEEE TNNLS 2020 (docs/algorithms/splitting.md#cfl; docs/algorithms/splitting.md#d1-the-largest-member-update).

One cluster of every client to start with; clusters split recursively. Each round every client
trains its cluster's model (with its own optimizer state kept across rounds, as the reference) and
the server forms the updates Delta_i = theta_i - theta_c. For each cluster c with more than two
members, when its mean update is small, ||mean_i Delta_i|| < ``eps1`` (near a stationary point of
the joint objective), while some member's is large, max_i ||Delta_i|| > ``eps2`` (the members do not
share one), c is bipartitioned by agglomerative clustering with complete linkage (scikit-learn) on
the cosine distances 1 - cos(Delta_i, Delta_j). Each cluster's model is then the n_i-weighted
average of its members' (the FedRC code's rule; a cluster that never splits is FedAvg).

Options where the paper, Sattler's notebook and the FedRC code differ (``max_norm: coordinate``, the
FedRC code's largest |coordinate|, docs/algorithms/splitting.md#d1-the-largest-member-update; ``eps_rule: relative``, thresholds as fractions of the
largest mean update norm so far; ``warmup_rounds``; ``max_clusters``), what is not built (the
client lr decay, the cached pre-split models), and why every client takes part every round
(``participation: 1.0``): docs/algorithms/splitting.md. Updates are of the trainable parameters
only (buffers such as BatchNorm statistics are averaged, never compared).

This file is the recursion; `layercfl.py` runs it with the similarity taken from selected layers
(`measures.py`, which also says what a round records against ground-truth groups).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from fedray.algorithms.plan import RunPlan
from fedray.algorithms.rounds import kept_update, train_records
from fedray.algorithms.splitting import geometry
from fedray.algorithms.splitting.layers import flatten as flat
from fedray.algorithms.splitting.layers import layer_params, select
from fedray.algorithms.splitting.measures import Similarity, evaluate, models, truth_records  # noqa: F401 - the record's
from fedray.algorithms.splitting.scale import check_participation, check_size
from fedray.config.hparams import bound, one_of
from fedray.federation import Federation
from fedray.params import Params, get_params, weighted_average
from fedray.records import Record, assignment_rec, rec
from fedray.storage.blobs import checkpoint_tag

__all__ = ["Hparams", "State", "check_run", "init", "round", "evaluate", "models"]

MAX_NORMS = ("norm", "coordinate")
EPS_RULES = ("absolute", "relative")


@dataclass
class SplitHparams:
    # split only when ||mean update|| of the cluster is below this (Sattler: 0.4)
    eps1: float = field(default=0.4, metadata=bound(ge=0))
    # ... and its largest member update is above this (Sattler: 1.6; FedRC code: 0.6)
    eps2: float = field(default=1.6, metadata=bound(ge=0))
    # absolute: eps1 and eps2 are norms | relative: fractions of the largest mean update norm so far
    eps_rule: str = field(default="absolute", metadata=one_of(*EPS_RULES))
    # norm (the paper) | coordinate (the FedRC code's max |coordinate|, docs/algorithms/splitting.md#d1-the-largest-member-update)
    max_norm: str = field(default="norm", metadata=one_of(*MAX_NORMS))
    # no split before this many rounds (Sattler's notebook: 20)
    warmup_rounds: int = field(default=0, metadata=bound(ge=0))
    # no split once there are this many clusters (0 = no cap; "CFL (3)": 3)
    max_clusters: int = field(default=0, metadata=bound(ge=0))
    persistent_optimizer: bool = True  # each client keeps its SGD buffers across rounds (the reference)
    drop_last: bool = False  # drop each epoch's last partial batch (the FedRC code's loaders)


@checkpoint_tag("cfl.SplitState", "fedray.algorithms.cfl:SplitState", "fedray.splitting:SplitState")
@dataclass
class SplitState:
    # a checkpoint written before the field was renamed names it by its old name
    checkpoint_renames = {"layers": "layer_params"}  # noqa: RUF012 - a class constant, not a field

    clusters: list[list[int]]  # the member client ids of each cluster, sorted
    models: list[Params]  # theta_c, one per cluster
    layer_params: dict[str, list[str]]  # the model's layers: module name -> its parameter names
    selected: list[str]  # the parameter names the similarity is computed on (CFL: all)
    history: list[int] = field(default_factory=list)  # rounds at which a split was accepted
    peak_mean_norm: float = 0.0  # the largest ||mean update|| of any cluster so far (eps_rule: relative)


# eps1, eps2, eps_rule, max_norm, warmup_rounds, max_clusters, persistent_optimizer, drop_last
Hparams = SplitHparams
State = SplitState  # the clusters, their models, the layers, the split history


def check_run(run: RunPlan, hp: Hparams) -> None:
    check_participation(run)
    check_size(run)


def init(fed: Federation, hp: Hparams) -> State:
    return init_state(fed, "all")


def init_state(fed: Federation, spec: str | list[str]) -> SplitState:
    """One cluster of every client; the similarity on the parameters ``spec`` selects (`fedray.algorithms.splitting.layers`)."""
    model = fed.task.build_model()
    return SplitState([sorted(fed.client_ids)], [get_params(model)], layer_params(model), select(model, spec))


UPDATES_COSINE = Similarity()  # CFL's: cosine distances of the whole updates, no split check


def round(  # noqa: A001
    state: SplitState, fed: Federation, hp: SplitHparams, rnd: int, sim: Similarity = UPDATES_COSINE
) -> tuple[SplitState, list[Record]]:
    """Train every cluster's model on its members, split the clusters the rule picks, average."""
    msg = {"round": rnd, "persistent_optimizer": hp.persistent_optimizer}
    replies = fed.map_groups(
        kept_update,
        [(members, {"params": m, **msg}) for members, m in zip(state.clusters, state.models, strict=True)],
    )
    trainable = [p for ps in state.layer_params.values() for p in ps]
    cluster_of = {c: k for k, members in enumerate(state.clusters) for c in members}

    def update(c: int, names: list[str]) -> np.ndarray:
        return flat(replies[c]["params"], names) - flat(state.models[cluster_of[c]], names)

    records = train_records(replies)
    clusters, history, norms = [list(m) for m in state.clusters], list(state.history), []
    for k, members in enumerate(state.clusters):
        mean_norm, max_norm = geometry.split_norms((update(c, trainable) for c in members), hp.max_norm)
        if state.selected != trainable:  # LayerCFL: the largest update on the selected layers
            _, max_norm = geometry.split_norms((update(c, state.selected) for c in members), hp.max_norm)
        records += [
            rec("mean_update_norm", mean_norm, scope="cluster", entity=k),
            rec("max_update_norm", max_norm, scope="cluster", entity=k),
        ]
        norms.append((mean_norm, max_norm))
    peak = max([state.peak_mean_norm] + [n[0] for n in norms])
    eps1, eps2 = geometry.split_thresholds(hp.eps1, hp.eps2, hp.eps_rule, peak)
    if hp.eps_rule == "relative":
        records += [rec("eps1", eps1), rec("eps2", eps2)]
    for k, (members, (mean_norm, max_norm)) in enumerate(zip(state.clusters, norms, strict=True)):
        room = hp.max_clusters == 0 or len(clusters) < hp.max_clusters
        if not (
            rnd >= hp.warmup_rounds and room and len(members) > 2 and mean_norm < eps1 and max_norm > eps2
        ):
            continue
        halves, said = sim.halves(
            members,
            lambda c: update(c, state.selected),
            lambda c: flat(replies[c]["params"], state.selected),
            k,
        )
        records += said
        if halves is None:
            continue
        clusters[k] = [c for c, h in zip(members, halves, strict=True) if h == 0]
        clusters.append([c for c, h in zip(members, halves, strict=True) if h == 1])
        history.append(rnd)
        records.append(rec("split", 1, scope="cluster", entity=k))
    models = [
        weighted_average([replies[c]["params"] for c in m], [replies[c]["num_examples"] for c in m])
        for m in clusters
    ]
    dims = sum(int(np.asarray(state.models[0][n]).size) for n in state.selected)
    records += [rec("num_clusters", len(clusters)), rec("similarity_dims", dims)]
    records += [assignment_rec(c, k) for k, m in enumerate(clusters) for c in m]
    new = replace(state, clusters=clusters, models=models, history=history, peak_mean_norm=peak)
    if fed.groups is not None:
        records += truth_records(fed, new, update)
    return new, records
