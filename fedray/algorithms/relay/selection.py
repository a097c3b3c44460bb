"""FedCat's device grouping and count-based selection DevSelect (docs/algorithms/fedcat.md#fedcat steps a-b,
eqs. 4-5, with the zero-count rule of docs/algorithms/fedcat.md#decisions-where-the-paper-is-silent), and the Latin-square route of its copies (pure
numpy); `select_devices` applies them to a round of the federation.

Client ids are positions 0..N-1 here; callers map their ids to positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedray.federation import Federation
from fedray.records import Record, rec

# ------------------------------------------------------------------------------------------------
# FedCat (docs/algorithms/fedcat.md#fedcat-and-clustered-sampling)
# ------------------------------------------------------------------------------------------------


def equal_groups(n: int, k: int, rng: np.random.Generator) -> list[list[int]]:
    """docs/algorithms/fedcat.md#fedcat step a: a random permutation of 0..n-1 split into k groups of floor(n/k) or ceil(n/k), each sorted."""
    return [sorted(int(c) for c in part) for part in np.array_split(rng.permutation(n), k)]


def selection_probabilities(counts: np.ndarray) -> np.ndarray:
    """Eqs. 4-5 over one group: w_d = 1/sqrt(M[d][o]), P(d) = w_d / sum w. A device never chosen at
    this position (count 0) has an infinite MBIE-EB bonus: the zero-count devices share all the
    probability equally (docs/algorithms/fedcat.md#decisions-where-the-paper-is-silent; 1/sqrt(0) is undefined in the paper)."""
    counts = np.asarray(counts, dtype=np.float64)
    zero = counts == 0
    if zero.any():
        return zero / zero.sum()
    w = 1.0 / np.sqrt(counts)
    return w / w.sum()


def dev_select(
    groups: Sequence[Sequence[int]], counts: np.ndarray, offset: int, epsilon: float, rng: np.random.Generator
) -> list[int]:
    """Alg. 3 DevSelect: one device per group, in group order; increments ``counts[d, offset]``.

    Per group: u ~ U(0, 1); with u <= epsilon the greedy choice (largest weight, ties uniformly),
    otherwise a draw from eq. 5. Zero-count devices come first in both branches (docs/algorithms/fedcat.md#decisions-where-the-paper-is-silent).
    """
    chosen = []
    for group in groups:
        members = np.asarray(group)
        p = selection_probabilities(counts[members, offset])
        if rng.random() <= epsilon:
            best = np.flatnonzero(p == p.max())
            d = int(members[best[rng.integers(len(best))]])
        else:
            d = int(members[rng.choice(len(members), p=p)])
        counts[d, offset] += 1
        chosen.append(d)
    return chosen


def latin_square(devices: Sequence[int], offset: int) -> list[int]:
    """Alg. 2: copy i goes to ``devices[(offset + i) mod K]`` (the device selected from group (offset + i) mod K)."""
    k = len(devices)
    return [int(devices[(offset + i) % k]) for i in range(k)]


def select_devices(
    counts: np.ndarray, groups: list[list[int]], fed: Federation, hp: Any, rnd: int
) -> tuple[list[int], list[list[int]], list[Record]]:
    """L_dev for round ``rnd`` (the device of group g at index g), the groups, and the group
    records; DevSelect increments ``counts`` in place."""
    ids = fed.client_ids
    k = counts.shape[1]
    if not hp.grouping:  # FedCat w/ DC: FedAvg's sampling, K devices
        return fed.sample(fed.task.participation, fed.task.rng("sample", rnd=rnd)), [], []
    records: list[Record] = []
    if rnd % (hp.regroup_cycles * k) == 0:
        groups = [
            [ids[p] for p in g] for g in equal_groups(len(ids), k, fed.task.rng("fedcat/groups", rnd=rnd))
        ]
        records = [
            rec("group", g, scope="client", entity=c) for g, members in enumerate(groups) for c in members
        ]
    pos = {c: p for p, c in enumerate(ids)}
    chosen = dev_select(
        [[pos[c] for c in g] for g in groups],
        counts,
        rnd % k,
        hp.epsilon,
        fed.task.rng("fedcat/select", rnd=rnd),
    )
    return [ids[p] for p in chosen], groups, records
