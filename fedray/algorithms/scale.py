"""How many clients an algorithm can hold when its coordinator keeps something for every client
(cross-silo methods: CFL's and LayerCFL's similarities, CluSamp's updates and distances, FedCat's
group counts): a run whose estimate is more than half this machine's memory is refused before
anything starts, naming the estimate and how many clients would fit (docs/running.md#cross-device-scale)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedray.federation.client_states import machine_memory  # the driver's node: the coordinator runs there


def check_fits(cfg: Any, need: Callable[[int], float], holds: str) -> None:
    """Refuse ``cfg`` if ``need(num_clients)`` bytes (what the coordinator holds, as ``holds`` says,
    for that many clients) is more than half this machine's memory."""
    n, have = cfg.num_clients, machine_memory()
    if need(n) > have / 2:
        raise ValueError(
            f"config key 'num_clients': {cfg.algorithm} {holds}: about {need(n) / 2**30:.1f} GB, more than half of "
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


def trainable_values(cfg: Any) -> int:
    """The number of trainable parameters of the configured model (what a client's update holds)."""
    from fedray.data import dataset_info
    from fedray.models import build_model

    info = dataset_info(cfg)
    model = build_model(cfg.model, tuple(info.input_shape), info.num_classes, cfg.head_bias)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
