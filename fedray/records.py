"""Tidy metric records (DESIGN §2): one dict per value; the coordinator adds run columns."""

from __future__ import annotations

from typing import Any

Record = dict[str, Any]

GLOBAL_ENTITY = -1


def rec(
    metric: str, value: float, scope: str = "global", entity: int = GLOBAL_ENTITY, stage: str = ""
) -> Record:
    if scope not in ("global", "cluster", "client"):
        raise ValueError(f"scope must be global, cluster or client, got {scope!r}")
    return {"metric": metric, "value": float(value), "scope": scope, "entity": int(entity), "stage": stage}
