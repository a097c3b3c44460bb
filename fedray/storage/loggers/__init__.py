"""Live loggers (docs/loggers.md): a run's rounds shown while it runs, in TensorBoard, MLflow or Weights &
Biases, or in a logger of your own. `base` holds what a logger is given (`RunInfo`), what it is
(`RunLogger`) and what the loggers share; ``tensorboard_logger``, ``mlflow_logger`` and
``wandb_logger`` are the built-ins, each importing its library only when a logger of its kind starts.
This module holds the registry (`LOGGERS`, `register_logger`, `check_loggers`), `Loggers` (what the
round loop holds: every logger on a thread of its own, so none can fail or slow the run; one that
raises is said once and dropped) and `logger_places` (where a results folder's logs are).

May import: `fedray.config`, `fedray.data`, `fedray.records`, `fedray.storage`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import inspect
import json
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedray.config.coercion import ConfigError, suggest
from fedray.config.notes import say_once
from fedray.records import Record
from fedray.storage.files import write_text_atomic
from fedray.storage.loggers.base import RunInfo, RunLogger, read_state, recorded_rounds, series, state_path

__all__ = [
    "LOGGERS",
    "Loggers",
    "RunInfo",
    "RunLogger",
    "check_loggers",
    "logger_places",
    "register_logger",
    "series",
]

# Seconds `Loggers.end` waits for its loggers to send what they hold and close, all of them together.
END_TIMEOUT_S = 30.0

LOGGERS: dict[str, Callable[[], RunLogger]] = {}


def register_logger(name: str, factory: Callable[[], RunLogger]) -> None:
    """Make ``name`` a logger that config key ``loggers`` (``--logger NAME``) may name: ``factory()``
    (a class, say) makes one per run. A name registered already is refused."""
    if not isinstance(name, str) or not name.strip() or name != name.strip() or "," in name:
        raise ValueError(f"a logger's name is a word without commas or spaces around it, got {name!r}")
    if name in LOGGERS:
        raise ValueError(f"a logger named {name!r} is registered already")
    if not callable(factory):
        raise ValueError(f"logger {name!r}: its factory must be callable (a class), got {factory!r}")
    LOGGERS[name] = factory


def _tensorboard() -> RunLogger:
    from fedray.storage.loggers.tensorboard_logger import TensorBoardLogger

    return TensorBoardLogger()


def _mlflow() -> RunLogger:
    from fedray.storage.loggers.mlflow_logger import MLflowLogger

    return MLflowLogger()


def _wandb() -> RunLogger:
    from fedray.storage.loggers.wandb_logger import WandbLogger

    return WandbLogger()


# the built-ins: name -> (its factory, the package it needs, which fedray's extra of that name installs)
BUILTIN: dict[str, tuple[Callable[[], RunLogger], str]] = {
    "tensorboard": (_tensorboard, "tensorboard"),
    "mlflow": (_mlflow, "mlflow"),
    "wandb": (_wandb, "wandb"),
}
for _name, (_factory, _) in BUILTIN.items():
    register_logger(_name, _factory)


def _installed(package: str) -> bool:
    """Whether ``package`` can be imported, looked up without importing it."""
    if package in sys.modules:
        return True
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def check_loggers(names: Sequence[str]) -> None:
    """Refuse, before anything runs, a logger name that is not registered and a built-in whose library
    is not installed (looked up, not imported): a `ConfigError` naming config key 'loggers', every
    problem at once."""
    problems = []
    for name in dict.fromkeys([names] if isinstance(names, str) else names):
        if name not in LOGGERS:
            problems.append(
                f"config key 'loggers': unknown logger {name!r}{suggest(str(name), sorted(LOGGERS))} "
                f"(registered: {', '.join(sorted(LOGGERS))}); a logger of your own is registered with "
                "fedray.storage.loggers.register_logger in a plug-in (docs/loggers.md)"
            )
        elif name in BUILTIN and LOGGERS[name] is BUILTIN[name][0]:
            package = BUILTIN[name][1]
            if not _installed(package):
                problems.append(
                    f"config key 'loggers': {name} needs the {package} package: pip install 'fedray[{name}]'"
                )
    if problems:
        raise ConfigError.of(problems)


def _said(e: BaseException) -> str:
    """An error on one line, cut at 800 characters (what to do, with two paths in it, stays whole)."""
    text = f"{type(e).__name__}: {' '.join(str(e).split())}"
    return text if len(text) <= 800 else text[:797] + "..."


class _Book:
    """A run's ``OUTPUT/loggers/RUN_ID.json``: each logger's identity and the last round it logged.
    Read where the run goes on; removed at a fresh start; written whole (aside, then renamed) by the
    loggers' threads, one at a time. Also the run's recorded rounds, read once for all its loggers."""

    def __init__(self, info: RunInfo) -> None:
        self.info = info
        self.path = state_path(info.output, info.run_id)
        self.previous: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()  # the file, and the entries written to it
        self._reading = threading.Lock()  # the recorded rounds
        self._rounds: dict[int, list[Record]] | None = None
        try:
            if info.resumed_from > 0 or info.continued:
                self.previous = read_state(info.output, info.run_id)
            elif self.path.is_file():
                self.path.unlink()
        except (OSError, ValueError) as e:
            say_once(
                f"loggers of run {info.run_id}: cannot read or remove {self.path} ({_said(e)}); new logger runs"
            )
        self._entries = dict(self.previous)

    def update(self, name: str, entry: dict[str, Any]) -> None:
        with self._lock:
            self._entries[name] = entry
            text = json.dumps(
                {"run_id": self.info.run_id, "loggers": self._entries}, indent=1, sort_keys=True
            )
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_text_atomic(text + "\n", self.path)
            except (OSError, TypeError, ValueError) as e:
                say_once(
                    f"loggers of run {self.info.run_id}: cannot write {self.path} ({_said(e)}); "
                    "a resumed run may log some rounds again"
                )

    def recorded(self, through: int) -> dict[int, list[Record]]:
        """Rounds 1 .. ``through`` as the run's results hold them ({} where they cannot be read)."""
        with self._reading:
            if self._rounds is None:
                try:
                    self._rounds = recorded_rounds(self.info.output, self.info.run_id, through)
                except Exception as e:  # a damaged or missing results file: the loggers go on without
                    say_once(
                        f"loggers of run {self.info.run_id}: cannot read its earlier rounds ({_said(e)})"
                    )
                    self._rounds = {}
            return self._rounds


def _saved(logger: Any) -> dict[str, Any]:
    saved = getattr(logger, "saved", None)
    return dict(saved()) if callable(saved) else {}


def _takes_ended(logger: Any) -> bool:
    """Whether the logger's ``log_round`` takes ``ended`` (when the round ended, seconds since the
    epoch): the built-ins do; a plug-in's two-argument ``log_round`` is called as before."""
    try:
        params = inspect.signature(logger.log_round).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "ended" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


class _Worker:
    """One logger of a run on a thread of its own, fed through a queue: it is made and started there,
    given each round, then ended. Anything it raises is said once and the logger is dropped."""

    def __init__(self, name: str, factory: Callable[[], RunLogger], info: RunInfo, book: _Book) -> None:
        self.name, self.info, self.book = name, info, book
        self._factory = factory
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.dropped = False
        self.done = threading.Event()
        self.last = 0  # the last round the logger has
        self._timed = False  # whether its log_round takes the time the round ended
        self._thread = threading.Thread(
            target=self._run, name=f"fedray-logger-{name}-{info.run_id}", daemon=True
        )
        self._thread.start()

    def put(self, item: tuple[Any, ...]) -> None:
        if not self.dropped:
            self._queue.put(item)

    def _run(self) -> None:
        logger = None
        try:
            logger = self._factory()
            self._timed = _takes_ended(logger)
            self._start(logger)
            while True:
                item = self._queue.get()
                if item[0] == "end":
                    logger.end(item[1])
                    self._save(logger)
                    break
                self._round(logger, item[1], item[2], item[3])
        except BaseException as e:  # on its own thread: whatever it raises, the run goes on
            self._fail(logger, e)
        finally:
            self.done.set()

    def _start(self, logger: Any) -> None:
        """Start the logger (with what it kept, where the run goes on), then give it the rounds done
        before this attempt that it does not have, from the run's results."""
        goes_on = self.info.resumed_from > 0 or self.info.continued
        before = self.book.previous.get(self.name, {}) if goes_on else {}
        if hasattr(logger, "keep"):  # it keeps what finds its own run before it makes it
            logger.keep = lambda: self._save(logger)
        logger.start(dataclasses.replace(self.info, previous=dict(before)))
        identity = {k: v for k, v in before.items() if k != "last_round"}
        if before and identity == _saved(logger):  # the same logger run goes on
            self.last = int(before.get("last_round", 0))
        if self.last < self.info.resumed_from:
            for rnd, records in self.book.recorded(self.info.resumed_from).items():
                if rnd > self.last:
                    self._log(logger, rnd, records, None)
            self.last = self.info.resumed_from
        self._save(logger)

    def _log(self, logger: Any, rnd: int, records: list[Record], ended: float | None) -> None:
        if self._timed:
            logger.log_round(rnd, records, ended=ended)
        else:
            logger.log_round(rnd, records)

    def _round(self, logger: Any, rnd: int, records: list[Record], ended: float) -> None:
        if rnd <= self.last and not getattr(logger, "replaces_rounds", False):
            return  # logged before the run was stopped, and done again after its checkpoint
        self._log(logger, rnd, records, ended)
        self.last = rnd  # counted logged only now: the logger returns once its tool has the round
        self._save(logger)

    def _save(self, logger: Any) -> None:
        self.book.update(self.name, {**_saved(logger), "last_round": self.last})

    def _fail(self, logger: Any, e: BaseException) -> None:
        self.dropped = True
        say_once(
            f"logger {self.name} of run {self.info.run_id} failed and is off for the rest of the run "
            f"(the run goes on): {_said(e)}"
        )
        self.done.set()  # `Loggers.end` waits no more for it
        if logger is not None:
            with contextlib.suppress(BaseException):  # close what it holds, where it still can
                logger.end("failed")


class Loggers:
    """The loggers of one run, as the round loop holds them: ``log_round`` and ``end`` only hand over
    (each logger runs on a thread of its own, started here), so no logger can fail or slow the run. A
    logger that raises is said once (which, which run, the error) and dropped; the others go on.

    A run that goes on (``info.resumed_from`` = k > 0) continues each logger's own run where
    ``OUTPUT/loggers/RUN_ID.json`` names it: rounds it logged already are not given to it again
    (but to a logger that replaces them, TensorBoard), and rounds up to k it lacks come from the run's
    results. So does a run started again from round 1 after an attempt that made no checkpoint
    (``info.continued``): the rounds it does again are those its tools may have. Where the run is
    started over (--restart, --force) that file is removed and each logger starts a new run."""

    def __init__(self, names: Sequence[str], info: RunInfo, timeout_s: float = END_TIMEOUT_S) -> None:
        self.info = info
        self.timeout_s = timeout_s
        self._ended = False
        self._workers: list[_Worker] = []
        names = list(dict.fromkeys([names] if isinstance(names, str) else names))
        goes_on = info.resumed_from > 0 or info.continued
        if not names and (goes_on or not state_path(info.output, info.run_id).exists()):
            return
        book = _Book(info)
        for name in names:
            factory = LOGGERS.get(name)
            if factory is None:
                say_once(
                    f"logger {name} of run {info.run_id}: no such logger is registered; the run goes on without it"
                )
                continue
            self._workers.append(_Worker(name, factory, info, book))

    @property
    def names(self) -> list[str]:
        """The loggers still logging (not dropped)."""
        return [w.name for w in self._workers if not w.dropped]

    def log_round(self, rnd: int, records: list[Record]) -> None:
        """Hand round ``rnd``'s records (all of them: a logger picks what it shows) to every logger."""
        if self._ended or not self._workers:
            return
        records, ended = list(records), time.time()  # handed over as the round ends
        for w in self._workers:
            w.put(("round", rnd, records, ended))

    def end(self, status: str) -> None:
        """End every logger's run with ``status`` (finished | stopped | failed | interrupted), waiting at most
        ``timeout_s`` for them all; a logger still busy then is said once and left to finish on its own
        (its thread does not keep the process alive). A second call does nothing."""
        if self._ended:
            return
        self._ended = True
        for w in self._workers:
            w.put(("end", status))
        deadline = time.monotonic() + self.timeout_s
        late = [w.name for w in self._workers if not w.done.wait(max(0.0, deadline - time.monotonic()))]
        if late:
            say_once(
                f"logger {', '.join(late)} of run {self.info.run_id} had not finished "
                f"{self.timeout_s:g} s after the run ended; left to finish on its own "
                "(what it had not sent may be missing there)"
            )


def _mlflow_uris(out: Path) -> list[str]:
    """The tracking URIs other than OUTPUT/mlflow.db that the runs of ``out`` logged to."""
    own = f"sqlite:///{(out / 'mlflow.db').resolve()}"
    uris = set()
    for path in sorted((out / "loggers").glob("*.json")) if (out / "loggers").is_dir() else []:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # no MLflow entry, or no file
            uris.add(json.loads(path.read_text())["loggers"]["mlflow"]["tracking_uri"])
    return sorted(str(u) for u in uris if u and u != own)


def _mlflow_store_line(db: Path) -> str:
    """The command that shows the folder's MLflow store, or, where MLflow could not read it (a store
    left half-made by an older fedray), what to do with it."""
    problem = ""
    if _installed("mlflow"):
        from fedray.storage.loggers.mlflow_logger import refuse_store, store_problem

        with contextlib.suppress(Exception):  # the line is a hint: one that cannot be checked is shown
            problem = store_problem(db)
        if problem:
            return f"MLflow: {refuse_store(db, problem)}"
    return f"MLflow: mlflow ui --backend-store-uri sqlite:///{db}"


def logger_places(output: str) -> list[str]:
    """Where the live logs of the results folder ``output`` are, and the command that shows them: a
    line each for TensorBoard, MLflow and W&B where the folder holds theirs (for `fedray report`)."""
    out = Path(output)
    lines = []
    if (out / "tb").is_dir():
        lines.append(f"TensorBoard: tensorboard --logdir {out / 'tb'}")
    if (out / "mlflow.db").is_file():
        lines.append(_mlflow_store_line(out / "mlflow.db"))
    for uri in _mlflow_uris(out):
        server = uri.startswith(("http://", "https://", "databricks"))
        lines.append(f"MLflow: runs at {uri}" + ("" if server else f" (mlflow ui --backend-store-uri {uri})"))
    wandb = out / "wandb"
    if wandb.is_dir() and any(wandb.glob("offline-run-*")):
        lines.append(f"W&B: offline runs in {wandb} (wandb sync {wandb}/offline-run-*)")
    if wandb.is_dir() and any(wandb.glob("run-*")):
        lines.append(f"W&B: runs synced online; their local files in {wandb}")
    return lines
