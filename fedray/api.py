"""fedray from Python (a notebook, a script): ``fedray.run`` and ``fedray.sweep``. The command line
(`jobs/cli.py`) goes through the same `prepare` and `events`, so the same config and seed give the
same numbers; errors are raised, not printed. Progress prints as `fedray run` prints it (one line a
round), ``quiet=True`` prints nothing. A sweep's launch sequence, the same for `fedray sweep` and
``fedray.sweep``, is `SweepLaunch`, over the session `open_sweep` plans.

    import fedray
    result = fedray.run("jobs/configs/digits.yaml", rounds=5, local=True)
    result.final_accuracy, result.metrics      # a float, a pandas DataFrame

A config is a path, a mapping or a `fedray.config.Config`; keyword arguments override its keys
(``rounds=5``, ``hp={"mu": 0.1}``), ``sets`` takes ``--set`` strings (``"hp.mu=0.1"``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedray import progress
from fedray.config.coercion import count
from fedray.config.keys import Config, ConfigError, merge, unsection

Say = Callable[[str], None] | None  # where a line about Ray's start goes (None: nowhere)


@dataclass
class RunResult:
    """One run's results, read from its results folder."""

    run_id: str
    output: Path
    status: str  # finished | failed | interrupted | ...
    config: Config
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def metrics(self):
        """Every metric row of the run (round, stage, metric, scope, entity, value): a DataFrame."""
        from analysis import load_metrics

        m = load_metrics(self.output)
        return m[m["run_id"] == self.run_id].reset_index(drop=True)

    @property
    def clients(self):
        """The run's clients (sizes, label counts, groups): a DataFrame."""
        from analysis import load_clients

        c = load_clients(self.output)
        return c[c["run_id"] == self.run_id].reset_index(drop=True) if len(c) else c

    @property
    def assignments(self):
        """Client-to-cluster assignments per round (clustered algorithms): a DataFrame."""
        from analysis import load_assignments

        a = load_assignments(self.output)
        return a[a["run_id"] == self.run_id].reset_index(drop=True) if len(a) else a

    @property
    def final_accuracy(self) -> float | None:
        """The global test accuracy after the last round evaluated (None: the run recorded none)."""
        return self.summary.get("final_accuracy")

    def curve(self, metric: str = "accuracy"):
        """The global ``metric`` by round: a pandas Series. A metric the run did not record is a
        KeyError naming those it did."""
        m = self.metrics
        m = m[m["scope"] == "global"]
        if metric not in set(m["metric"]):
            raise KeyError(
                f"run {self.run_id} recorded no global {metric!r} (it has: {', '.join(sorted(set(m['metric'])))})"
            )
        m = m[m["metric"] == metric]
        return m.set_index("round")["value"]


def _config_mapping(
    config: str | Path | Mapping[str, Any] | Config | None,
) -> tuple[dict[str, Any], Path | None]:
    if config is None:
        return {}, None
    if isinstance(config, Config):
        return asdict(config), None
    if isinstance(config, Mapping):
        return dict(config), None
    return {}, Path(config)


def prepare(
    config: str | Path | Mapping[str, Any] | Config | None = None,
    sets: Iterable[str] = (),
    plugins: Iterable[str] = (),
    **overrides: Any,
) -> Config:
    """The checked Config of a run, with its data and partition checked too: every error a bad
    config or a missing data set can give, before any training (and before Ray)."""
    from fedray.data import check_available, check_partition
    from fedray.experiment.checks import check_last_batches, flat_overrides, from_dict, load_config
    from fedray.storage.results import check_writable

    mapping, path = _config_mapping(config)
    if path is not None or not mapping:
        cfg = load_config(path, sets, plugins=plugins, **overrides)
    else:
        found: list[str] = []  # each part flat before they merge: one key, written in its section or not
        flat = unsection(mapping, "config", found)
        if plugins:  # after the mapping's own, wherever it wrote them (plugins, or run: {plugins})
            overrides["plugins"] = [*flat.get("plugins", []), *plugins]
        from_sets, given = flat_overrides(sets, overrides, found)
        cfg = from_dict(merge(merge(flat, from_sets), given), found)
    check_available(cfg.data_section)
    check_writable(cfg.output)
    # a partition that cannot be drawn fails in seconds, and so does a BatchNorm model that would
    # meet a batch of one sample
    check_last_batches(cfg, check_partition(cfg.data_section))
    return cfg


def resolve_gpus(
    cfg: Config, local: bool = False, address: str | None = None, say: Say = None
) -> tuple[Config, bool | None, str | None]:
    """``cfg`` with ``num_gpus_per_actor: auto`` resolved where the run goes, before its run id is
    read: 0 in this process (``local``), else from the Ray cluster, connected to for it (attached
    to ``address`` / RAY_ADDRESS, else a local Ray started). Returns the config, whether Ray was
    started for it (None: not connected here; pass it on to `events`) and the line that says what
    auto chose (None: nothing was auto)."""

    if not cfg.gpus_auto:
        return cfg, None, None
    if local:
        return cfg.with_gpus(0.0), None, progress.auto_gpus_line(0.0, cfg.num_cpus_per_actor, local=True)
    from actors.driver import auto_gpus, cluster_gpus, connect

    started = connect(address, cfg.plugins, say)
    share = auto_gpus(cfg.num_cpus_per_actor)
    said = progress.auto_gpus_line(share, cfg.num_cpus_per_actor, cluster_gpus=cluster_gpus())
    return cfg.with_gpus(share), started, said


def sweep_launcher(sw: Any, local: bool = False, address: str | None = None, say: Say = None) -> Any:
    """Where a sweep's runs go: in this process one at a time (``local``), or a Ray cluster (attached
    to ``address`` / RAY_ADDRESS, else a local Ray started for the sweep, said to ``say``)."""
    if local:
        from fedray.sweeps.scheduler import LocalLauncher

        return LocalLauncher()
    from actors.sweep import RayLauncher

    return RayLauncher(address, sorted({p for r in sw.runs for p in r.config.plugins}), say)


def open_sweep(
    path: str | Path, options: Any = None, *, local: bool = False, address: str | None = None, say: Say = None
) -> Any:
    """The sweep flow `fedray sweep` and `fedray.sweep` share (`fedray.sweeps.flow.plan_sweep`,
    with its `fedray.sweeps.flow.SweepOptions`), its runs going in this process (``local``) or to
    Ray (attached to ``address`` / RAY_ADDRESS, else a local Ray started for the sweep and stopped
    when the session closes)."""
    from fedray.sweeps.flow import SweepOptions, plan_sweep

    connect = functools.partial(sweep_launcher, local=local, address=address, say=say)
    return plan_sweep(path, connect, options or SweepOptions(), local=local)


def events(
    cfg: Config,
    local: bool = False,
    address: str | None = None,
    restart: bool = False,
    started: bool | None = None,
    say: Say = None,
) -> Iterator[Any]:
    """The run's events (`fedray.experiment.loop`): in this process, or on Ray (attached to ``address`` /
    RAY_ADDRESS, else a local Ray started for it, said to ``say``). ``started``: `resolve_gpus`
    connected already."""
    if local:
        from fedray.experiment.local import make_local_federation
        from fedray.experiment.loop import execute

        return execute(cfg, make_local_federation, restart)
    from actors.driver import run_on_ray

    return run_on_ray(cfg, address, restart, started, say)


def _say(line: str) -> None:
    print(line, flush=True)


@dataclass
class Begun:
    """A run as `begin` found it: its config (``num_gpus_per_actor: auto`` resolved), the line that
    says what auto chose (None: nothing was auto), its state in its output folder
    (`fedray.storage.results.run_state`) and its events, None where it does not run (finished and not
    forced, or being written by another live process)."""

    cfg: Config
    said: str | None
    state: str
    events: Iterator[Any] | None

    def busy(self) -> str:
        return f"run {self.cfg.run_id()} is being written into {self.cfg.output}/ by another live process"


def _stop_started(started: bool | None) -> None:
    """Stop the Ray that `resolve_gpus` started only to resolve num_gpus_per_actor: auto, where the
    run does not go on to use it."""
    if started:
        from actors.driver import disconnect

        disconnect()


def begin(
    cfg: Config,
    local: bool = False,
    address: str | None = None,
    force: bool = False,
    restart: bool = False,
    say: Say = None,
) -> Begun:
    """What `run` and `fedray run` decide before a run starts, in one place: auto resolved where
    the run goes (`resolve_gpus`), the run found finished (run again with ``force``, from its
    start) or being written by another process (a Ray started only to resolve auto is stopped
    again), else its events (``restart``: from the start, not the checkpoint). Nothing of the run
    starts until the events are read."""
    from fedray.experiment.same_data import refuse_other_data
    from fedray.storage.results import run_state

    cfg, started, said = resolve_gpus(cfg, local, address, say)
    try:
        state = run_state(cfg.output, cfg.run_id())
        refuse_other_data(cfg, state, force, restart)  # finished, or checkpointed, on other data
    except BaseException:  # a damaged record (DamagedResults), other data (DataChanged): nothing runs
        _stop_started(started)
        raise
    if state == "running" or state == "finished" and not force:
        _stop_started(started)
        return Begun(cfg, said, state, None)
    return Begun(cfg, said, state, events(cfg, local, address, restart or state == "finished", started, say))


def run(
    config: str | Path | Mapping[str, Any] | Config | None = None,
    *,
    sets: Iterable[str] = (),
    plugins: Iterable[str] = (),
    local: bool = False,
    address: str | None = None,
    force: bool = False,
    restart: bool = False,
    quiet: bool = False,
    **overrides: Any,
) -> RunResult:
    """Run one experiment (or find it finished in its output folder) and return its results.

    ``local``: in this process, no Ray; else on Ray. ``force``: run a finished run again;
    ``restart``: start an unfinished one over instead of going on from its checkpoint. It prints
    what `fedray run` prints (where it runs, a line a round, the summary); ``quiet``: nothing. Raises
    ConfigError (and DatasetMissing, PartitionError) for bad input before anything runs, and the
    run's own error if it fails.
    """
    import sys

    cfg = prepare(config, sets, plugins, **overrides)
    begun = begin(cfg, local, address, force, restart, None if quiet else _say)
    cfg, evs = begun.cfg, begun.events
    if begun.said and not quiet:
        print(begun.said, flush=True)
    if begun.state == "running":
        raise ConfigError(begun.busy())
    if evs is None:
        return result(cfg)
    t0 = time.perf_counter()
    try:
        for ev in evs:
            if not quiet:
                for line, to_stderr in progress.run_lines(ev, cfg, False, t0):
                    print(line, file=sys.stderr if to_stderr else sys.stdout, flush=True)
    finally:
        evs.close()
    return result(cfg)


def result(cfg: Config) -> RunResult:
    """The results of ``cfg``'s run as its folder holds them."""
    from analysis import load_runs

    runs = load_runs(cfg.output)
    row = runs[runs["run_id"] == cfg.run_id()]
    status = str(row["status"].iloc[0]) if len(row) else "missing"
    summary = dict(row["summary"].iloc[0]) if len(row) else {}
    return RunResult(cfg.run_id(), Path(cfg.output), status, cfg, summary)


class SweepLaunch:
    """One launch sequence of a planned sweep (`fedray.sweeps.flow.SweepSession`), the same for
    `fedray sweep` and `fedray.sweep`: where the runs go (`header`), the runs run with a line as
    each starts and ends (`run`), the runs another process was writing waited for (`wait`), and the
    closing count (`summary`). Its callers print the lines, and say what a Ctrl-C stopped."""

    def __init__(self, session: Any, local: bool, verbose: bool) -> None:
        self.session = session
        self.shown = progress.SweepProgress(len(session.todo), local, verbose)
        self.local = local
        self.left: list[tuple[Any, str]] = []

    def header(self) -> list[str]:
        """Where the runs go (raises ConnectionError where no Ray can be reached), the packs
        declined there, and the GPUs no run asks for."""
        session, todo, limit = self.session, self.session.todo, self.session.max_concurrent_runs
        res = session.launcher.resources()
        if self.local:
            where = "in-process, one at a time"
        else:
            at_once = (
                f"at most {count(limit, 'run')} at once"
                if limit
                else "as many runs at once as fit (max_concurrent_runs=0)"
            )
            where = f"on Ray with {res.get('CPU', 0):g} CPUs and {res.get('GPU', 0):g} GPUs; {at_once}"
        units, _ = session.units()  # as the sweep launches them: where this node can hold a pack
        packed = [u for u in units if len(u) > 1]
        if packed:
            where += f"; {sum(map(len, packed))} of them in {count(len(packed), 'pack')} (pack_runs)"
        lines = [f"running {count(len(todo), 'run')} {where}"]
        lines += [f"  {line}" for line in session.packs_declined(units)]
        if said := session.unused_gpus():
            lines.append(f"  {said}")
        return lines

    def run(self) -> Iterator[str]:
        """The runs, run: each event's lines (the runs still in flight are stopped where the caller
        leaves early: a Ctrl-C)."""
        events = self.session.run()
        try:
            for ev in events:
                yield from self.shown.lines(ev)  # read either way: it counts the runs ended and in flight
        finally:
            events.close()

    def wait(self, say: Callable[[str], None]) -> None:
        """Wait for the runs another process is writing, so the count is what was done."""
        self.left = self.session.left_to_others(self.shown.ended, say=say)

    @property
    def failed(self) -> list[Any]:
        return [e for e in self.shown.ended if not e.ok]

    @property
    def ok(self) -> bool:
        """Every run finished (here, or by the other process that was writing it)."""
        return not self.failed and not self.left

    def summary(self) -> list[str]:
        """The closing count, each failed and unfinished run, and where the results are."""
        shown, failed = self.shown, self.failed
        others = [e for e in shown.ended if e.skipped]  # another process's: not run here
        lines = [
            f"sweep done in {progress.duration(time.perf_counter() - shown.t0)}: "
            f"{len(shown.ended) - len(failed) - len(others)} finished, {len(failed)} failed, "
            f"{self.session.skipped + len(others)} skipped"
            + (f" ({len(others)} of them another process's)" if others else "")
        ]
        for e in failed:
            lines.append(
                f"  FAILED #{e.run.index} {e.run.label} ({e.run.run_id}): {type(e.error).__name__}: {e.error}"
            )
        for run, state in self.left:
            lines.append(
                f"  NOT FINISHED #{run.index} {run.label} ({run.run_id}): {state} by the process that was writing it"
            )
        if self.left:
            verb = "is" if len(self.left) == 1 else "are"
            lines.append(
                f"{count(len(self.left), 'run')} of this sweep that another process was writing {verb} not "
                "finished: submit the sweep again"
            )
        output = self.session.sweep.output
        return [*lines, f"results: {output}/  (fedray report {output})"]


def sweep(
    path: str | Path,
    *,
    sets: Iterable[str] = (),
    plugins: Iterable[str] = (),
    output: str | None = None,
    only: Iterable[str] = (),
    local: bool = False,
    address: str | None = None,
    max_concurrent_runs: int | None = None,
    force: bool = False,
    restart: bool = False,
    verbose: bool = False,
    quiet: bool = False,
) -> list[RunResult]:
    """Run every run of a sweep file (finished ones are skipped unless ``force``; ``restart``:
    unfinished ones start over instead of going on from their checkpoints) and return their
    results, in the sweep's order. A run that fails is in the list with its status. Errors in the
    sweep file, a results folder that cannot be written and missing data are raised before anything
    runs. It prints what `fedray sweep` prints (a line as each run starts and ends); ``verbose``:
    every round of every run too; ``quiet``: nothing."""
    from fedray.sweeps.flow import SweepOptions

    options = SweepOptions(
        sets=tuple(sets),
        output=output,
        only=tuple(only),
        plugins=tuple(plugins),
        force=force,
        restart=restart,
        max_concurrent_runs=max_concurrent_runs,
    )
    session = open_sweep(path, options, local=local, address=address, say=None if quiet else _say)
    with session:
        say = (lambda line: None) if quiet else (lambda line: print(line, flush=True))
        for line in progress.sweep_auto_lines(session):
            say(line)
        if session.todo:  # the launch sequence `fedray sweep` prints
            launch = SweepLaunch(session, local, verbose)
            for line in launch.header():
                say(line)
            for line in launch.run():  # as each run starts and ends
                say(line)
            launch.wait(say)
            for line in launch.summary():
                say(line)
    return [result(r.config) for r in session.sweep.runs]


@dataclass
class Tuned:
    """What `fedray.tune` did: each cell's choice (its ``tuned.yaml`` document), where the choices
    went, and for a sweep file the tuned table's runs on test."""

    docs: list[dict[str, Any]]
    tuned: Path  # OUT/tuned.yaml
    config: Path | None = None  # OUT/tune/tuned-config.yaml (a config file): `fedray run` runs it on test
    table: Path | None = None  # OUT/tune/tuned-sweep.yaml (a sweep file), run at its seeds on test
    results: list[RunResult] = field(default_factory=list)  # the tuned table's runs

    @property
    def ok(self) -> bool:
        """Every run of the tuned table finished."""
        return all(r.status == "finished" for r in self.results)


def tune(
    path: str | Path,
    *,
    sets: Iterable[str] = (),
    plugins: Iterable[str] = (),
    output: str | None = None,
    address: str | None = None,
    restart: bool = False,
    quiet: bool = False,
    progress_s: float = 30.0,
) -> list[dict[str, Any]]:
    """`fedray tune FILE` (docs/tuning.md): search each cell of FILE (a config or a sweep file with a
    ``tune:`` block) on Ray Tune, on validation alone, its trials decided from their recorded values
    (the same file and seed, the same choice), and write each cell's choice to ``OUT/tuned.yaml``;
    for a config file, the config at its chosen values to ``OUT/tune/tuned-config.yaml``; for a
    sweep file, then run its seeds at each cell's chosen values on test (``OUT/tune/tuned-sweep.yaml``).
    Returns each cell's choice. An interrupted search goes on where it stopped when called again
    (``restart``: from the start); a second search of the same folder waits for the first. Bad
    input is raised before anything runs; it prints what `fedray tune` prints (the plan, each rung's
    decision, a progress table every ``progress_s`` seconds, the choices), ``quiet``: nothing."""
    from fedray.sweeps.tune_plan import describe_plan, open_plan

    say = None if quiet else _say
    plan = open_plan(path, sets, output, plugins)
    for line in describe_plan(plan) if say else ():
        say(line)
    return launch_tune(plan, address=address, restart=restart, say=say, progress_s=progress_s).docs


def launch_tune(
    plan: Any, *, address: str | None = None, restart: bool = False, say: Say = None, progress_s: float = 30.0
) -> Tuned:
    """The search of a `fedray.sweeps.tune_plan.TunePlan` (opened and checked), then what follows
    from its choices: `fedray tune`'s sequence and `fedray.tune`'s, the one way both run. Connects
    to Ray (``address`` / RAY_ADDRESS, else a local Ray), waits for a search another process is
    running in the same folder, and stops a Ray it started."""
    from actors.driver import connect, disconnect
    from actors.tune import run_cells
    from fedray.storage.lock import SearchLock
    from fedray.sweeps.tune_plan import write_tuned_config, write_tuned_sweep

    started = connect(address, sorted({p for _, c in plan.cells for p in c.plugins}), say)
    try:
        lock = SearchLock(plan.output)
        _wait_for(lock, say)
        try:
            docs = run_cells(plan.cells, plan.spec, restart=restart, say=say, progress_s=progress_s)
        finally:
            lock.release()
        done = Tuned(docs, Path(plan.output) / "tuned.yaml")
        if say:
            say(f"chosen values: {done.tuned}")
        if not plan.seeds:
            done.config = write_tuned_config(plan, docs)
            if say:
                say(f"run it on test: fedray run {done.config}")
            return done
        done.table = write_tuned_sweep(plan, docs)
        if say:
            say(f"the tuned table: {done.table}")
        done.results = sweep(done.table, address=address, restart=restart, quiet=say is None)
        return done
    finally:
        if started:
            disconnect()


def _wait_for(lock: Any, say: Say, poll_s: float = 1.0) -> None:
    """Take ``lock``; while another process holds it, wait (said once)."""
    from fedray.storage.lock import RunLocked, UnsafeLockFile

    said = False
    while True:
        try:
            lock.acquire()
            return
        except UnsafeLockFile:
            raise
        except RunLocked as e:
            if say and not said:
                say(f"{e}: waiting for it to end (Ctrl-C stops waiting; its choices are read then)")
                said = True
            time.sleep(poll_s)
