"""How big a federation CFL and LayerCFL can hold: they are cross-silo methods
(docs/algorithms/splitting.md#cross-silo-only), and a run beyond this machine's memory is refused
before anything starts."""

from __future__ import annotations

import math
from typing import Any

from fedray.client_states import machine_memory  # the driver's node: the coordinator runs there


def check_participation(cfg: Any) -> None:
    if cfg.participation != 1.0:
        raise ValueError(
            f"config key 'participation': {cfg.algorithm} bipartitions all of a cluster's clients every round, "
            f"so every client takes part (participation: 1.0), got {cfg.participation}"
        )


def check_size(cfg: Any) -> None:
    """CFL and LayerCFL are cross-silo methods: every round the coordinator holds every client's
    update (its model's trainable values, as float32 and again as float64 for the similarity) and the N x N
    similarity matrix. A run that would need more than half this machine's memory for them is
    refused before anything starts."""
    n, dims = cfg.num_clients, trainable_values(cfg)
    need = n * dims * 12 + n * n * 8
    have = machine_memory()
    if need > have / 2:
        most = int((-12 * dims + math.sqrt(144 * dims * dims + 16 * have)) / 16)  # 8k^2 + 12dk = have/2
        raise ValueError(
            f"config key 'num_clients': {cfg.algorithm} holds every client's update each round ({n:,} clients x "
            f"{dims:,} values) and their {n:,} x {n:,} similarities: about {need / 2**30:.1f} GB, more than half of "
            f"this machine's {have / 2**30:.1f} GB. It is a cross-silo method (docs/algorithms/splitting.md); here it "
            f"fits at most about {most:,} clients"
        )


def trainable_values(cfg: Any) -> int:
    """The number of trainable parameters of the configured model (what a client's update holds)."""
    from fedray.data import dataset_info
    from fedray.models import build_model

    info = dataset_info(cfg)
    model = build_model(cfg.model, tuple(info.input_shape), info.num_classes, cfg.head_bias)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
