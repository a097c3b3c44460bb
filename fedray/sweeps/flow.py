"""One sweep from its file to its last event, the same for `fedray sweep` and `fedray.sweep`.

`plan_sweep` loads and checks the sweep file (with the `SweepOptions` a command line or a caller
gives), checks that its results folder can be written,
resolves ``num_gpus_per_actor: auto`` where the runs go (connecting the launcher for it), and plans
which runs to run; the `SweepSession` it returns connects the launcher when a run needs it, says
how the runs launch (packs, packs declined, GPUs left unused), runs them, and closes the launcher
when it is closed itself (a ``with`` block). The callers keep what is theirs: the command line its
arguments, printing and exit codes; the Python API its printing and return values.

The launcher comes from ``connect(sweep)``, given by the caller (`fedray.api.open_sweep`: in this
process, or on Ray), so nothing here imports Ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from fedray.config.coercion import ConfigError
from fedray.data.identity import DataChanged
from fedray.experiment.same_data import other_data
from fedray.federation.placement import unused_gpus
from fedray.storage.results import check_writable, run_state
from fedray.sweeps.pack import pack_groups
from fedray.sweeps.scheduler import (
    LOCKED,
    Launcher,
    RunEnded,
    SweepEvent,
    launch_units,
    packs_declined,
    run_sweep,
)
from fedray.sweeps.sweep_file import PlannedRun, Sweep, SweepRun, load_sweep, plan


@dataclass
class SweepSession:
    """A sweep planned: its runs, what to do with each, and the launcher (connected when first
    needed, closed with the session)."""

    sweep: Sweep
    planned: list[PlannedRun]
    todo: list[SweepRun]  # the runs to run, in the sweep's order (restart set where they start over)
    auto: dict[float, float]  # num_gpus_per_actor auto: CPUs an actor -> the GPU share chosen
    local: bool  # the runs go in this process, one at a time
    max_concurrent_runs: int
    connect: Callable[[Sweep], Launcher]  # where the sweep's runs go
    _launcher: Launcher | None = field(default=None, repr=False)

    @property
    def launcher(self) -> Launcher:
        """Where the runs go, connected on first use."""
        if self._launcher is None:
            self._launcher = self.connect(self.sweep)
        return self._launcher

    @property
    def connected(self) -> bool:
        return self._launcher is not None

    @property
    def skipped(self) -> int:
        return len(self.planned) - len(self.todo)

    def states(self) -> dict[str, int]:
        """How many runs are in each state (new, finished, failed, interrupted, running)."""
        counts: dict[str, int] = {}
        for p in self.planned:
            counts[p.state] = counts.get(p.state, 0) + 1
        return dict(sorted(counts.items()))

    def units(self, ask: bool = True) -> tuple[list[list[int]], bool]:
        """The runs to run as they launch, a list of indices into ``todo`` a unit (a pack of several
        runs, or one), and whether the launcher was asked. ``ask=False`` (a dry run) asks only a
        launcher at hand (in this process, or connected already for auto): else the runs are
        grouped as they would pack on a launcher that holds any pack."""
        if ask or self.local or self.connected:
            return launch_units(self.todo, self.launcher), True
        return pack_groups([r.config for r in self.todo]), False

    def packs_declined(self, units: list[list[int]]) -> list[str]:
        """Why runs that would pack go alone on this launcher (`fedray.sweeps.scheduler.packs_declined`)."""
        return packs_declined(self.todo, units, self.launcher)

    def unused_gpus(self) -> str | None:
        """What to say where the cluster has GPUs that some runs to run ask none of."""
        return unused_gpus(self.launcher.resources().get("GPU", 0.0), [r.config for r in self.todo])

    def run(self) -> Iterator[SweepEvent]:
        """The runs to run, run (`fedray.sweeps.scheduler.run_sweep`); leaving early cancels those
        in flight. A run with a live logger is shown there as one run of this sweep, by the values
        its axes give it (`fedray.storage.loggers.base.write_setting`)."""
        from fedray.storage.loggers.base import write_setting

        parent = f"sweep {Path(self.sweep.source).name}"
        for r in self.todo:
            if r.config.loggers:
                write_setting(r.config.output, r.config.run_id(), r.label, parent)
        return run_sweep(self.todo, self.launcher, self.max_concurrent_runs)

    def left_to_others(
        self, ended: Iterable[RunEnded], say: Callable[[str], None] | None = None, poll_s: float = 1.0
    ) -> list[tuple[SweepRun, str]]:
        """The sweep's runs another process was writing (skipped when planned, or when launched:
        ``ended``), waited for while that process still writes them (said once to ``say``); those
        it did not finish, each with its state (interrupted: it stopped; failed): the sweep is not
        done with them."""
        by_other = {e.run.run_id for e in ended if e.skipped == LOCKED}
        by_other |= {p.run.run_id for p in self.planned if p.state == "running"}
        runs = [r for r in self.sweep.runs if r.run_id in by_other]
        states = {r.run_id: run_state(self.sweep.output, r.run_id) for r in runs}
        while waiting := [r for r in runs if states[r.run_id] == "running"]:
            if say is not None:
                say(
                    f"waiting for {len(waiting)} runs another process is writing "
                    f"({', '.join(f'#{r.index}' for r in waiting[:10])}): the sweep is done when they are"
                )
                say = None
            time.sleep(poll_s)
            states.update({r.run_id: run_state(self.sweep.output, r.run_id) for r in waiting})
        return [(r, states[r.run_id]) for r in runs if states[r.run_id] != "finished"]

    def close(self) -> None:
        """Give back what the launcher holds (a Ray started for the sweep is stopped)."""
        launcher, self._launcher = self._launcher, None
        if launcher is not None:
            launcher.close()

    def __enter__(self) -> SweepSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def refuse_other_data(sweep: Sweep, planned: list[PlannedRun], force: bool, restart: bool) -> None:
    """Refuse the sweep (`DataChanged`, naming each run) where a run it would skip as finished, or
    resume from its checkpoint, recorded other data than it reads now (`fedray.experiment.same_data`)."""
    found = [(p.run, why) for p in planned if (why := other_data(p.run.config, p.state, force, restart))]
    if found:
        listed = "\n".join(f"  #{run.index}: {why}" for run, why in found[:10])
        more = f"\n  ... and {len(found) - 10} more" if len(found) > 10 else ""
        raise DataChanged(
            f"sweep {sweep.source}: {len(found)} of its runs were made on other data than they read now:\n{listed}{more}"
        )


@dataclass(frozen=True)
class SweepOptions:
    """How a sweep file is run, beside the file: what `fedray sweep`'s flags and `fedray.sweep`'s
    keywords say."""

    sets: Sequence[str] = ()  # --set KEY=VALUE, over every run
    output: str | None = None  # the results folder (None: the file's)
    only: Sequence[str] = ()  # --only KEY=VALUE: the runs that have these values
    plugins: Sequence[str] = ()  # --plugin: modules every run imports
    force: bool = False  # run finished runs again, from their start
    restart: bool = False  # start unfinished runs over instead of going on from their checkpoints
    dry_run: bool = False  # nothing is written (the results folder is not made)
    max_concurrent_runs: int | None = None  # None: the sweep file's own


def plan_sweep(
    path: str | Path,
    connect: Callable[[Sweep], Launcher],
    options: SweepOptions = SweepOptions(),
    local: bool = False,
) -> SweepSession:
    """Load, check and plan a sweep (every error before anything runs: `SweepError`, `ConfigError`,
    `DatasetMissing`, `OSError` naming the results folder, `ConnectionError` where no Ray can be
    reached to resolve auto), its runs going in this process (``local``) or where ``connect`` sends
    them."""
    limit = options.max_concurrent_runs
    if limit is not None and limit < 0:
        raise ConfigError(
            f"max_concurrent_runs (--max-concurrent-runs) must be >= 0 (0 = from resources), got {limit}"
        )
    sweep = load_sweep(path, options.sets, output=options.output, only=options.only, plugins=options.plugins)
    check_writable(sweep.output, create=not options.dry_run)
    launcher = None
    auto: dict[float, float] = {}
    try:
        if sweep.gpus_auto:  # before run ids are read: they carry the share auto resolves to
            launcher = connect(sweep)
            sweep, auto = sweep.with_gpus(launcher.auto_gpus)
        planned = plan(sweep, force=options.force)
    except BaseException:
        if launcher is not None:
            launcher.close()
        raise
    force, restart = options.force, options.restart
    refuse_other_data(sweep, planned, force, restart)
    todo = [replace(p.run, restart=restart or p.state == "finished") for p in planned if p.action == "run"]
    limit = sweep.max_concurrent_runs if limit is None else limit
    return SweepSession(sweep, planned, todo, auto, local, limit, connect, launcher)
