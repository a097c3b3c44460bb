"""The Ray side of `fedray sweep`: one Ray connection, each run with its own coordinator, and client
actors handed from a finished run to the next run of the same shape."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence

import ray
from ray.util.placement_group import placement_group_table

from actors.driver import RunHandle, connect, stream_run
from actors.launch import ActorGroup, ActorPool, actor_shape
from fedray.config import Config
from fedray.experiment import Event
from fedray.placement import Need
from fedray.sweep_file import SweepRun


class RayLauncher:
    """Runs of a sweep on one Ray cluster (attached to, or started once for the whole sweep)."""

    def __init__(self, address: str | None = None, plugins: Sequence[str] = ()) -> None:
        self.started = connect(address, plugins)
        # client actors a finished run left for the next run of its shape (`stream_run`)
        self.pool = ActorPool()
        self._handles: dict[int, RunHandle] = {}
        self._ready: dict[int, ActorGroup] = {}  # idle actors taken for runs about to start
        self._placed: set[int] = set()  # runs whose placement group Ray has placed
        self._lock = threading.Lock()

    def resources(self) -> dict[str, float]:
        return ray.cluster_resources()

    def free(self, running: Mapping[int, tuple[float, float]]) -> tuple[float, float]:
        """Ray's available resources (other jobs, and our placed runs, already taken off), less what
        our runs not placed yet will take: their placement groups are not in Ray's count yet."""
        avail = ray.available_resources()
        with self._lock:
            handles = dict(self._handles)
        idle_cpus, idle_gpus = self.pool.held()  # idle actors give way to the next run (`stream_run`)
        cpus, gpus = avail.get("CPU", 0.0) + idle_cpus, avail.get("GPU", 0.0) + idle_gpus
        for index, (c, g) in running.items():
            if index not in self._placed:
                handle = handles.get(index)
                pg = None if handle is None or handle.group is None else handle.group.pg
                if pg is not None and placement_group_table(pg).get("state") == "CREATED":
                    self._placed.add(index)
                    continue
                cpus, gpus = cpus - c, gpus - g
        return cpus, gpus

    def need(self, cfg: Config) -> Need:
        return Need(cfg.num_cpus_per_actor, cfg.num_gpus_per_actor, cfg.num_actors, cfg.num_clients)

    def prepare(self, run: SweepRun, actors: int) -> None:
        """Called as the run is launched, before its thread starts: it takes idle actors of its shape
        now, so `no_more_runs` (after the last launch) cannot kill actors a launched run is to use."""
        group = self.pool.take(actor_shape(run.config.to_dict(), actors))
        if group is not None:
            with self._lock:
                self._ready[run.index] = group

    def launch(self, run: SweepRun, actors: int) -> Iterator[Event]:
        handle = RunHandle()
        with self._lock:
            self._handles[run.index] = handle
            group = self._ready.pop(run.index, None)
        try:
            yield from stream_run(run.config, actors, handle, run.restart, pool=self.pool, group=group)
        finally:
            with self._lock:
                self._handles.pop(run.index, None)

    def cancel(self) -> None:
        with self._lock:
            handles = list(self._handles.values())
        for h in handles:
            h.cancel()

    def no_more_runs(self) -> None:
        """Every run is launched: the actors of those still running are not kept when they end."""
        self.pool.close()

    def close(self) -> None:
        self.pool.close()
        with self._lock:
            ready, self._ready = list(self._ready.values()), {}
        for g in ready:
            g.close()
        if self.started:
            ray.shutdown()
