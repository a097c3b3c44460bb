"""The Ray side of `fedray sweep`: one Ray connection, each run with its own coordinator, and client
actors handed from a finished run to the next run of the same shape."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import ray
from ray.util.placement_group import placement_group_table
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.coordinator import PackWorker
from actors.driver import STOPPED, RunHandle, auto_gpus, cluster_gpus, connect, stream_run
from actors.federation import unwrap
from actors.launch import ActorGroup, ActorPool, actor_shape
from fedray.config.keys import Config
from fedray.config.plugins import digest
from fedray.experiment.loop import Event, Recovered, RoundDone, Started
from fedray.federation import WorkerLost
from fedray.federation.placement import Need, PlacementError
from fedray.storage.writer import mark_ended
from fedray.sweeps.pack import Ended
from fedray.sweeps.sweep_file import SweepRun


class RayLauncher:
    """Runs of a sweep on one Ray cluster (attached to, or started once for the whole sweep): a
    `fedray.sweeps.scheduler.Launcher`."""

    inline = False  # each run is streamed by a worker thread of the scheduler

    def __init__(
        self,
        address: str | None = None,
        plugins: Sequence[str] = (),
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.started = connect(address, plugins, say)
        # a Ray fedray started on this machine cannot grow: a run whose actors exceed its totals fails
        # at once (`launch_actors`), not after placement_timeout_s of waiting for nodes
        self.fixed = self.started
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

    def auto_gpus(self, cpus_per_actor: float) -> float:
        return auto_gpus(cpus_per_actor)

    def cluster_gpus(self) -> float:
        return cluster_gpus()

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
            yield from stream_run(
                run.config, actors, handle, run.restart, self.fixed, pool=self.pool, group=group
            )
        finally:
            with self._lock:
                self._handles.pop(run.index, None)

    def _driver_node(self) -> dict[str, float]:
        here = ray.get_runtime_context().get_node_id()
        return next((n for n in ray.nodes() if n.get("NodeID") == here), {}).get("Resources", {})

    def pack_refusal(self, cfg: Config) -> str | None:
        """Why this node (the driver's, where a pack runs) cannot hold a pack of runs of ``cfg``: it
        has fewer CPUs or GPUs than one pack's worker takes; None where it can."""
        has = self._driver_node()
        if cfg.num_gpus_per_actor <= has.get("GPU", 0.0) and cfg.num_cpus_per_actor <= has.get("CPU", 0.0):
            return None
        return (
            f"a pack runs on the node the sweep was started from (it writes the results folder there), "
            f"which has {has.get('CPU', 0.0):g} CPUs and {has.get('GPU', 0.0):g} GPUs; it asks for "
            f"num_cpus_per_actor {cfg.num_cpus_per_actor:g} and num_gpus_per_actor {cfg.num_gpus_per_actor:g}"
        )

    def launch_pack(self, runs: Sequence[SweepRun]) -> Iterator[tuple[int, Any]]:
        """A pack's runs in one worker (`actors.coordinator.PackWorker`) of one actor's CPUs and GPU
        share, on this node (it writes the results folder, a path here). A worker lost (its process
        killed, out of memory) is started again, its unended runs going on from their checkpoints,
        up to ``max_failures`` times (each announced by a `Recovered` event a run); past that they
        are recorded failed. Stopped from outside (Ctrl-C), they are recorded interrupted. Either
        way they go on from their checkpoints when the sweep is submitted again."""
        cfg = runs[0].config
        here = ray.get_runtime_context().get_node_id()
        if refusal := self.pack_refusal(cfg):
            raise PlacementError(
                f"pack_runs: {refusal}. Start the sweep on a node that has them, or set pack_runs: off"
            )
        handle = RunHandle()
        with self._lock:
            self._handles[runs[0].index] = handle
        pin = NodeAffinitySchedulingStrategy(node_id=here, soft=False)
        ended: set[int] = set()
        rounds = dict.fromkeys(range(len(runs)), 0)
        restarts, reason, failures = [r.restart for r in runs], "", 0
        # the plug-ins as read here, when the runs' ids were computed: the worker checks its own
        expect = {s: digest(s) for s in cfg.plugins}
        try:
            while True:
                going = [k for k in range(len(runs)) if k not in ended]
                try:
                    handle.coordinator = PackWorker.options(
                        num_cpus=cfg.num_cpus_per_actor,
                        num_gpus=cfg.num_gpus_per_actor,
                        scheduling_strategy=pin,
                    ).remote()
                    refs = handle.coordinator.run.remote(
                        [runs[k].config.to_dict() for k in going],
                        [restarts[k] for k in going],
                        os.getcwd(),
                        reason,
                        expect,
                    )
                    for ref in refs:
                        j, ev = ray.get(ref)
                        k = going[j]
                        with self._lock:  # the worker runs: Ray's available resources count it now (`free`)
                            self._placed.add(runs[0].index)
                        if isinstance(ev, Ended):
                            ended.add(k)
                        elif isinstance(ev, RoundDone):
                            rounds[k] = ev.round
                        elif isinstance(ev, Started):
                            rounds[k] = ev.resumed_from
                        yield k, ev
                    return
                except ray.exceptions.RayTaskError as e:
                    raise unwrap(e) from None
                except ray.exceptions.RayActorError as e:  # the worker died with its runs
                    if handle.cancelled:
                        raise
                    if failures >= cfg.max_failures:
                        for k in going:
                            if k not in ended:
                                detail = f"WorkerLost: the pack's worker died: {e}"
                                mark_ended(runs[k].config.output, runs[k].run_id, "failed", rounds[k], detail)
                                ended.add(k)
                        raise WorkerLost(f"the pack's worker died: {e}") from None
                    failures += 1
                    handle.free()
                    restarts = [False] * len(runs)  # from their checkpoints now
                    reason = f"recovery {failures} of {cfg.max_failures} after: the pack's worker died: {e}"
                    for k in going:
                        if k not in ended:
                            yield k, Recovered(runs[k].run_id, failures, cfg.max_failures, str(e), 1)
        finally:
            handle.free()
            with self._lock:
                self._handles.pop(runs[0].index, None)
            for k, run in enumerate(runs):  # stopped from outside: the worker was killed, not asked
                if k not in ended:
                    mark_ended(run.config.output, run.run_id, "interrupted", rounds[k], STOPPED)

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
