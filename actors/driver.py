"""Driver side: connect to (or start) Ray, start the coordinator next to us, stream its events."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.coordinator import Coordinator
from actors.federation import unwrap
from actors.launch import launch_actors
from fedray.config import Config
from fedray.experiment import Event


def connect(address: str | None = None) -> bool:
    """Attach to ``address`` / RAY_ADDRESS, or start a local Ray. Returns True if we started it."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
        return False
    ray.init(include_dashboard=False, logging_level=logging.WARNING)
    return True


def run_on_ray(cfg: Config, address: str | None = None) -> Iterator[Event]:
    started = connect(address)
    group = coord = None
    try:
        # Client actors start now, so their imports overlap with the coordinator's start-up.
        group = launch_actors(cfg.to_dict())
        # Pin the coordinator to this node: it writes the results, and `--output` is a path here.
        here = ray.get_runtime_context().get_node_id()
        pin = NodeAffinitySchedulingStrategy(node_id=here, soft=False)
        coord = Coordinator.options(scheduling_strategy=pin).remote()
        for ref in coord.run.remote(cfg.to_dict(), group):
            yield ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        raise unwrap(e) from None
    finally:
        if coord is not None:
            ray.kill(coord)
        if group is not None:
            group.close()
        if started:
            ray.shutdown()
