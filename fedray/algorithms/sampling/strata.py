"""Clustered sampling's strata (Fraboni, Vidal, Kameni, Lorenzi, ICML 2021; pure numpy/scipy, no
federation): m distributions over the clients, one client drawn from each per round, built from
sample sizes (their Algorithm 1) or from a hierarchical clustering of the clients' last updates
(Algorithm 2).

Client ids are positions 0..N-1 here; callers map their ids to positions.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np


def _fill(strata: np.ndarray, order: Sequence[int], units: np.ndarray, capacity: int, start: int = 0) -> None:
    """Pour each client's units, in ``order``, into the strata from ``start`` on, each up to ``capacity``."""
    k = start
    for c in order:
        left = int(units[c])
        while left > 0:
            room = capacity - int(strata[k].sum())
            if room == 0:
                k += 1
                continue
            take = min(room, left)
            strata[k, c] += take
            left -= take


def sample_size_strata(sizes: Sequence[int], m: int) -> np.ndarray:
    """Algorithm 1: m distributions r_k over N clients with sum_k r_{k,i} = m p_i (p_i = n_i / n).

    Clients in decreasing size (ties by id) are poured into m strata of mass 1/m each, counted in
    integer units (client i brings m n_i units, a stratum holds n) so the split is exact. Returns
    m x N rows that sum to 1.
    """
    n = np.asarray(sizes, dtype=np.int64)
    units = n * m
    strata = np.zeros((m, len(n)), dtype=np.int64)
    _fill(strata, np.argsort(-n, kind="stable"), units, int(n.sum()))
    return strata / strata.sum(axis=1, keepdims=True)


def update_distances(updates: np.ndarray, measure: str, chunk: int = 1 << 16) -> np.ndarray:
    """N x N distances between the clients' representative updates (rows), as Fraboni et al.'s code:
    ``arccos`` of the cosine (0 when either update is zero), ``L2`` the squared Euclidean distance,
    ``L1`` the Manhattan distance. Accumulated in float64 over column chunks (N models of float64
    at once would double the memory of the updates)."""
    g = np.asarray(updates)
    n = g.shape[0]
    if measure not in ("arccos", "L2", "L1"):
        raise ValueError(f"unknown distance {measure!r}: arccos, L2 or L1")
    from scipy.spatial.distance import cdist  # scipy is imported where it is used (start-up time)

    acc = np.zeros((n, n))
    for start in range(0, max(g.shape[1], 1), chunk):
        part = g[:, start : start + chunk].astype(np.float64)
        acc += cdist(part, part, "cityblock") if measure == "L1" else part @ part.T
    if measure == "L1":
        return acc
    sq = np.diag(acc).copy()
    if measure == "L2":
        d = np.maximum(sq[:, None] + sq[None, :] - 2 * acc, 0.0)
    else:
        norms = np.sqrt(sq)
        with np.errstate(invalid="ignore", divide="ignore"):
            d = np.arccos(np.clip(acc / np.outer(norms, norms), -1.0, 1.0))
        d[(norms[:, None] == 0) | (norms[None, :] == 0)] = 0.0
    np.fill_diagonal(d, 0.0)
    return d


def similarity_strata(
    distances: np.ndarray, sizes: Sequence[int], m: int, rng: np.random.Generator
) -> np.ndarray:
    """Algorithm 2: m distributions from a hierarchical clustering of the clients.

    Ward linkage on the rows of the distance matrix (as the reference code calls scipy), the tree
    cut where a cluster would exceed mass 1/m (the merge heights replaced by the merged clusters'
    sizes, which grow up the tree). The m heaviest clusters seed the m strata; the other clusters,
    lightest first and their clients in random order, fill the strata up to mass 1/m each. Integer
    units as in `sample_size_strata`. Returns m x N rows that sum to 1.

    A client heavier than 1/m on its own (a cluster of one the cut cannot respect, where the
    reference code's arithmetic breaks) is poured over several strata: then the m heaviest clusters
    are poured one after another instead of one per stratum.
    """
    n = np.asarray(sizes, dtype=np.int64)
    units = n * m
    capacity = int(n.sum())
    if len(n) == 1:
        return np.ones((m, 1))
    with warnings.catch_warnings():  # the rows are the observations on purpose (reference code)
        warnings.filterwarnings("ignore", message=".*uncondensed distance matrix")
        from scipy.cluster.hierarchy import fcluster, linkage

        z = linkage(np.asarray(distances, dtype=np.float64), "ward")
    weights = list(units)
    for row in z:  # row i merges clusters z[i,0] and z[i,1] into cluster N + i
        weights.append(weights[int(row[0])] + weights[int(row[1])])
        row[2] = weights[-1]
    labels = fcluster(z, capacity, criterion="distance")
    clusters = sorted(set(labels.tolist()), key=lambda c: (int(units[labels == c].sum()), c))
    strata = np.zeros((m, len(n)), dtype=np.int64)
    kept, rest = clusters[len(clusters) - m :], clusters[: len(clusters) - m]
    if (units > capacity).any():
        _fill(strata, [int(i) for c in kept for i in np.flatnonzero(labels == c)], units, capacity)
    else:
        for k, c in enumerate(kept):
            members = np.flatnonzero(labels == c)
            strata[k, members] = units[members]
    order = [int(i) for c in rest for i in rng.permutation(np.flatnonzero(labels == c))]
    _fill(strata, order, units, capacity)
    return strata / strata.sum(axis=1, keepdims=True)


def draw_from_strata(strata: np.ndarray, rng: np.random.Generator) -> list[int]:
    """One client from each distribution (a client may be drawn by several)."""
    return [int(rng.choice(strata.shape[1], p=row)) for row in strata]
