"""How many client actors to start and which clients each one hosts (pure functions, no Ray)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping


class PlacementError(RuntimeError):
    """The requested actors do not fit the cluster; the message names the config keys."""


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
    eps = 1e-9  # 0.1 * 10 is 0.9999999999999999 in floating point
    n = math.floor(cluster_cpus / cpus_per_actor + eps)
    if gpus_per_actor > 0:
        n = min(n, math.floor(cluster_gpus / gpus_per_actor + eps))
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
