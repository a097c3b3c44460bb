"""How many client actors to start, which clients each hosts, and which sweep runs to start now.

Pure functions over resource counts (no Ray): the driver and the sweep scheduler ask Ray for the
cluster's totals and decide here.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_EPS = 1e-9  # 0.1 * 10 is 0.9999999999999999 in floating point


class PlacementError(RuntimeError):
    """The requested actors do not fit the cluster; the message names the config keys."""


def gpu_share(gpus_per_actor: float) -> float:
    """The GPU capacity one actor really takes.

    Ray packs fractional GPUs inside one physical GPU, so 0.3 per actor fits 3 actors per GPU and
    strands 0.1: each actor effectively takes 1/3. Whole GPUs (>= 1) are taken as they are.
    """
    if gpus_per_actor <= 0:
        return 0.0
    if gpus_per_actor >= 1:
        return gpus_per_actor
    return 1.0 / math.floor(1.0 / gpus_per_actor + _EPS)


# `num_gpus_per_actor: auto` shares a GPU between at most this many client actors: more gave no
# more throughput on an H200, and each holds a CUDA context (docs/benchmark.md#figures-behind-defaults).
AUTO_ACTORS_PER_GPU = 4


def auto_gpus_per_actor(cpus_per_actor: float, nodes: Iterable[tuple[float, float]]) -> float:
    """What ``num_gpus_per_actor: auto`` resolves to on a cluster whose live nodes have these (CPUs,
    GPUs): 0 when no node has a GPU (client actors run on CPUs); else ``1 / k``, each GPU shared by
    k actors: as many as a GPU node's CPUs hold for one GPU (``num_cpus_per_actor`` each), at least
    1 and at most `AUTO_ACTORS_PER_GPU`, the least over the GPU nodes that can hold an actor at all
    (so every such node can hold its share). 16 CPUs and 1 GPU at 2 CPUs an actor: 0.25; 16 CPUs
    and 8 GPUs: 1.0."""
    shares = [
        min(AUTO_ACTORS_PER_GPU, math.floor(cpus / cpus_per_actor / gpus + _EPS))
        for cpus, gpus in nodes
        if gpus >= 1 and cpus >= cpus_per_actor - _EPS  # a node that holds no actor decides nothing
    ]
    return 1.0 / max(1, min(shares)) if shares else 0.0


def actor_slots(cpus_per_actor: float, gpus_per_actor: float, cpus: float, gpus: float) -> int:
    """How many actors of one bundle fit in ``cpus`` CPUs and ``gpus`` GPUs."""
    n = math.floor(cpus / cpus_per_actor + _EPS)
    if gpus_per_actor > 0:
        n = min(n, math.floor(gpus / gpu_share(gpus_per_actor) + _EPS))
    return max(0, n)


def plan_actor_count(
    num_clients: int,
    num_actors: int,
    cpus_per_actor: float,
    gpus_per_actor: float,
    cluster_cpus: float,
    cluster_gpus: float,
) -> int:
    """``num_actors`` if set, else as many actors as the cluster's CPUs (and GPUs, if asked for) allow.

    Never more actors than clients. Fractional GPUs: 4 GPUs at 0.1 each give 40 actors.
    """
    if num_actors > 0:
        return min(num_actors, num_clients)
    n = actor_slots(cpus_per_actor, gpus_per_actor, cluster_cpus, cluster_gpus)
    if n < 1:
        raise PlacementError(
            f"no client actor fits: each needs num_cpus_per_actor={cpus_per_actor} and num_gpus_per_actor={gpus_per_actor}, "
            f"the cluster has {cluster_cpus:g} CPUs and {cluster_gpus:g} GPUs"
        )
    return min(n, num_clients)


def assign_clients(num_examples: Mapping[int, int], num_actors: int) -> list[list[int]]:
    """Spread clients over actors so that each hosts about the same number of training samples.

    Greedy longest-processing-time: largest client first, onto the least-loaded actor (ties to the
    lower actor index). Deterministic; each actor's list is sorted.
    """
    heap = [(0, a) for a in range(num_actors)]
    groups: list[list[int]] = [[] for _ in range(num_actors)]
    for cid in sorted(num_examples, key=lambda c: (-num_examples[c], c)):
        load, a = heapq.heappop(heap)
        groups[a].append(cid)
        heapq.heappush(heap, (load + num_examples[cid], a))
    return [sorted(g) for g in groups]


@dataclass(frozen=True)
class Need:
    """What one run of a sweep asks for: a bundle per actor, and an actor count (0 = a share)."""

    cpus: float  # per actor
    gpus: float  # per actor
    num_actors: int  # the run's own num_actors; 0 = a share of what is free
    num_clients: int  # never more actors than clients

    def resources(self, actors: int) -> tuple[float, float]:
        """(CPUs, GPUs) that ``actors`` actors of this bundle take, GPUs as packed (`gpu_share`)."""
        return actors * self.cpus, actors * gpu_share(self.gpus)


def plan_launches(
    pending: Sequence[Need], free_cpus: float, free_gpus: float, running: int, max_concurrent: int
) -> list[tuple[int, int]]:
    """Which pending runs to start now (indices into ``pending``, in order) and with how many actors.

    - At most ``max_concurrent`` runs at once (0 = as many as the free resources allow).
    - A run with its own ``num_actors`` starts when that many actors fit (such runs are served
      first: they cannot shrink); until then later runs may go first.
    - A run with ``num_actors = 0`` gets an even share of what is free among the runs that can start
      now, rounded up for the earlier ones so no slot is left over (16 slots, 12 runs: 4 runs get 2
      actors, 8 get 1), at least 1 and at most one per client.
    """
    allowed = len(pending) if max_concurrent <= 0 else max(0, max_concurrent - running)
    out: list[tuple[int, int]] = []

    def take(i: int, actors: int) -> None:
        nonlocal free_cpus, free_gpus
        cpus, gpus = pending[i].resources(actors)
        free_cpus, free_gpus = free_cpus - cpus, free_gpus - gpus
        out.append((i, actors))

    # Runs with their own actor count first: they cannot shrink, the others can.
    for i, need in enumerate(pending):
        actors = min(need.num_actors, need.num_clients)
        if (
            need.num_actors > 0
            and len(out) < allowed
            and actors <= actor_slots(need.cpus, need.gpus, free_cpus, free_gpus)
        ):
            take(i, actors)
    shares = [i for i, need in enumerate(pending) if need.num_actors == 0]
    for pos, i in enumerate(shares):
        need = pending[i]
        slots = actor_slots(need.cpus, need.gpus, free_cpus, free_gpus)
        k = min(allowed - len(out), len(shares) - pos, slots)  # runs that will share these slots
        if k >= 1:
            take(i, min(-(-slots // k), need.num_clients))
    return sorted(out)


def unused_gpus(gpus: float, configs: Sequence[Any]) -> str | None:
    """What a run or sweep (``configs``) says where some of it asks for no GPU on a cluster with
    ``gpus``; None where there is nothing to say."""
    if gpus <= 0 or all(c.num_gpus_per_actor != 0 for c in configs):
        return None
    return (
        f"the Ray cluster has {gpus:g} GPU(s) and num_gpus_per_actor is 0: client actors train on CPUs "
        "(num_gpus_per_actor: auto shares the GPUs between them)"
    )
