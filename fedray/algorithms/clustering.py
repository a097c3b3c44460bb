"""Clustering clients by vectors that describe them (docs/algorithms/fedconcat.md#equations: F1, F3,
F4, the elbow), and how well a clustering matches the ground truth (purity). CFL's and LayerCFL's
bipartition, split rule and gaps are theirs: `fedray/algorithms/splitting/geometry.py`.

Pure numpy / scikit-learn; no federation. `cluster_vectors` is the "kmeans" clustering step of
FedConcat and of clustered FedAvg: label distributions (true, noised or inferred) in, a cluster per
client out, with what the choice was based on as records.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedray.records import Record, rec


def label_distributions(counts: Mapping[int, np.ndarray]) -> np.ndarray:
    """F1: row i = client i's class counts / its size, rows in sorted client order."""
    cids = sorted(counts)
    m = np.stack([np.asarray(counts[c], dtype=np.float64) for c in cids])
    return m / m.sum(axis=1, keepdims=True)


def laplace_noise(p: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray:
    """F3: P + Laplace(0, 1/eps) on every entry (sensitivity 1); no clipping or renormalisation,
    as the reference code (entries may go negative)."""
    return p + rng.laplace(0.0, 1.0 / eps, size=p.shape)


def _seed(rng: np.random.Generator) -> int:
    return int(rng.integers(2**31 - 1))


def kmeans(x: np.ndarray, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    """scikit-learn K-means (k-means++, 10 restarts, as FedConcat's pinned sklearn): labels, centres, inertia.

    Fewer distinct points than k leaves some clusters empty; sklearn warns, we accept it (the
    algorithms keep an empty cluster's model as it is).
    """
    with warnings.catch_warnings():
        from sklearn.cluster import KMeans  # here, not at the top: scikit-learn takes 2 s to import
        from sklearn.exceptions import ConvergenceWarning

        warnings.simplefilter("ignore", ConvergenceWarning)
        km = KMeans(n_clusters=k, n_init=10, random_state=_seed(rng)).fit(x)
    return km.labels_.astype(np.int64), km.cluster_centers_, float(km.inertia_)


def balanced_cap(n: int, k: int, factor: float = 1.2) -> int:
    """F4's cap, floor(1.2 n / k) (40 clients, 5 clusters: 9), raised to ceil(n / k) where the floor
    could not hold every client (3 clients, 2 clusters: floor(1.8) = 1 would leave one out)."""
    return max(math.floor(factor * n / k), math.ceil(n / k))


def balanced_kmeans(
    x: np.ndarray, k: int, cap: int, rng: np.random.Generator, iterations: int = 100
) -> np.ndarray:
    """F4: capacity-constrained K-means (no cluster holds more than ``cap`` points).

    Start from ordinary K-means centres; then ``iterations`` times: assign each point to its
    nearest centre; give an empty cluster a random point as its centre; while a cluster is over
    ``cap``, drop its farthest member; place each dropped point in the nearest cluster still under
    ``cap``; move the centres to their members' means. Returns the last assignment.
    """
    n = len(x)
    if cap * k < n:
        raise ValueError(f"balanced K-means: {k} clusters of at most {cap} cannot hold {n} points")
    _, centres, _ = kmeans(x, k, rng)
    centres = centres.copy()
    labels = np.zeros(n, dtype=np.int64)
    for _ in range(iterations):
        dist = np.linalg.norm(x[:, None, :] - centres[None, :, :], axis=-1)
        labels = dist.argmin(axis=1)
        for j in range(k):
            if not np.any(labels == j):
                centres[j] = x[rng.integers(n)]
        for j in range(k):
            while np.sum(labels == j) > cap:
                members = np.flatnonzero(labels == j)
                far = members[np.argmax(dist[members, j])]
                labels[far] = -1
                dist[far, j] = np.inf
        for i in np.flatnonzero(labels == -1):
            for j in np.argsort(dist[i], kind="stable"):
                if np.sum(labels == j) < cap:
                    labels[i] = j
                    break
        for j in range(k):
            if np.any(labels == j):
                centres[j] = x[labels == j].mean(axis=0)
    return labels


def elbow(x: np.ndarray, ks: Sequence[int], rng: np.random.Generator) -> tuple[int, dict[int, float]]:
    """The elbow of the K-means inertia curve over ``ks``: the K farthest below the chord from the
    first to the last point, both axes scaled to [0, 1] (the "kneedle" rule). Returns K and the curve."""
    ks = sorted(set(ks))
    inertia = {k: kmeans(x, k, rng)[2] for k in ks}
    if len(ks) < 3:
        return ks[0], inertia
    xs = (np.array(ks, dtype=np.float64) - ks[0]) / (ks[-1] - ks[0])
    ys = np.array([inertia[k] for k in ks])
    span = ys.max() - ys.min()
    if span <= 0:
        return ks[0], inertia  # a flat curve: no elbow, take the fewest clusters
    ys = (ys - ys.min()) / span
    gap = (ys[0] + (ys[-1] - ys[0]) * xs) - ys  # how far the curve lies below the chord
    return ks[int(np.argmax(gap))], inertia


@dataclass
class Clustering:
    """A clustering of clients: client -> cluster, the number of clusters, and records explaining it."""

    assignment: dict[int, int]
    k: int
    records: list[Record] = field(default_factory=list)


def cluster_vectors(
    vectors: Mapping[int, np.ndarray],
    k: int,
    rng: np.random.Generator,
    balanced: bool = False,
    elbow_range: Sequence[int] = (),
    stage: str = "",
) -> Clustering:
    """The "kmeans" clustering step: K-means (balanced if asked) on the clients' vectors.

    With ``elbow_range = [lo, hi]`` K is chosen by `elbow` over lo..hi instead of ``k``; the curve
    is recorded as ``elbow_inertia`` rows (scope cluster, entity = the K tried). Every clustering
    records ``num_clusters`` and each cluster's size (``cluster_size``, scope cluster).
    """
    cids = sorted(vectors)
    x = np.stack([np.asarray(vectors[c], dtype=np.float64) for c in cids])
    records: list[Record] = []
    if elbow_range:
        k, curve = elbow(x, range(elbow_range[0], elbow_range[1] + 1), rng)
        records += [
            rec("elbow_inertia", v, scope="cluster", entity=kk, stage=stage) for kk, v in curve.items()
        ]
    labels = balanced_kmeans(x, k, balanced_cap(len(x), k), rng) if balanced else kmeans(x, k, rng)[0]
    records.append(rec("num_clusters", k, stage=stage))
    records += [
        rec("cluster_size", int(np.sum(labels == j)), scope="cluster", entity=j, stage=stage)
        for j in range(k)
    ]
    return Clustering({c: int(label) for c, label in zip(cids, labels, strict=True)}, k, records)


# ---- how well a clustering matches the ground truth -----------------------------------------------


def purity(assignment: Mapping[int, int], truth: Mapping[int, int]) -> float:
    """The share of clients in their ground-truth group's majority cluster: for each group, the
    number of its members in the cluster most of them are in, summed, over the clients assigned.
    One cluster for everyone counts as pure (a companion ``num_clusters`` row tells that apart)."""
    good = 0
    for g in sorted(set(truth.values())):
        tops = [assignment[c] for c in truth if truth[c] == g and c in assignment]
        if tops:
            good += max(tops.count(t) for t in set(tops))
    return good / max(1, sum(1 for c in truth if c in assignment))
