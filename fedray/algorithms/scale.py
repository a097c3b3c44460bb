"""How many clients an algorithm can hold when its coordinator keeps something for every client
(cross-silo methods: CFL's and LayerCFL's similarities, CluSamp's updates and distances, FedCat's
group counts): a run whose estimate is more than half this machine's memory is refused before
anything starts, naming the estimate and how many clients would fit (docs/running.md#cross-device-scale)."""

from __future__ import annotations

from collections.abc import Callable

from fedray.algorithms.plan import RunPlan
from fedray.federation.client_states import machine_memory  # the driver's node: the coordinator runs there


def check_fits(run: RunPlan, need: Callable[[int], float], holds: str) -> None:
    """Refuse ``run`` if ``need(num_clients)`` bytes (what the coordinator holds, as ``holds`` says,
    for that many clients) is more than half this machine's memory."""
    n, have = run.num_clients, machine_memory()
    if need(n) > have / 2:
        raise ValueError(
            f"config key 'num_clients': {run.algorithm} {holds}: about {need(n) / 2**30:.1f} GB, more than half of "
            f"this machine's {have / 2**30:.1f} GB. It is a cross-silo method (docs/running.md#cross-device-scale); "
            f"here it fits at most about {most_clients(need, have / 2):,} clients"
        )


def most_clients(need: Callable[[int], float], budget: float) -> int:
    """The largest client count whose ``need`` is within ``budget`` (``need`` grows with the count)."""
    lo, hi = 0, 1
    while need(hi) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid) <= budget else (lo, mid)
    return lo
