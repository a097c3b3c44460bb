"""Tidy records (docs/architecture.md#the-round-loop): one dict per value; the coordinator adds the run columns.

`rec` makes a metric row (``DIR/metrics/``); `assignment_rec` a cluster-assignment row (``DIR/assignments/``:
which cluster a client is in, with a weight, 1 for a hard assignment).
"""

from __future__ import annotations

from typing import Any

Record = dict[str, Any]

GLOBAL_ENTITY = -1
# Metrics that are wall times: they differ between two runs of one config, and are never compared.
TIMING_METRICS = frozenset({"seconds", "eval_seconds", "client_seconds"})


# Metrics an evaluation reads from the test sets (the global test set, the clients' own test splits,
# FedRC's test clients): a run that evaluates on validation (config key evaluate_on) reads its
# clients' validation splits in their place, and records them as val_<name> (val_accuracy, val_loss).
EVALUATED_ON_TEST = frozenset({"accuracy", "loss", "local_accuracy", "global_model", "test_client_model"})


def validation_named(records: list[Record]) -> list[Record]:
    """An evaluation's records as a run that evaluates on validation records them: the metrics read
    from the (validation) sets the test sets' place named val_<name>, the rest as they are."""
    return [
        {**r, "metric": f"val_{r['metric']}"} if r.get("metric") in EVALUATED_ON_TEST else r for r in records
    ]


def rec(
    metric: str, value: float, scope: str = "global", entity: int = GLOBAL_ENTITY, stage: str = ""
) -> Record:
    if scope not in ("global", "cluster", "client"):
        raise ValueError(f"scope must be global, cluster or client, got {scope!r}")
    return {"metric": metric, "value": float(value), "scope": scope, "entity": int(entity), "stage": stage}


def assignment_rec(client: int, cluster: int, weight: float = 1.0, stage: str = "") -> Record:
    """Client ``client`` is in cluster ``cluster`` (soft assignments: one row per cluster, with its weight)."""
    return {
        "kind": "assignment",
        "client": int(client),
        "cluster": int(cluster),
        "weight": float(weight),
        "stage": stage,
    }


def is_assignment(r: Record) -> bool:
    return r.get("kind") == "assignment"
