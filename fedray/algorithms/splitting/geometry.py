"""The geometry of recursive bipartition (CFL, LayerCFL; docs/algorithms/splitting.md#cfl,
docs/algorithms/splitting.md#layercfl): the similarities and distances of clients' updates, CFL's
split into two halves and its split rule, LayerCFL's separation check, and the gaps of LayerCFL
eqs. 21-22 that say how well a matrix separates ground-truth groups.

Pure numpy / scikit-learn; no federation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np


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


def split_thresholds(eps1: float, eps2: float, rule: str, peak_mean_norm: float) -> tuple[float, float]:
    """The (eps1, eps2) a round of CFL compares with: the norms themselves (``rule`` absolute), or
    (relative) those fractions of the largest mean update norm so far."""
    if rule == "relative":
        return eps1 * peak_mean_norm, eps2 * peak_mean_norm
    return eps1, eps2


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
