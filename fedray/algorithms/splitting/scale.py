"""How big a federation CFL and LayerCFL can hold: they are cross-silo methods
(docs/algorithms/splitting.md#cross-silo-only), and a run beyond this machine's memory is refused
before anything starts (`fedray.algorithms.scale`)."""

from __future__ import annotations

from fedray.algorithms.plan import RunPlan
from fedray.algorithms.scale import check_fits


def check_participation(run: RunPlan) -> None:
    if run.participation != 1.0:
        raise ValueError(
            f"config key 'participation': {run.algorithm} bipartitions all of a cluster's clients every round, "
            f"so every client takes part (participation: 1.0), got {run.participation}"
        )


def check_size(run: RunPlan) -> None:
    """CFL and LayerCFL are cross-silo methods: every round the coordinator holds every client's
    update (its model's trainable values, as float32 and again as float64 for the similarity) and the N x N
    similarity matrix."""
    dims = run.trainable_values()
    check_fits(
        run,
        lambda n: n * dims * 12 + n * n * 8,
        f"holds every client's update each round ({run.num_clients:,} clients x {dims:,} values) and their "
        f"{run.num_clients:,} x {run.num_clients:,} similarities",
    )
