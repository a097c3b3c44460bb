"""CFL: Sattler, Müller, Samek, "Clustered Federated Learning: Model-Agnostic Distributed Multitask
Optimization Under Privacy Constraints", IEEE TNNLS 2020 (ALGORITHMS.md §4.4, §6.1; register row 17).

One cluster of every client to start with; clusters split recursively. Each round every client
trains its cluster's model (with its own optimizer state kept across rounds, as the reference) and
the server forms the updates Delta_i = theta_i - theta_c. For each cluster c with more than two
members, when its mean update is small, ||mean_i Delta_i|| < ``eps1`` (near a stationary point of
the joint objective), while some member's is large, max_i ||Delta_i|| > ``eps2`` (the members do not
share one), c is bipartitioned by agglomerative clustering with complete linkage (scikit-learn) on
the cosine distances 1 - cos(Delta_i, Delta_j). Each cluster's model is then the n_i-weighted
average of its members' (the FedRC code's rule; a cluster that never splits is FedAvg).

Deviations and options, said openly:
- ``max_norm: coordinate`` is the FedRC code's rule (the largest absolute coordinate of any member's
  update, register row 17) instead of the largest update norm;
- ``eps_rule: relative`` reads ``eps1`` and ``eps2`` as fractions of the largest mean update norm
  any cluster has had so far in the run (LayerCFL §6.2(a)4, after CFL: eps1 about a tenth of
  it, eps2 in [eps1, 10 eps1]), so one setting serves any model and data scale; each round then
  records the ``eps1`` and ``eps2`` it used. ``absolute`` (the default) takes them as norms;
- ``warmup_rounds``: no split before that many rounds (Sattler's notebook: 20; the FedRC code: 0);
- ``max_clusters``: no split once there are that many clusters (the FedRC tables' "CFL (3)": 3;
  0 = no cap, the code's 100 in practice);
- every client takes part every round (the reference asserts it): the config must say
  ``participation: 1.0``;
- not built from Sattler's reference: the client lr decay (x 0.99 per call, §6.1(a)2) and the
  cached pre-split models a client may pick after training (§6.1(a)6);
- updates are of the trainable parameters only (buffers such as BatchNorm statistics are averaged
  but never compared), as the reference's named parameters.

`layercfl.py` is this recursion with the similarity taken from selected layers. With ground-truth
groups (``dominant``, ``rotation``) every round records ``purity`` and the gap of LayerCFL eqs. 21-22
(``gap``, ``gap_l2`` on the selected layers' updates; ``gap/LAYER`` and ``gap_l2/LAYER`` for every
layer: `analysis.layer_gaps` makes them a table; signed, where LayerCFL's plots show 0 for any
negative gap; after a split the clients' updates start from different cluster models, so the layer
study reads a run that does not split), and ``similarity_dims``, the size of what the
similarity is computed on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fedray import clustering, layers
from fedray.client import Client
from fedray.evaluation import cluster_model_records, lowest_loss_global, lowest_loss_records
from fedray.export import SavedModel, cluster_models
from fedray.federation import Federation
from fedray.hparams import bound, one_of
from fedray.params import Params, get_params, weighted_average
from fedray.records import Record, assign, rec
from fedray.rounds import kept_optimizer_update, train_records

MAX_NORMS = ("norm", "coordinate")
EPS_RULES = ("absolute", "relative")
DISTANCES = ("delta_cos", "delta_l2", "cos", "l2")


@dataclass
class Hparams:
    # split only when ||mean update|| of the cluster is below this (Sattler: 0.4)
    eps1: float = field(default=0.4, metadata=bound(ge=0))
    # ... and its largest member update is above this (Sattler: 1.6; FedRC code: 0.6)
    eps2: float = field(default=1.6, metadata=bound(ge=0))
    # absolute: eps1 and eps2 are norms | relative: fractions of the largest mean update norm so far
    eps_rule: str = field(default="absolute", metadata=one_of(*EPS_RULES))
    # norm (the paper) | coordinate (the FedRC code's max |coordinate|, row 17)
    max_norm: str = field(default="norm", metadata=one_of(*MAX_NORMS))
    # no split before this many rounds (Sattler's notebook: 20)
    warmup_rounds: int = field(default=0, metadata=bound(ge=0))
    # no split once there are this many clusters (0 = no cap; "CFL (3)": 3)
    max_clusters: int = field(default=0, metadata=bound(ge=0))
    persistent_optimizer: bool = True  # each client keeps its SGD buffers across rounds (the reference)
    drop_last: bool = False  # drop each epoch's last partial batch (the FedRC code's loaders)


def check_config(cfg: Any, hp: Any) -> None:
    if cfg.participation != 1.0:
        raise ValueError(
            f"config key 'participation': {cfg.algorithm} bipartitions all of a cluster's clients every round, "
            f"so every client takes part (participation: 1.0), got {cfg.participation}"
        )


@dataclass
class State:
    clusters: list[list[int]]  # the member client ids of each cluster, sorted
    models: list[Params]  # theta_c, one per cluster
    layers: dict[str, list[str]]  # the model's layers: module name -> its parameter names
    selected: list[str]  # the parameter names the similarity is computed on (CFL: all)
    history: list[int] = field(default_factory=list)  # rounds at which a split was accepted
    peak_mean_norm: float = 0.0  # the largest ||mean update|| of any cluster so far (eps_rule: relative)


def models(state: State, hp: Hparams) -> list[SavedModel]:
    return cluster_models(state.models, dict(enumerate(state.clusters)))


def init(fed: Federation, hp: Hparams, spec: str | list[str] = "all") -> State:
    model = fed.task.build_model()
    return State(
        [sorted(fed.client_ids)], [get_params(model)], layers.layers(model), layers.select(model, spec)
    )


# ---- client side --------------------------------------------------------------------------------


def persistent_update(client: Client, cstate: Any, msg: dict) -> tuple[dict, Any]:
    """Client function: train the received ``params`` for the local epochs; with
    ``persistent_optimizer`` the client's SGD buffers carry over from its last round (client state)."""
    return kept_optimizer_update(
        client,
        msg["params"],
        msg["round"],
        cstate,
        keep=msg["persistent_optimizer"],
        drop_last=msg["drop_last"],
    )


# ---- server side --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """How clients are compared: the distance (on the updates or the weights of ``State.selected``)
    and, if ``gamma_max`` is set, the check a split must pass to be kept (LayerCFL's Theorem 1)."""

    distance: str = "delta_cos"
    gamma_max: float | None = None


def split_is_safe(similarity: np.ndarray, halves: np.ndarray, gamma_max: float) -> tuple[bool, float]:
    """CFL's separation theorem as LayerCFL checks it (eq. 20): a bipartition is correct when
    gamma_max < sqrt((1 - alpha_cross_max) / 2), alpha_cross_max the largest cosine similarity of
    updates across the two halves. Returns (safe, alpha_cross_max)."""
    _, cross_max = clustering.separation(similarity, halves)
    return bool(np.sqrt(max(0.0, 1.0 - cross_max) / 2.0) > gamma_max), cross_max


def distances(vectors: np.ndarray, distance: str) -> np.ndarray:
    """Pairwise distances of rows: 1 - cosine similarity, or Euclidean (of updates or of weights:
    the caller passes which)."""
    if distance.endswith("cos"):
        return 1.0 - clustering.cosine_similarity(vectors)
    return clustering.euclidean_distances(vectors)


def split_norms(updates: Iterable[np.ndarray], rule: str) -> tuple[float, float]:
    """(||mean update||, the largest member update by ``rule``) of one cluster's update rows, taken
    one row at a time: the cluster's matrix is built only if it splits."""
    total, biggest, n = None, 0.0, 0
    for row in updates:
        total = row.astype(np.float64, copy=True) if total is None else np.add(total, row, out=total)
        if rule == "coordinate":  # max |x| without an abs copy of the row
            biggest = max(biggest, float(row.max()), float(-row.min()))
        else:
            biggest = max(biggest, float(np.linalg.norm(row)))
        n += 1
    return float(np.linalg.norm(total / n)), biggest


def thresholds(hp: Hparams, peak_mean_norm: float) -> tuple[float, float]:
    """The (eps1, eps2) a round compares with: ``hp``'s own, or with ``eps_rule: relative`` those
    fractions of the largest mean update norm so far."""
    if hp.eps_rule == "relative":
        return hp.eps1 * peak_mean_norm, hp.eps2 * peak_mean_norm
    return hp.eps1, hp.eps2


def stacked(cids: list[int], row: Callable[[int], np.ndarray]) -> np.ndarray:
    """``row(c)`` for each client, filled into one float64 matrix in place: not a list of rows plus
    its stack (300 clients x 2.2M parameters are 5 GB each)."""
    first = row(cids[0])
    out = np.empty((len(cids), first.size), dtype=np.float64)
    out[0] = first
    for i, c in enumerate(cids[1:], 1):
        out[i] = row(c)
    return out


def cfl_round(
    state: State, fed: Federation, hp: Hparams, rnd: int, sel: Selection
) -> tuple[State, list[Record]]:
    msgs = [
        (
            members,
            {
                "params": m,
                "round": rnd,
                "persistent_optimizer": hp.persistent_optimizer,
                "drop_last": hp.drop_last,
            },
        )  # fmt: skip
        for members, m in zip(state.clusters, state.models, strict=True)
    ]
    replies = fed.map_groups(persistent_update, msgs)
    trainable = [p for ps in state.layers.values() for p in ps]
    cluster_of = {c: k for k, members in enumerate(state.clusters) for c in members}

    def update(c: int, names: list[str]) -> np.ndarray:
        return layers.flatten(replies[c]["params"], names) - layers.flatten(
            state.models[cluster_of[c]], names
        )

    everything = state.selected == trainable  # CFL: the selected rows are the full rows

    records = train_records(replies)
    clusters = [list(m) for m in state.clusters]
    history = list(state.history)
    norms = []
    for k, members in enumerate(state.clusters):
        mean_norm, max_norm = split_norms((update(c, trainable) for c in members), hp.max_norm)
        if not everything:
            _, max_norm = split_norms((update(c, state.selected) for c in members), hp.max_norm)
        records += [rec("mean_update_norm", mean_norm, scope="cluster", entity=k),
                    rec("max_update_norm", max_norm, scope="cluster", entity=k)]  # fmt: skip
        norms.append((mean_norm, max_norm))
    peak = max([state.peak_mean_norm] + [n[0] for n in norms])
    eps1, eps2 = thresholds(hp, peak)
    if hp.eps_rule == "relative":
        records += [rec("eps1", eps1), rec("eps2", eps2)]
    for k, (members, (mean_norm, max_norm)) in enumerate(zip(state.clusters, norms, strict=True)):
        room = hp.max_clusters == 0 or len(clusters) < hp.max_clusters
        if not (
            rnd >= hp.warmup_rounds and room and len(members) > 2 and mean_norm < eps1 and max_norm > eps2
        ):
            continue
        # the one matrix a split needs (two when the distance is on the weights, not the updates)
        moved = stacked(members, lambda c: update(c, state.selected))
        if sel.distance.startswith("delta"):
            d = distances(moved, sel.distance)
        else:
            d = distances(
                stacked(members, lambda c: layers.flatten(replies[c]["params"], state.selected)), sel.distance
            )
        halves = clustering.bipartition(d)
        if sel.gamma_max is not None:
            safe, cross_max = split_is_safe(clustering.cosine_similarity(moved), halves, sel.gamma_max)
            records.append(rec("alpha_cross_max", cross_max, scope="cluster", entity=k))
            if not safe:  # the theorem does not vouch for this split: roll back, train on unsplit
                records.append(rec("split_rejected", 1, scope="cluster", entity=k))
                continue
        clusters[k] = [c for c, h in zip(members, halves, strict=True) if h == 0]
        clusters.append([c for c, h in zip(members, halves, strict=True) if h == 1])
        history.append(rnd)
        records.append(rec("split", 1, scope="cluster", entity=k))
    models = [
        weighted_average([replies[c]["params"] for c in m], [replies[c]["num_examples"] for c in m])
        for m in clusters
    ]
    records += [rec("num_clusters", len(clusters)), rec("similarity_dims", sum(
        int(np.asarray(state.models[0][n]).size) for n in state.selected))]  # fmt: skip
    records += [assign(c, k) for k, m in enumerate(clusters) for c in m]
    new = replace(state, clusters=clusters, models=models, history=history, peak_mean_norm=peak)
    if fed.groups is not None:
        records += truth_records(fed, new, update)
    return new, records


def truth_records(
    fed: Federation, state: State, update: Callable[[int, list[str]], np.ndarray]
) -> list[Record]:
    """purity of the clustering, and the gap (LayerCFL eqs. 21-22) of the updates of every layer and
    of the selected layers (``gap``, ``gap_l2``), against the partition's ground-truth groups, over
    all clients."""
    cids = sorted(fed.client_ids)
    truth = [fed.groups[c] for c in cids]
    assignment = {c: k for k, m in enumerate(state.clusters) for c in m}
    records = [rec("purity", clustering.purity(assignment, fed.groups))]
    if len(set(truth)) < 2:
        return records
    for name, names in [("", state.selected), *((f"/{layer}", ps) for layer, ps in state.layers.items())]:
        x = stacked(cids, lambda c, names=names: update(c, names))
        records += [rec(f"gap{name}", clustering.gap_cos(clustering.cosine_similarity(x), truth)),
                    rec(f"gap_l2{name}", clustering.gap_l2(clustering.euclidean_distances(x), truth))]  # fmt: skip
    return records


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    return cfl_round(state, fed, hp, rnd, Selection())


def evaluate(state: State, fed: Federation, hp: Hparams, rnd: int) -> list[Record]:
    assignment = {c: k for k, m in enumerate(state.clusters) for c in m}
    records = cluster_model_records(fed, state.models, assignment)
    if fed.test_client_ids:
        return records + lowest_loss_records(fed, state.models)
    return lowest_loss_global(records)
