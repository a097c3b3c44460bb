"""How big a federation CFL and LayerCFL can hold: they are cross-silo methods
(docs/algorithms/splitting.md#cross-silo-only), and a run beyond this machine's memory is refused
before anything starts (`fedray.algorithms.scale`)."""

from __future__ import annotations

from typing import Any

from fedray.algorithms.scale import check_fits, trainable_values


def check_participation(cfg: Any) -> None:
    if cfg.participation != 1.0:
        raise ValueError(
            f"config key 'participation': {cfg.algorithm} bipartitions all of a cluster's clients every round, "
            f"so every client takes part (participation: 1.0), got {cfg.participation}"
        )


def check_size(cfg: Any) -> None:
    """CFL and LayerCFL are cross-silo methods: every round the coordinator holds every client's
    update (its model's trainable values, as float32 and again as float64 for the similarity) and the N x N
    similarity matrix."""
    dims = trainable_values(cfg)
    check_fits(
        cfg,
        lambda n: n * dims * 12 + n * n * 8,
        f"holds every client's update each round ({cfg.num_clients:,} clients x {dims:,} values) and their "
        f"{cfg.num_clients:,} x {cfg.num_clients:,} similarities",
    )
