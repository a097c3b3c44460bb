"""The sweep scheduler: `run_sweep` starts a sweep's runs through a `Launcher` (Ray's in
actors/sweep.py, or `LocalLauncher`, in-process one at a time) while resources allow, each
streamed by its own thread, and turns what they report into `SweepEvent`s. No Ray here.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fedray.config.keys import Config
from fedray.experiment.loop import Event, Finished
from fedray.federation.placement import Need, plan_launches
from fedray.storage.lock import RunLocked
from fedray.storage.results import failure_text
from fedray.storage.writer import record_failure
from fedray.sweeps.sweep_file import SweepRun


class Launcher(Protocol):
    """Where the runs of a sweep execute (Ray, `actors.sweep.RayLauncher`; or in this process one at
    a time, `LocalLauncher`): every method the sweep flow (`fedray.sweeps.flow`) and `run_sweep` call."""

    # the runs go one at a time in the calling thread (no worker threads), so Ctrl-C lands inside
    # the run, which records itself interrupted
    inline: bool

    def resources(self) -> dict[str, float]:
        """Total CPUs/GPUs of the cluster (read again at every scheduling step: nodes may join)."""

    def free(self, running: Mapping[int, tuple[float, float]]) -> tuple[float, float]:
        """(CPUs, GPUs) free for new runs now, given what this sweep's runs in flight hold
        (run index -> (CPUs, GPUs)); other jobs on the cluster count too."""

    def need(self, cfg: Config) -> Need:
        """What one run asks for."""

    def auto_gpus(self, cpus_per_actor: float) -> float:
        """What ``num_gpus_per_actor: auto`` resolves to here for actors of ``cpus_per_actor`` CPUs."""

    def cluster_gpus(self) -> float:
        """The GPUs where the runs go (what the line that says what auto chose reads)."""

    def prepare(self, run: SweepRun, actors: int) -> None:
        """Called as a run is launched, in the scheduler's thread, before its own thread starts: it
        takes what the run is to start with (idle actors a finished run left)."""

    def launch(self, run: SweepRun, actors: int) -> Iterator[Event]:
        """Run it with ``actors`` client actors and yield its events (called in a worker thread)."""

    def pack_refusal(self, cfg: Config) -> str | None:
        """Why this launcher cannot hold a pack of runs of ``cfg`` (`fedray.sweeps.pack`): pack_runs
        auto then runs them alone (`launch_units`); None where it can."""

    def launch_pack(self, runs: Sequence[SweepRun]) -> Iterator[tuple[int, Any]]:
        """A pack's runs in one worker: ``(k, event)`` of run ``runs[k]``, and a `fedray.sweeps.pack.Ended`
        as each ends."""

    def no_more_runs(self) -> None:
        """Every run is launched: what is kept for later runs (idle actors) goes back."""

    def cancel(self) -> None:
        """Stop every run in flight (Ctrl-C)."""

    def close(self) -> None:
        """Give back everything held (a Ray started for the sweep is stopped)."""


class LocalLauncher:
    """In-process, one run at a time, in the calling thread (``fedray sweep --local``; debugging, tests).

    ``inline``: Ctrl-C then lands inside the run, which records itself as interrupted, as with
    ``fedray run --local`` (a worker thread would be killed inside torch at exit).
    """

    inline = True

    def resources(self) -> dict[str, float]:
        return {"CPU": 1.0}

    def free(self, running: Mapping[int, tuple[float, float]]) -> tuple[float, float]:
        return 1.0 - sum(c for c, _ in running.values()), 0.0

    def need(self, cfg: Config) -> Need:
        return Need(cpus=1.0, gpus=0.0, num_actors=1, num_clients=cfg.num_clients)

    def auto_gpus(self, cpus_per_actor: float) -> float:
        """In this process client training is on the CPU."""
        return 0.0

    def cluster_gpus(self) -> float:
        return 0.0

    def prepare(self, run: SweepRun, actors: int) -> None:
        """Nothing is held between runs here."""

    def launch(self, run: SweepRun, actors: int) -> Iterator[Event]:
        from fedray.experiment.local import make_local_federation
        from fedray.experiment.loop import execute

        return execute(run.config, make_local_federation, run.restart)

    def pack_refusal(self, cfg: Config) -> str | None:
        """Why runs of ``cfg`` gain nothing packed here: in this process they train on the CPU, where
        ``batched_clients: auto`` trains one client at a time (they would only take turns); None
        where they train batched."""
        from fedray.experiment.local import engine_for

        engine = engine_for(cfg, "cpu")
        if engine.stacked:
            return None
        if cfg.batched_clients == "auto":
            return (
                "in this process the runs train on the CPU, where batched_clients auto trains one client "
                "at a time (batched_clients: on packs them here)"
            )
        return f"in this process the runs would train one client at a time: {engine.why}"

    def launch_pack(self, runs: Sequence[SweepRun]) -> Iterator[tuple[int, Any]]:
        from fedray.experiment.local import make_local_federation
        from fedray.sweeps.pack import execute_pack

        return execute_pack([r.config for r in runs], make_local_federation, [r.restart for r in runs])

    def no_more_runs(self) -> None:
        """Nothing is kept for later runs."""

    def cancel(self) -> None:
        """Nothing runs elsewhere: the run in flight was stopped by the interrupt itself."""

    def close(self) -> None:
        """Nothing to give back."""


@dataclass
class RunLaunched:
    run: SweepRun
    actors: int
    packed: int = 0  # the runs of its pack (`fedray.sweeps.pack`), itself included; 0: not packed


@dataclass
class Waiting:
    """No pending run fits what is free, though one would fit the idle cluster: other jobs hold it."""

    free_cpus: float
    free_gpus: float


@dataclass
class RunProgress:
    run: SweepRun
    event: Event  # Started / RoundDone from the run's round loop


@dataclass
class RunEnded:
    run: SweepRun
    seconds: float
    summary: dict[str, Any] = field(default_factory=dict)
    error: BaseException | None = None
    # why nothing was run here ("" where it ran): another process was writing the run, or had
    # finished it since the sweep planned (two sweeps over one folder); not a failure
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


LOCKED = "another process is writing it (another sweep over this folder): left to that one"
FINISHED_MEANWHILE = "another process finished it since this sweep looked"


def _ended(run: SweepRun, t0: float, summary: dict[str, Any], error: BaseException | None) -> RunEnded:
    """A run's end: a run another process holds (`RunLocked`) is skipped, not failed."""
    if isinstance(error, RunLocked):
        return RunEnded(run, time.perf_counter() - t0, summary, None, LOCKED)
    return RunEnded(run, time.perf_counter() - t0, summary, error)


SweepEvent = RunLaunched | RunProgress | RunEnded | Waiting


@dataclass
class _UnitDone:
    """A launch unit (a run, or a pack of runs) has ended: what it held is free (not yielded out)."""

    key: int


def _run_events(launcher: Launcher, run: SweepRun, actors: int) -> Iterator[SweepEvent]:
    """One run's events; its end (with the error, if it failed) comes last. An interrupt propagates."""
    t0 = time.perf_counter()
    summary: dict[str, Any] = {}
    already = False
    try:
        for ev in launcher.launch(run, actors):
            if isinstance(ev, Finished):
                summary, already = ev.summary, ev.already
            yield RunProgress(run, ev)
    except Exception as e:  # noqa: BLE001 - reported by the scheduler; the other runs go on
        yield _ended(run, t0, summary, e)
        return
    yield RunEnded(run, time.perf_counter() - t0, summary, skipped=FINISHED_MEANWHILE if already else "")


def _pack_events(launcher: Launcher, runs: Sequence[SweepRun]) -> Iterator[SweepEvent]:
    """A pack's events (`fedray.sweeps.pack`): each run's, each run's end as it ends; a failure of the
    pack itself (its worker lost) ends every run not yet ended with it."""
    from fedray.sweeps.pack import Ended

    t0 = time.perf_counter()
    summaries: dict[int, dict[str, Any]] = {}
    already: set[int] = set()
    ended: set[int] = set()
    try:
        for k, ev in launcher.launch_pack(runs):
            if isinstance(ev, Ended):
                ended.add(k)
                if isinstance(ev.error, KeyboardInterrupt):  # stopped: propagates, as a run's does
                    raise ev.error
                end = _ended(runs[k], t0, summaries.get(k, {}), ev.error)
                if k in already and end.ok:
                    end.skipped = FINISHED_MEANWHILE
                yield end
                continue
            if isinstance(ev, Finished):
                summaries[k] = ev.summary
                if ev.already:
                    already.add(k)
            yield RunProgress(runs[k], ev)
    except BaseException as e:  # noqa: BLE001 - reported by the scheduler; the other runs go on
        if isinstance(e, (KeyboardInterrupt, GeneratorExit)):  # stopped: propagates, as a run's does
            raise
        for k, run in enumerate(runs):
            if k not in ended:
                yield RunEnded(run, time.perf_counter() - t0, summaries.get(k, {}), e)


def _forward(events: Iterator[SweepEvent], out: queue.Queue, key: int) -> None:
    """A worker thread's loop: a unit's events, then its `_UnitDone`, however the thread ends (a
    unit whose end never came would hold its resources for good)."""
    try:
        for ev in events:
            out.put(ev)
    finally:
        out.put(_UnitDone(key))


def run_sweep(
    runs: Sequence[SweepRun], launcher: Launcher, max_concurrent_runs: int = 0, poll_s: float = 5.0
) -> Iterator[SweepEvent]:
    """Run ``runs`` through ``launcher``, as many at once as resources and ``max_concurrent_runs`` allow.

    A failed run does not stop the others. Runs start when they fit what is free, other jobs on the
    cluster included (while only those are in the way the sweep waits, saying so once). A run that
    does not fit even the idle cluster is started alone, and Ray's placement decides (an
    autoscaler may add nodes; else ``placement_timeout_s``).
    Each run is streamed by a worker thread, except with an ``inline`` launcher (in-process runs go
    one at a time in this thread). Leaving the generator early (Ctrl-C) cancels the runs in flight.
    """
    if auto := [r.index for r in runs if r.config.gpus_auto]:  # run ids depend on where they go
        raise ValueError(
            f"runs {auto} have num_gpus_per_actor auto: resolve it on the cluster first "
            "(fedray.sweeps.flow.plan_sweep)"
        )
    events: queue.Queue[SweepEvent | _UnitDone] = queue.Queue()
    # launch units: a run, or the runs of a pack (pack_runs, `fedray.sweeps.pack.pack_groups`), which go
    # to one worker together and hold what one actor of theirs asks for
    pending = [[runs[i] for i in unit] for unit in launch_units(runs, launcher)]
    running: dict[int, tuple[float, float]] = {}  # unit key (its first run's index) -> (CPUs, GPUs)
    threads: list[threading.Thread] = []
    inline = launcher.inline
    waiting = False

    def need(unit: list[SweepRun]) -> Need:
        one = launcher.need(unit[0].config)
        return one if len(unit) == 1 else dataclasses.replace(one, num_actors=1, num_clients=1)

    def settle(ev: SweepEvent) -> SweepEvent:
        if isinstance(ev, RunEnded) and not ev.ok:
            cfg = ev.run.config
            record_failure(cfg.output, ev.run.run_id, cfg.recorded(), failure_text(ev.error))
        return ev

    def unit_events(unit: list[SweepRun], actors: int) -> Iterator[SweepEvent]:
        return _run_events(launcher, unit[0], actors) if len(unit) == 1 else _pack_events(launcher, unit)

    try:
        while pending or running:
            if pending:
                free_cpus, free_gpus = launcher.free(running)
                needs = [need(u) for u in pending]
                launches = plan_launches(needs, free_cpus, free_gpus, len(running), max_concurrent_runs)
                if not launches and not running:
                    total = launcher.resources()
                    if plan_launches(
                        needs, total.get("CPU", 0.0), total.get("GPU", 0.0), 0, max_concurrent_runs
                    ):
                        if not waiting:  # other jobs hold what these runs need: wait for them
                            waiting = True
                            yield Waiting(free_cpus, free_gpus)
                    else:  # too big for the whole cluster: alone, and Ray's placement decides
                        launches = [(0, min(max(1, needs[0].num_actors), needs[0].num_clients))]
                if launches:
                    waiting = False
                if inline:
                    launches = launches[:1]
                started = {i for i, _ in launches}
                for i, actors in launches:
                    unit = pending[i]
                    running[unit[0].index] = needs[i].resources(actors)
                    if len(unit) == 1:
                        launcher.prepare(
                            unit[0], actors
                        )  # takes what the run is to start with, in this thread
                    for run in unit:
                        yield RunLaunched(run, actors, len(unit) if len(unit) > 1 else 0)
                    if inline:
                        for ev in unit_events(unit, actors):
                            yield settle(ev)
                        running.pop(unit[0].index, None)
                    else:
                        t = threading.Thread(
                            target=_forward,
                            args=(unit_events(unit, actors), events, unit[0].index),
                            daemon=True,
                        )
                        t.start()
                        threads.append(t)
                pending = [u for i, u in enumerate(pending) if i not in started]
                if not pending:
                    launcher.no_more_runs()  # idle actors kept for later runs (actors/sweep.py) go back
            if running or waiting:
                try:
                    ev = events.get(timeout=poll_s)
                except queue.Empty:
                    continue  # look again: nodes may have joined, other jobs may have ended
                if isinstance(ev, _UnitDone):
                    running.pop(ev.key, None)
                    continue
                yield settle(ev)
    except BaseException:
        if running:
            launcher.cancel()
            for t in threads:
                t.join(timeout=30)  # their runs were cancelled: they end at once
        raise


def launch_units(runs: Sequence[SweepRun], launcher: Launcher) -> list[list[int]]:
    """The runs' launch units (`fedray.sweeps.pack.pack_groups`), as `run_sweep` launches them on
    ``launcher``: where it refuses a pack of auto runs (``pack_refusal``), they go alone."""
    from fedray.sweeps.pack import pack_groups

    return pack_groups([r.config for r in runs], lambda cfg: launcher.pack_refusal(cfg) is None)


def packs_declined(runs: Sequence[SweepRun], units: list[list[int]], launcher: Launcher) -> list[str]:
    """Lines that say why runs ``pack_runs: auto`` would pack with others go alone (``units``:
    `launch_units`; the launcher cannot hold their pack where packs run), with how many runs each
    reason keeps alone."""
    from fedray.sweeps.pack import pack_groups

    counts: dict[str, int] = {}
    alone = {u[0] for u in units if len(u) == 1}
    for unit in pack_groups([r.config for r in runs]):  # as they would pack on a launcher that holds any
        for i in unit if len(unit) > 1 else ():
            if i in alone and (reason := launcher.pack_refusal(runs[i].config)):
                counts[reason] = counts.get(reason, 0) + 1
    return [
        f"pack_runs auto: {n} run{'s go' if n > 1 else ' goes'} alone: {why}" for why, n in counts.items()
    ]
