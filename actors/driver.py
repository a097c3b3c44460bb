"""Driver side: connect to (or start) Ray, start a run's actors and coordinator, stream its events."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.coordinator import Coordinator
from actors.federation import unwrap
from actors.launch import ActorGroup, launch_actors
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


def kill_and_wait(actor: Any, timeout_s: float = 30.0) -> None:
    """``ray.kill`` the actor and wait until it is gone (``ray.kill`` only asks). A coordinator must
    be dead before its client actors are killed: alive, it would see them die and record its run as
    failed instead of interrupted."""
    ray.kill(actor)
    try:  # queued behind whatever it runs, so this returns once the actor has died
        ray.get(actor.__ray_ready__.remote(), timeout=timeout_s)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        pass


@dataclass
class RunHandle:
    """The Ray pieces of one run in flight, so another thread can stop it (a sweep on Ctrl-C)."""

    coordinator: Any = None
    group: ActorGroup | None = None

    def cancel(self) -> None:
        if self.coordinator is not None:
            ray.kill(self.coordinator)  # its generator then fails in the thread that streams it


def stream_run(
    cfg: Config, num_actors: int | None = None, handle: RunHandle | None = None
) -> Iterator[Event]:
    """Run ``cfg`` on the connected Ray and yield its events; frees its actors when it ends.

    ``num_actors`` overrides the config's (a sweep's share of the cluster).
    """
    handle = handle or RunHandle()
    try:
        # Client actors start now, so their imports overlap with the coordinator's start-up.
        handle.group = launch_actors(cfg.to_dict(), num_actors)
        # Pin the coordinator to this node: it writes the results, and `--output` is a path here.
        here = ray.get_runtime_context().get_node_id()
        pin = NodeAffinitySchedulingStrategy(node_id=here, soft=False)
        handle.coordinator = Coordinator.options(scheduling_strategy=pin).remote()
        for ref in handle.coordinator.run.remote(cfg.to_dict(), handle.group):
            yield ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        raise unwrap(e) from None
    finally:
        if handle.coordinator is not None:
            kill_and_wait(handle.coordinator)
        if handle.group is not None:
            handle.group.close()


def run_on_ray(cfg: Config, address: str | None = None) -> Iterator[Event]:
    """`fedray run` on Ray: connect (or start a private Ray), run, and stop what we started."""
    started = connect(address)
    try:
        yield from stream_run(cfg)
    finally:
        if started:
            ray.shutdown()
