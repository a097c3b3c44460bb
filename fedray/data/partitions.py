"""Client partitions (ALGORITHMS.md §7) as pure functions of the labels and a numpy Generator.

Each partitioner returns a `Partition`: per-client index arrays into the training set and, where
the partition has a ground-truth client grouping (``dominant``, ``rotation``), the group id of each client.
NIID-Bench's procedures are followed step by step; the random draws come from the Generator we
pass, so the partitions are reproducible for a seed but not bit-identical to NIID-Bench's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

MAX_ATTEMPTS = 1000  # redraws for the min-size rules before we give up with a clear error


class PartitionError(ValueError):
    """The partition cannot be built with these settings; the message names the config key."""


@dataclass(frozen=True)
class PartitionParams:
    num_clients: int
    num_classes: int
    k: int = 2  # labels: classes per client
    beta: float = 0.5  # Dirichlet concentration, or the dominant-class fraction
    clusters: int = 4  # dominant: number of client groups
    size: int = 0  # dominant: samples per client, 0 = automatic
    min_size: int = 10  # dirichlet / quantity: minimum samples per client


@dataclass
class Partition:
    clients: list[np.ndarray]  # client -> int64 indices into the training set
    groups: np.ndarray | None = None  # client -> ground-truth group, when the partition defines one
    tests: list[np.ndarray] | None = None  # client -> its own test split, when a partition file gives one


def _pack(parts: list[list[np.ndarray]] | list[np.ndarray]) -> list[np.ndarray]:
    out = []
    for p in parts:
        if isinstance(p, list):
            p = np.concatenate(p) if p else np.zeros(0, dtype=np.int64)
        out.append(np.asarray(p, dtype=np.int64))
    return out


def iid(labels: np.ndarray, p: PartitionParams, rng: np.random.Generator) -> Partition:
    """§7.1: a random permutation split into N near-equal contiguous parts."""
    return Partition(_pack(np.array_split(rng.permutation(len(labels)), p.num_clients)))


def by_labels(labels: np.ndarray, p: PartitionParams, rng: np.random.Generator) -> Partition:
    """§7.2 "#C=k": client i holds label i mod C plus k-1 more drawn uniformly; holders of a label split it evenly."""
    n_clients, n_cls = p.num_clients, p.num_classes
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    if p.k == n_cls:
        for c in range(n_cls):
            idx = rng.permutation(np.flatnonzero(labels == c))
            for j, chunk in enumerate(np.array_split(idx, n_clients)):
                parts[j].append(chunk)
        return Partition(_pack(parts))
    holds: list[list[int]] = []
    for i in range(n_clients):
        current = [i % n_cls]
        while len(current) < p.k:
            c = int(rng.integers(n_cls))
            if c not in current:
                current.append(c)
        holds.append(current)
    for c in range(n_cls):
        holders = [j for j in range(n_clients) if c in holds[j]]
        if not holders:  # only when N < C: nobody holds this label, its samples stay unused
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        for j, chunk in zip(holders, np.array_split(idx, len(holders)), strict=True):
            parts[j].append(chunk)
    return Partition(_pack(parts))


def dirichlet(labels: np.ndarray, p: PartitionParams, rng: np.random.Generator) -> Partition:
    """§7.3 class-wise Dir(beta) with NIID-Bench's balance step; redraw until every client has min_size.

    An attempt only counts each client's samples (the draws are the procedure's, in its order); the
    index lists are put together once an attempt succeeds, so the redraws of a setting that cannot
    succeed (too many clients for the data) end in seconds.
    """
    n, n_clients = len(labels), p.num_clients
    class_idx = [np.flatnonzero(labels == c) for c in range(p.num_classes)]
    for _ in range(MAX_ATTEMPTS):
        sizes = np.zeros(n_clients, dtype=np.int64)
        drawn = []
        for idx_c in class_idx:
            idx_c = rng.permutation(idx_c)
            props = rng.dirichlet(np.full(n_clients, p.beta))
            # Balance step: a client that already holds its fair share n/N gets nothing more.
            props = props * (sizes < n / n_clients)
            props = props / props.sum()
            cuts = (np.cumsum(props) * len(idx_c)).astype(int)[:-1]
            sizes += np.diff(np.concatenate([[0], cuts, [len(idx_c)]]))
            drawn.append((idx_c, cuts))
        if sizes.min() >= p.min_size:
            chunks = [np.split(idx_c, cuts) for idx_c, cuts in drawn]
            parts = [np.concatenate([c[j] for c in chunks]).astype(np.int64) for j in range(n_clients)]
            return Partition([rng.permutation(pj) for pj in parts])
    raise PartitionError(
        f"config key 'partition_beta': Dir({p.beta}) over {n_clients} clients gave a client with fewer than "
        f"partition_min_size={p.min_size} samples in {MAX_ATTEMPTS} draws ({n} samples in all); use fewer clients, "
        "a larger partition_beta or a smaller partition_min_size"
    )


def quantity(labels: np.ndarray, p: PartitionParams, rng: np.random.Generator) -> Partition:
    """§7.4 quantity skew: client sizes ~ Dir(beta), labels IID within each client."""
    n = len(labels)
    idx = rng.permutation(n)
    for _ in range(MAX_ATTEMPTS):
        q = rng.dirichlet(np.full(p.num_clients, p.beta))
        if np.min(q * n) >= p.min_size:
            cuts = (np.cumsum(q) * n).astype(int)[:-1]
            return Partition(_pack(np.split(idx, cuts)))
    raise PartitionError(
        f"config key 'partition_beta': quantity skew Dir({p.beta}) over {p.num_clients} clients could not give every "
        f"client partition_min_size={p.min_size} of {n} samples in {MAX_ATTEMPTS} draws"
    )


def _dominant_counts(size: int, beta: float, n_cls: int, dom: int, rng: np.random.Generator) -> np.ndarray:
    """Class counts of one client: round(beta*size) from its dominant class, the rest spread evenly."""
    counts = np.zeros(n_cls, dtype=np.int64)
    counts[dom] = int(round(beta * size))
    rest = size - counts[dom]
    others = np.array([c for c in range(n_cls) if c != dom])
    if len(others):
        counts[others] += rest // len(others)
        extra = rng.choice(others, size=rest % len(others), replace=False)
        counts[extra] += 1
    else:
        counts[dom] = size
    return counts


def dominant(labels: np.ndarray, p: PartitionParams, rng: np.random.Generator) -> Partition:
    """§7.10 dominant-class skew: client i is in group i mod K; each group has its own dominant class."""
    n_cls, n_clients = p.num_classes, p.num_clients
    groups = np.arange(n_clients) % p.clusters
    dom_of_group = (
        rng.permutation(n_cls)[: p.clusters] if p.clusters <= n_cls else rng.integers(0, n_cls, p.clusters)
    )
    available = np.bincount(labels, minlength=n_cls)

    def demand(size: int) -> np.ndarray:
        # Worst case: every remainder sample lands on the same class (ceil of the even spread).
        need = np.zeros(n_cls, dtype=np.int64)
        for g in groups:
            d = dom_of_group[g]
            per = np.full(n_cls, -(-(size - int(round(p.beta * size))) // max(1, n_cls - 1)))
            per[d] = int(round(p.beta * size))
            need += per
        return need

    size = p.size or len(labels) // n_clients
    if p.size == 0:
        while size > 1 and np.any(demand(size) > available):
            size -= 1
    if size < 1 or np.any(demand(size) > available):
        raise PartitionError(
            f"config key 'partition_size': {size} samples per client with dominant fraction {p.beta} need more samples "
            f"of some class than the data set has ({available.tolist()}); lower partition_size or num_clients"
        )
    pools = [list(rng.permutation(np.flatnonzero(labels == c))) for c in range(n_cls)]
    parts = []
    for i in range(n_clients):
        counts = _dominant_counts(size, p.beta, n_cls, int(dom_of_group[groups[i]]), rng)
        chosen = []
        for c in range(n_cls):
            chosen.extend(pools[c][: counts[c]])
            del pools[c][: counts[c]]
        parts.append(rng.permutation(np.asarray(chosen, dtype=np.int64)))
    return Partition(parts, groups=groups.astype(np.int64))


def rotation(labels: np.ndarray, p: PartitionParams, rng: np.random.Generator) -> Partition:
    """§7.10 rotation clusters: an IID split (``size`` > 0: that many samples per client, else all of
    them), client i in group i mod K. The images of group c are rotated by c * 360 / K degrees when
    the data is built (`fedray.data.rotation`); the labels stay."""
    order = rng.permutation(len(labels))
    if p.size:
        if p.size * p.num_clients > len(order):
            raise PartitionError(
                f"config key 'partition_size': {p.num_clients} clients x {p.size} samples need more than "
                f"the {len(order)} training samples"
            )
        order = order[: p.size * p.num_clients]
    return Partition(
        _pack(np.array_split(order, p.num_clients)), groups=np.arange(p.num_clients) % p.clusters
    )


def clientwise_dirichlet(labels: np.ndarray, p: PartitionParams, rng: np.random.Generator) -> Partition:
    """§7.7 (Hsu et al. / FedRC "LDA"): client by client, q ~ Dir(beta * remaining class shares), M = n // N draws.

    Drawing one sample at a time from Categorical(q) without replacement, with exhausted classes
    dropped from q, is the same in distribution as a multinomial draw whose overflow is redrawn over
    the classes that still have samples; we do the latter (vectorised).
    """
    n_cls = p.num_classes
    m = len(labels) // p.num_clients
    pools = [list(rng.permutation(np.flatnonzero(labels == c))) for c in range(n_cls)]
    parts = []
    for _ in range(p.num_clients):
        remaining = np.array([len(pl) for pl in pools], dtype=np.float64)
        live = remaining > 0
        q = np.zeros(n_cls)
        q[live] = rng.dirichlet(p.beta * remaining[live] / remaining.sum())
        counts = np.zeros(n_cls, dtype=np.int64)
        todo = m
        while todo > 0:
            cap = remaining.astype(np.int64) - counts
            q = np.where(cap > 0, q, 0.0)
            if q.sum() <= 0:  # guard from §7.7: the support of q is exhausted; fall back to what is left
                q = (cap > 0).astype(np.float64)
            draw = rng.multinomial(todo, q / q.sum())
            take = np.minimum(draw, cap)
            counts += take
            todo -= int(take.sum())
        chosen = []
        for c in range(n_cls):
            chosen.extend(pools[c][: counts[c]])
            del pools[c][: counts[c]]
        parts.append(rng.permutation(np.asarray(chosen, dtype=np.int64)))
    return Partition(parts)


PARTITIONS: dict[str, Callable[[np.ndarray, PartitionParams, np.random.Generator], Partition]] = {
    "iid": iid,
    "labels": by_labels,
    "dirichlet": dirichlet,
    "quantity": quantity,
    "dominant": dominant,
    "clientwise_dirichlet": clientwise_dirichlet,
    "rotation": rotation,
}
# Partitions that define ground-truth client groups (`Partition.groups`), e.g. for an oracle clustering.
GROUPED_PARTITIONS = frozenset({"dominant", "rotation"})


def split_train_test(
    indices: np.ndarray, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Keep round(fraction * n) of a client's samples (at least one train sample stays) as its test split."""
    if fraction <= 0:
        return indices, np.zeros(0, dtype=np.int64)
    idx = rng.permutation(indices)
    n_test = min(int(round(fraction * len(idx))), len(idx) - 1)
    return np.sort(idx[n_test:]), np.sort(idx[:n_test])
