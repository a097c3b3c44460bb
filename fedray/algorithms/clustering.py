"""Clustering clients by vectors that describe them (docs/algorithms/fedconcat.md#equations: F1, F3, F4, the elbow), CFL's
bipartition and split rule (docs/algorithms/splitting.md#cfl, docs/algorithms/splitting.md#layercfl), and how well a clustering matches the ground truth (purity, the gap of docs/algorithms/splitting.md#cfl).

Pure numpy / scikit-learn; no federation. `cluster_vectors` is the "kmeans" clustering step of
FedConcat and of clustered FedAvg: label distributions (true, noised or inferred) in, a cluster per
client out, with what the choice was based on as records.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
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


# ---- CFL's bipartition and the ground-truth measures ---------------------------------------------


def cosine_similarity(x: np.ndarray) -> np.ndarray:
    """S_ij = <x_i, x_j> / (||x_i|| ||x_j|| + 1e-12) over the rows of ``x`` (CFL's similarity of
    updates; the guard keeps a zero update finite), in float64."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1)
    return (x @ x.T) / (np.outer(norms, norms) + 1e-12)


def euclidean_distances(x: np.ndarray) -> np.ndarray:
    """D_ij = ||x_i - x_j||_2 over the rows of ``x``, in float64 (from the Gram matrix, clipped at 0)."""
    x = np.asarray(x, dtype=np.float64)
    sq = np.einsum("ij,ij->i", x, x)
    return np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * (x @ x.T), 0.0))


def bipartition(distance: np.ndarray) -> np.ndarray:
    """CFL's split: agglomerative clustering of a precomputed distance matrix into 2 clusters with
    complete linkage (scikit-learn). Labels 0/1, 0 for the half that holds the first row."""
    from sklearn.cluster import AgglomerativeClustering

    labels = (
        AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete")
        .fit(np.asarray(distance, dtype=np.float64))
        .labels_
    )
    return (labels != labels[0]).astype(np.int64)


def separation(similarity: np.ndarray, labels: Sequence[int]) -> tuple[float, float]:
    """(alpha_intra_min, alpha_cross_max) of a similarity matrix under a labelling: the smallest
    similarity between two clients with the same label (pairs i != j; 1.0 where no group has two
    members) and the largest between clients with different labels (-1.0 where all share one label)."""
    s = np.asarray(similarity, dtype=np.float64)
    lab = np.asarray(labels)
    same = lab[:, None] == lab[None, :]
    off = ~np.eye(len(lab), dtype=bool)
    intra = s[same & off]
    cross = s[~same]
    return (float(intra.min()) if intra.size else 1.0, float(cross.max()) if cross.size else -1.0)


def gap_cos(similarity: np.ndarray, labels: Sequence[int]) -> float:
    """The cosine gap of LayerCFL eq. 21: alpha_intra_min - alpha_cross_max. Positive iff every pair of
    clients in one group is more similar than any pair across groups (the matrix separates them)."""
    intra_min, cross_max = separation(similarity, labels)
    return intra_min - cross_max


def gap_l2(distance: np.ndarray, labels: Sequence[int]) -> float:
    """The L2 gap of LayerCFL eq. 22: d_cross_min - d_intra_max (a separation as `gap_cos`, for distances)."""
    intra_min, cross_max = separation(-np.asarray(distance, dtype=np.float64), labels)
    return intra_min - cross_max


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


# ---- CFL's split rule ----------------------------------------------------------------------------

DISTANCES = ("delta_cos", "delta_l2", "cos", "l2")  # of updates (delta_) or of weights; cosine or L2


def pairwise_distances(vectors: np.ndarray, distance: str) -> np.ndarray:
    """Pairwise distances of rows by one of `DISTANCES`: 1 - cosine similarity, or Euclidean (the
    caller passes updates or weights, as the name says)."""
    if distance.endswith("cos"):
        return 1.0 - cosine_similarity(vectors)
    return euclidean_distances(vectors)


def split_norms(updates: Iterable[np.ndarray], rule: str) -> tuple[float, float]:
    """(||mean update||, the largest member update) of one cluster's update rows, taken one row at a
    time so the cluster's matrix is built only if it splits. ``rule``: ``norm`` (the largest L2 norm,
    CFL's paper) or ``coordinate`` (the largest absolute coordinate, the FedRC code's)."""
    total, biggest, n = None, 0.0, 0
    for row in updates:
        total = row.astype(np.float64, copy=True) if total is None else np.add(total, row, out=total)
        if rule == "coordinate":  # max |x| without an abs copy of the row
            biggest = max(biggest, float(row.max()), float(-row.min()))
        else:
            biggest = max(biggest, float(np.linalg.norm(row)))
        n += 1
    return float(np.linalg.norm(total / n)), biggest


def split_is_safe(similarity: np.ndarray, halves: np.ndarray, gamma_max: float) -> tuple[bool, float]:
    """CFL's separation theorem as LayerCFL checks it (eq. 20): a bipartition is correct when
    gamma_max < sqrt((1 - alpha_cross_max) / 2), alpha_cross_max the largest cosine similarity of
    updates across the two halves. Returns (safe, alpha_cross_max)."""
    _, cross_max = separation(similarity, halves)
    return bool(np.sqrt(max(0.0, 1.0 - cross_max) / 2.0) > gamma_max), cross_max


def stacked_rows(keys: Sequence[int], row: Callable[[int], np.ndarray]) -> np.ndarray:
    """``row(k)`` for each key, filled into one float64 matrix in place: not a list of rows plus its
    stack (300 clients x 2.2M parameters are 5 GB each)."""
    first = row(keys[0])
    out = np.empty((len(keys), first.size), dtype=np.float64)
    out[0] = first
    for i, k in enumerate(keys[1:], 1):
        out[i] = row(k)
    return out
