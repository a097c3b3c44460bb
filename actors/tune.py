"""A search's runs on Ray Tune (docs/tuning.md).

What to run is decided by `fedray.sweeps.search` from the trials' recorded values alone; this
module runs it. Each step of the cells' searches (every run some cell needs brought to a round) is
one `ray.tune.Tuner` fit: a Tune trial for each launch unit, a run alone or a pack of runs trained
in one stack (`fedray.sweeps.pack`, where their runs share a GPU as a sweep's would), on the
resources one of the run's actors takes (``num_cpus_per_actor``, ``num_gpus_per_actor``, auto
resolved as a sweep resolves it). The unit's runs go in the trial's own process, on the GPU Ray
gave it (else the CPU), each stopping at the round its rung asks (recorded ``stopped``, its rows
and a checkpoint there) or finishing. A trial starts no Ray actor of its own, so it never waits on
its placement group for room it did not reserve (ray-project/ray#25239).

Tune keeps nothing that is read back: its experiment folder is a scratch folder outside the results
folder, removed after each fit, and never restored (a search goes on from its runs' records). The
trials write the results folder from whichever node runs them, so on a cluster of several nodes it
must be a folder every node sees (a shared file system); a trial that does not see it fails at
once, naming the node.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import ray
from ray import tune

from fedray.config.keys import Config
from fedray.progress import duration
from fedray.storage.loggers.base import write_setting
from fedray.sweeps.search import CellSearch, Outcome, Work
from fedray.sweeps.tuning import TuneError, TuneSpec

Say = Callable[[str], None] | None

# Ray Tune's own lines (its trial tables, its errors with their tracebacks, its advice on restoring):
# the search prints its own, and a trial's failure is said once, in a line naming the run
TUNE_LOGGERS = ("ray.tune", "ray.train", "ray.air")


# ------------------------------------------------------------------------------------------------
# In the trial's process
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UnitRun:
    """One run of a launch unit as the trial gets it: its config, whether it starts over, and the
    round it stops at (None: its budget) and why."""

    config: dict[str, Any]
    restart: bool
    stop_at: int | None
    stopped_by: str


def sees_folder(marker: str) -> str | None:
    """Why this process cannot write the search's results folder (None: it can): the search puts a
    file there that a trial on another node, without a shared file system, does not see."""
    if Path(marker).is_file():
        return None
    node = ray.util.get_node_ip_address()
    return (
        f"a trial on node {node} does not see the results folder {Path(marker).parent.parent}/ (no "
        f"{Path(marker).name} there, which the search wrote): on a cluster of several nodes, give "
        "--output a folder every node mounts (a shared file system)"
    )


def _unit(
    config: dict[str, Any], *, units: list[list[UnitRun]], marker: str, plugins: dict[str, str]
) -> None:
    """Tune's trainable: the launch unit ``config["unit"]``, its runs in this process on the device
    Ray gave it. Every round is reported (``run``, ``round``); a run that fails is recorded failed by
    its own writer and reported (``run``, ``error``), never raised (its traceback is in its row)."""
    from actors.client_actor import assigned_device
    from fedray.config.plugins import activate
    from fedray.experiment.checks import from_dict
    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import RoundDone, Started, execute
    from fedray.federation.host import set_torch_threads
    from fedray.sweeps.pack import Ended, execute_pack

    runs = units[config["unit"]]
    if refusal := sees_folder(marker):
        tune.report({"unit_error": refusal})
        return
    cfgs = [from_dict(r.config) for r in runs]
    activate(cfgs[0].plugins, where=f"a tune trial on node {ray.util.get_node_ip_address()}", expect=plugins)
    threads = set_torch_threads(cfgs[0].num_cpus_per_actor)
    device = assigned_device()
    gpus = [str(g) for g in ray.get_gpu_ids()]

    def make(cfg: Config, data: Any, **kw: Any) -> Any:
        fed, placement = make_local_federation(
            cfg, data, device=device, num_threads=threads, cpus=cfg.num_cpus_per_actor, **kw
        )
        placement.update(mode="tune trial", device=device, gpu_ids=gpus)
        return fed, placement

    def report(k: int, ev: Any) -> None:
        run_id = cfgs[k].run_id()
        if isinstance(ev, RoundDone):
            tune.report({"run": run_id, "round": ev.round})
        elif isinstance(ev, Started):
            tune.report({"run": run_id, "round": ev.resumed_from, "device": device, "gpu_ids": gpus})
        elif isinstance(ev, Ended) and ev.error is not None:
            tune.report({"run": run_id, "error": _one_line(ev.error)})

    if len(runs) == 1:
        r = runs[0]
        try:
            for ev in execute(cfgs[0], make, r.restart, stop_at=r.stop_at, stopped_by=r.stopped_by):
                report(0, ev)
        except Exception as e:  # noqa: BLE001 - recorded by the run's writer; said by the search
            report(0, Ended(e))
        return
    stops = [(r.stop_at, r.stopped_by) for r in runs]
    for k, ev in execute_pack(cfgs, make, [r.restart for r in runs], "", stops):
        report(k, ev)


def _one_line(error: BaseException) -> str:
    """An error as one line: its type and the last line of its message (a client's error names its
    client there)."""
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}".strip()


# ------------------------------------------------------------------------------------------------
# In the driver
# ------------------------------------------------------------------------------------------------


@dataclass
class Watch:
    """What the driver knows of the step in flight, from the trials' reports, and the progress
    table it prints every ``every_s`` seconds."""

    searches: list[CellSearch]
    say: Say
    every_s: float
    began: float = field(default_factory=time.monotonic)
    live: dict[str, int] = field(default_factory=dict)  # run id -> the round it reported last
    errors: dict[str, str] = field(default_factory=dict)  # run id -> its error, as reported
    unit_errors: list[str] = field(default_factory=list)
    reported: int = 0  # rounds reported since the search began (its pace)
    started: set[int] = field(default_factory=set)  # units of the step in flight that began
    ended: set[int] = field(default_factory=set)  # ... that ended
    units: int = 0  # the step's units
    last: float = field(default_factory=time.monotonic)

    def step(self, units: int) -> None:
        self.units, self.started, self.ended = units, set(), set()

    def result(self, unit: int, result: dict[str, Any]) -> None:
        self.started.add(unit)
        if "unit_error" in result:
            self.unit_errors.append(result["unit_error"])
        run = result.get("run")
        if run is None:
            return
        if "error" in result:
            self.errors[run] = result["error"]
        elif "round" in result:
            before = self.live.get(run)
            self.live[run] = int(result["round"])
            if before is not None and int(result["round"]) > before:
                self.reported += int(result["round"]) - before

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.say is None or (not force and now - self.last < self.every_s):
            return
        self.last = now
        for line in self.table():
            self.say(line)

    def table(self) -> list[str]:
        """The search now: each cell's rung and trials, the best so far; trial-rounds spent of the
        planned, the pace and what is left at it."""
        done = planned = 0
        lines = []
        for s in self.searches:
            d, p = s.progress(self.live)
            done, planned = done + d, planned + p
            lines.append(f"  {s.label.strip() or 'search'}: {s.describe_now()}")
        elapsed = time.monotonic() - self.began
        pace = self.reported / elapsed if elapsed > 0 else 0.0
        left = planned - done
        eta = f", about {duration(left / pace)} left" if pace > 0 and left > 0 else ""
        units = (
            f"; this step {len(self.started - self.ended)} trial(s) running, {len(self.ended)} done, "
            f"{self.units - len(self.started | self.ended)} waiting"
            if self.units
            else ""
        )
        head = (
            f"tune [{time.strftime('%H:%M:%S')}]: {done} of {planned} trial-rounds ({100 * done / max(planned, 1):.0f}%)"
            f"{units}; {pace:.2f} rounds/s{eta}"
        )
        return [head, *lines]


# The Watch of the fit in flight, by key: Tune keeps its callbacks with its experiment (pickled into
# the scratch folder), so the callback holds the key, not the Watch (a lock, a print function).
_WATCHES: dict[str, Watch] = {}


class _Reports(tune.Callback):
    def __init__(self, key: str) -> None:
        self.key = key

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        _WATCHES[self.key].started.add(trial.config["unit"])

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        _WATCHES[self.key].result(trial.config["unit"], result)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        _WATCHES[self.key].ended.add(trial.config["unit"])

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        _WATCHES[self.key].ended.add(trial.config["unit"])


def _units(works: Sequence[Work]) -> list[list[int]]:
    """The step's runs (indices into ``works``) in launch units: packed where a sweep would pack
    them (`fedray.sweeps.pack.pack_groups`), else alone."""
    from fedray.sweeps.pack import pack_groups

    return pack_groups([w.config for w in works])


def _resources(cfg: Config) -> tune.PlacementGroupFactory:
    """What a unit's trial reserves: one of its runs' actors (its CPUs and GPU share)."""
    bundle = {"CPU": cfg.num_cpus_per_actor}
    if cfg.num_gpus_per_actor > 0:
        bundle["GPU"] = cfg.num_gpus_per_actor
    return tune.PlacementGroupFactory([bundle])


def run_step(works: Sequence[Work], spec: TuneSpec, watch: Watch, marker: str) -> None:
    """Bring every run of ``works`` to its round, on Ray Tune; raises `TuneError` naming the first
    trial that failed, and KeyboardInterrupt when the fit was stopped (Ctrl-C) before its end."""
    from fedray.config.plugins import digest

    groups = _units(works)
    units = [
        [UnitRun(works[i].config.to_dict(), works[i].restart, works[i].until, works[i].stopped_by) for i in g]
        for g in groups
    ]
    first = [works[g[0]].config for g in groups]
    plugins = {p: digest(p) for p in sorted({p for w in works for p in w.config.plugins})}
    trainable = tune.with_resources(
        partial(_unit, units=units, marker=marker, plugins=plugins),
        lambda config: _resources(first[config["unit"]]),
    )
    # Tune's console (its configuration box, its trial tables, where its results are): its old
    # reporter, which verbose=0 silences; the lines are the search's own
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    key = uuid.uuid4().hex
    _WATCHES[key] = watch
    watch.step(len(units))
    scratch = tempfile.mkdtemp(prefix="fedray-tune-")
    # the progress table on a clock of its own: Tune's loop turns only as trials report, and a round
    # of a large model may take minutes
    fitted = threading.Event()
    ticker = threading.Thread(target=_ticking, args=(watch, fitted), daemon=True)
    ticker.start()
    levels = {name: logging.getLogger(name).level for name in TUNE_LOGGERS}
    for name in TUNE_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # Tune catches Ctrl-C during a fit itself (it stops the trials, then returns) and puts the
    # handler back only when it caught one: the handlers are put back here after every fit, and a
    # handler back before that says the fit was stopped
    handlers = {sig: signal.getsignal(sig) for sig in CAUGHT if _main_thread()}
    try:
        tuner = tune.Tuner(
            trainable,
            param_space={"unit": tune.grid_search(list(range(len(units))))},
            tune_config=tune.TuneConfig(
                num_samples=1,
                max_concurrent_trials=spec.max_concurrent_trials or None,
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name="step",
                storage_path=scratch,
                verbose=0,
                callbacks=[_Reports(key)],
                stop=_StopAll(key),
                failure_config=tune.FailureConfig(max_failures=0),
            ),
        )
        grid = tuner.fit()
        caught = bool(handlers) and not int(os.getenv("TUNE_DISABLE_SIGINT_HANDLER", "0"))
        stopped = caught and signal.getsignal(signal.SIGINT) is handlers[signal.SIGINT]
    except BaseException:  # SIGTERM (the CLI raises KeyboardInterrupt for it) inside Tune's loop, or a bug
        _mark_interrupted(works, watch, wait_s=2.0)
        raise
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        fitted.set()
        ticker.join()
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        _WATCHES.pop(key, None)
        shutil.rmtree(scratch, ignore_errors=True)
    if stopped or len(watch.ended) < len(units):
        _mark_interrupted(works, watch)
        if not watch.unit_errors:
            raise KeyboardInterrupt(f"{len(units) - len(watch.ended)} of {len(units)} trials unfinished")
    if watch.unit_errors:
        raise TuneError(watch.unit_errors[0])
    failed = [(r, groups[r.config["unit"]]) for r in grid if r.error is not None]
    if failed:
        _mark_interrupted(works, watch)
        result, group = failed[0]
        runs = ", ".join(f"{works[i].trial} (run {works[i].run_id})" for i in group)
        raise TuneError(f"the trial of {runs} failed: {_one_line(result.error)}")
    for w in works:  # a run's own failure, as it reported it (a diverged run is a result, not a failure)
        error = watch.errors.get(w.run_id)
        if error and not error.startswith("FloatingPointError"):
            raise TuneError(
                f"trial {w.trial} (run {w.run_id}) failed: {error} (its traceback: {w.config.output}/runs/, "
                "fedray report)"
            )


# the signals Tune takes over during a fit (SIGUSR1 too, where there is one)
CAUGHT = (signal.SIGINT, *((signal.SIGUSR1,) if hasattr(signal, "SIGUSR1") else ()))


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _ticking(watch: Watch, fitted: threading.Event) -> None:
    """The progress table every ``watch.every_s`` until the fit ends; a table that cannot be made
    (a results file being rewritten as it is read) is said once, and the search goes on without it."""
    while not fitted.wait(1.0):
        try:
            watch.tick()
        except Exception as e:  # noqa: BLE001 - the table is a view: it never stops a search
            if watch.say:
                watch.say(
                    f"tune: the progress table stops here ({type(e).__name__}: {e}); the search goes on"
                )
            return


class _StopAll(tune.Stopper):
    """Ends the fit at once when a trial cannot run at all (it does not see the results folder):
    every other trial would fail the same way."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, trial_id: str, result: dict) -> bool:
        return "unit_error" in result

    def stop_all(self) -> bool:
        watch = _WATCHES.get(self.key)
        return bool(watch and watch.unit_errors)


def _mark_interrupted(works: Sequence[Work], watch: Watch, wait_s: float = 10.0) -> None:
    """Runs whose trial was stopped from outside (its process ended, not asked): recorded
    interrupted at the round they reported, as a sweep records its stopped runs (a run still
    held by a live process after ``wait_s`` is left to it: its row reads interrupted once it is
    gone, `fedray.storage.results.run_state`)."""
    from fedray.storage.writer import mark_ended

    for w in works:
        mark_ended(
            w.config.output,
            w.run_id,
            "interrupted",
            watch.live.get(w.run_id, 0),
            "the search was stopped",
            wait_s=wait_s,
        )


def _absolute(cfg: Config) -> Config:
    """The config with its paths absolute: a trial runs in a worker whose working folder is Tune's."""

    def absolute(p: str) -> str:
        return str(Path(p).resolve()) if p and not Path(p).is_absolute() and Path(p).exists() else p

    return replace(
        cfg,
        output=str(Path(cfg.output).resolve()),
        data_root=absolute(cfg.data_root),
        partition_file=absolute(cfg.partition_file),
        init_model=absolute(cfg.init_model),
    )


def resolve_cell(cell: Config) -> Config:
    """A cell as its trials run it: paths absolute, ``num_gpus_per_actor: auto`` resolved on the
    connected Ray as a sweep's run resolves it (its trials' run ids depend on it)."""
    from actors.driver import auto_gpus

    cell = _absolute(cell)
    return cell.with_gpus(auto_gpus(cell.num_cpus_per_actor)) if cell.gpus_auto else cell


# Tracebacks a trial's worker prints as Ray stops it, from code that is neither the trial's nor the
# search's: (the exception that ends the block, a line of the block that marks it)
EXIT_NOISE = (
    ("SystemExit", "in sigterm_handler"),  # Ray's SIGTERM handler, raising inside a finalizer
    ("ConnectionResetError", "teardown_atexit"),  # W&B's exit hook, its service already gone
)


def _without_worker_exits(lines: Sequence[str]) -> list[str]:
    """A trial worker's forwarded lines less the tracebacks of its stop (`EXIT_NOISE`): a worker
    stopped after its fit may get its SIGTERM inside a finalizer, and Python then prints the
    SystemExit that Ray's handler raised ("Exception ignored in ... sigterm_handler ... SystemExit:
    1"); W&B's exit hook, run after its service process was stopped with the worker, prints its lost
    connection. Every other line, tracebacks included, is kept as it came."""
    kept: list[str] = []
    block: list[str] = []
    for line in lines:
        if not block and not line.startswith(("Exception ignored in", "Traceback (most recent call last)")):
            kept.append(line)
            continue
        block.append(line)
        ends = line.strip() and not line[:1].isspace() and len(block) > 1 and not line.startswith("Traceback")
        if ends:  # the exception's own line ends the block
            noise = any(line.startswith(end) and any(mark in b for b in block) for end, mark in EXIT_NOISE)
            if not noise:
                kept.extend(block)
            block = []
    kept.extend(block)  # a block cut between two batches is kept whole
    return kept


class _QuietWorkerExits:
    """While a search runs, the driver prints its workers' lines through `_without_worker_exits`
    (Ray's log dispatcher; where a Ray release moves it, the lines come as Ray prints them)."""

    def __enter__(self) -> _QuietWorkerExits:
        self.swapped: list[tuple[str, Callable]] = []
        try:
            from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
        except ImportError:
            return self
        if not hasattr(dispatcher, "_lock") or not hasattr(dispatcher, "handlers"):
            return self
        self.dispatcher = dispatcher
        with dispatcher._lock:
            for k, (name, handle) in enumerate(dispatcher.handlers):
                if name == "ray_print_logs":
                    self.swapped.append((name, handle))
                    dispatcher.handlers[k] = (name, partial(_filtered, handle))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.swapped:
            with self.dispatcher._lock:
                originals = dict(self.swapped)
                self.dispatcher.handlers = [
                    (name, originals.get(name, h)) for name, h in self.dispatcher.handlers
                ]


def _filtered(handle: Callable, data: dict[str, Any]) -> None:
    lines = _without_worker_exits(data.get("lines", []))
    if lines:
        handle({**data, "lines": lines})


def search_cells(
    cells: Sequence[tuple[str, Config]],
    spec: TuneSpec,
    *,
    restart: bool = False,
    say: Say = None,
    progress_s: float = 30.0,
    on_outcome: Callable[[int, Outcome], None] | None = None,
) -> list[Outcome | None]:
    """Every cell's search on the connected Ray, side by side: each step brings every run some cell
    waits on to its round in one fit, then each cell decides its next step from its runs' records.
    ``on_outcome(i, outcome)`` is told each cell's outcome as it is made. Returns the outcomes in the
    cells' order (None for a cell with nothing to search)."""
    out = Path(cells[0][1].output).resolve()
    marker = out / "tune" / f".search-{uuid.uuid4().hex[:12]}"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{os.getpid()}\n")
    searches = {
        i: CellSearch(
            resolve_cell(cell),
            spec.for_algorithm(cell.algorithm),
            restart=restart,
            label=f"[{i + 1}/{len(cells)} {label}] " if len(cells) > 1 else "",
            say=say,
        )
        for i, (label, cell) in enumerate(cells)
        if spec.for_algorithm(cell.algorithm).search  # a cell with nothing to search runs as it is
    }
    watch = Watch(list(searches.values()), say, progress_s)
    where = f"search in {out.name}"  # a search's trials fold under it in MLflow
    parents = {i: f"{where} {label}" if len(cells) > 1 else where for i, (label, _) in enumerate(cells)}
    steps: dict[int, Iterator[list[Work]]] = {i: s.steps() for i, s in searches.items()}
    outcomes: dict[int, Outcome | None] = dict.fromkeys(range(len(cells)))
    waiting: dict[int, list[Work]] = {}
    with _QuietWorkerExits():
        try:

            def advance(i: int, first: bool) -> None:
                try:
                    waiting[i] = next(steps[i]) if first else steps[i].send(None)
                except StopIteration as stop:
                    outcomes[i] = stop.value
                    waiting.pop(i, None)
                    if on_outcome is not None:
                        on_outcome(i, stop.value)

            for i in list(steps):
                advance(i, True)
            while waiting:
                # each run once a step (cells never share one: `fedray.sweeps.tune_plan` refuses it)
                works = list({w.run_id: w for i in sorted(waiting) for w in waiting[i]}.values())
                for i in sorted(waiting):  # a live logger shows each trial as one run of its search
                    for w in waiting[i]:
                        if w.config.loggers:
                            write_setting(w.config.output, w.run_id, w.trial, parents[i])
                run_step(works, spec, watch, str(marker))
                for i in sorted(waiting):
                    advance(i, False)
                watch.tick(force=bool(waiting))
        finally:
            marker.unlink(missing_ok=True)
    return [outcomes[i] for i in range(len(cells))]


def run_cells(
    cells: Sequence[tuple[str, Config]],
    spec: TuneSpec,
    *,
    restart: bool = False,
    say: Say = None,
    progress_s: float = 30.0,
) -> list[dict[str, Any]]:
    """Every cell's search (`search_cells`), each cell's choice written to ``OUT/tuned.yaml`` as
    it is made (`fedray.sweeps.tuning.tuned_document`: the same file and seed, the same bytes).
    Returns the cells' documents, in their order."""
    from fedray.sweeps.tuning import merged_tuned, tuned_document, write_tuned

    out = cells[0][1].output
    keys = [(cfg.experiment, label) for label, cfg in cells]
    docs: dict[int, dict[str, Any]] = {}

    def chosen(i: int, outcome: Outcome) -> None:
        label, cell = cells[i]
        docs[i] = tuned_document(label, cell, spec.for_algorithm(cell.algorithm), outcome)
        write_tuned(out, merged_tuned(out, keys, docs))

    outcomes = search_cells(cells, spec, restart=restart, say=say, progress_s=progress_s, on_outcome=chosen)
    for i, outcome in enumerate(outcomes):
        if outcome is None:
            label, cell = cells[i]
            docs[i] = tuned_document(label, cell, spec.for_algorithm(cell.algorithm), None)
    write_tuned(out, merged_tuned(out, keys, docs))
    return [docs[i] for i in range(len(cells))]


__all__ = ["resolve_cell", "run_cells", "run_step", "search_cells", "sees_folder"]
