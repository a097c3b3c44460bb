"""The results writer (docs/output.md#output): Parquet part files under ``metrics/``, one row per run under ``runs/``.

Every file is written aside under a dot-name and renamed into place, so a killed job leaves only
complete files (readers skip dot-files). A run that starts again under the same run id first
removes the part files of its earlier attempt, so no row is ever counted twice.

A flush rewrites the run's open part file with the new rows added (the whole file again, renamed
over the old one), and a part holding `PART_ROWS` rows is closed: a run that flushes every 10 s for
days leaves a few part files, not one per flush, which every reader would open (a results folder of
40,000 part files took 20 s to load on a laptop, and a shared file system is slower per file).

While a run is being written its writer holds an exclusive lock on ``runs/.RUN_ID.lock`` (flock,
released by the kernel when the process dies, however it dies; the file is removed when the writer
releases it). A second writer of the same run id fails at once instead of deleting the first one's
files, and `run_state` tells a run that is being written now from one that was interrupted. The
lock's path is opened without following links or blocking: a link or FIFO planted there is refused.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import platform
import re
import shutil
import stat
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pyarrow.parquet as pq

from fedray.data import recorded_partition
from fedray.records import Record, is_assignment

# Columns that identify a run; both tables start with them.
_RUN_FIELDS = [
    ("run_id", pa.string()),
    ("experiment", pa.string()),
    ("algorithm", pa.string()),
    ("dataset", pa.string()),
    ("partition", pa.string()),
    ("model", pa.string()),
    ("seed", pa.int64()),
    # who ran it: "fedray", or the reference implementation whose results were imported next to
    # fedray's (jobs/reference/, e.g. "sjtudyq/FedConcat"); files written before it existed read as fedray
    ("source", pa.string()),
]

METRICS_SCHEMA = pa.schema(
    [
        *_RUN_FIELDS,
        ("round", pa.int64()),  # rounds completed when the value was taken (1-based)
        ("stage", pa.string()),
        ("scope", pa.string()),  # global | cluster | client
        ("entity", pa.int64()),  # cluster or client id, -1 for global
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("elapsed", pa.float64()),  # seconds since the run started
    ]
)

ASSIGNMENTS_SCHEMA = pa.schema(
    [
        *_RUN_FIELDS,
        ("round", pa.int64()),  # rounds completed when the assignment was made (0 = before training)
        ("stage", pa.string()),
        ("client", pa.int64()),
        ("cluster", pa.int64()),
        ("weight", pa.float64()),  # 1 for hard assignments; soft ones have a row per cluster
    ]
)

CLIENTS_SCHEMA = pa.schema(
    [
        *_RUN_FIELDS,
        ("client", pa.int64()),
        ("role", pa.string()),  # train | test (FedRC's non-participating test clients)
        ("num_train", pa.int64()),  # the client's training split
        ("num_test", pa.int64()),  # its own test split
        ("group", pa.int64()),  # ground-truth group (partition clusters, the shift's concept), -1 if none
        ("concept", pa.string()),  # the shift's label map (y, C-1-y, (y+1) mod C), "" without shift
        ("corruption", pa.string()),  # the shift's corruption, "" for a clean client
        ("severity", pa.int64()),  # 1..5, 0 for a clean client
    ]
)

# DIR/partitions/RUN_ID.parquet: which samples each client holds (fedray/data/partition_file.py
# reads it back as `partition: file`).
PARTITION_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("client", pa.int64()),
        ("split", pa.string()),  # train | test (the client's own test split)
        ("index", pa.int64()),  # into the dataset's training set (source train) or test set (source test)
        ("source", pa.string()),  # train | test: FedRC's test clients hold the test set
        ("group", pa.int64()),  # ground-truth group where the partition has one, else -1
    ]
)

RUNS_SCHEMA = pa.schema(
    [
        *_RUN_FIELDS,
        ("num_clients", pa.int64()),
        ("rounds", pa.int64()),
        ("status", pa.string()),  # running | finished | failed | interrupted
        ("error", pa.string()),
        ("config", pa.string()),  # resolved config, JSON
        ("summary", pa.string()),  # JSON: final/best accuracy, seconds, placement
        ("versions", pa.string()),  # JSON: python, fedray, torch, ray, numpy, ...
        ("started", pa.timestamp("us", tz="UTC")),
        ("finished", pa.timestamp("us", tz="UTC")),
        # JSON: what its data was (`fedray.data.identity`): the files it read, by their SHA-256;
        # null where its dataset reads no files (or recorded before fedray recorded data)
        ("data", pa.string()),
    ]
)

RUN_COLUMNS = tuple(name for name, _ in _RUN_FIELDS[1:])  # the run_id column is added apart


class DamagedResults(OSError):
    """A results file that does not read back as it was written (a checksum or its structure)."""


def read_checked(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """A Parquet file of the results, its pages' checksums verified (files written before
    checksums were read as they are); a damaged file is a `DamagedResults` naming it."""
    try:
        return pq.read_table(path, columns=columns, page_checksum_verification=True)
    except (OSError, pa.ArrowException) as e:
        raise DamagedResults(f"results file {str(path)!r} is damaged: {e}") from None


def no_space(e: OSError, path: Path) -> OSError:
    """``e`` as said where the disk is full (ENOSPC names no file): the path being written and the
    space left there. Any other error as it is."""
    if e.errno != errno.ENOSPC:
        return e
    try:
        left = f"; {shutil.disk_usage(path.parent).free / 1e6:,.1f} MB free there"
    except OSError:
        left = ""
    return OSError(
        errno.ENOSPC,
        f"no space left on the device writing {path}{left}: free some, then run the same command again "
        "(it goes on from its latest checkpoint)",
    )


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Where ``path`` is being written: a full disk is said naming it (`no_space`)."""
    try:
        yield
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        raise no_space(e, path) from None


def write_atomic(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` via a hidden temporary file, fsync, then rename. Every page
    carries a CRC-32 of its data, which `read_checked` and the analysis readers verify. A write
    that fails (a full disk) leaves no temporary file."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with writing(path), open(tmp, "wb") as f:
            pq.write_table(table, f, write_page_checksum=True)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_synced(text: str, path: Path) -> None:
    """``text`` as ``path``, on the disk when this returns."""
    with writing(path), open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def write_text_atomic(text: str, path: Path) -> None:
    """``path`` holds ``text`` whole or its old contents, never part: written aside, made durable,
    renamed into place, and the rename made durable."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write_text_synced(text, tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    fsync_dir(path.parent)


class UnsafePath(OSError):
    """A path inside the results that fedray did not make as it is (a symbolic link where it makes
    a folder): it is neither followed nor removed; the message names it."""


def refuse_link(path: Path, what: str) -> None:
    """Refuse ``path`` (``what`` says what fedray keeps there) where it is a symbolic link: fedray
    makes none inside its results, and following one would read or remove what it points to."""
    if path.is_symlink():
        raise UnsafePath(
            f"{path}: {what} is a symbolic link (to {os.readlink(path)}), which fedray never makes there; "
            "it neither follows nor removes it: put the folder itself there, or remove the link"
        )


def remove_tree(path: Path, what: str) -> None:
    """Remove a folder fedray made (gone already is fine); a symbolic link is refused, and an error
    names the path."""
    refuse_link(path, what)
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise OSError(f"cannot remove {what} {path}: {e.strerror or e}") from None


def versions() -> dict[str, str]:
    """Versions of Python and the packages a run depends on, read from package metadata (no imports)."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("fedray", "torch", "torchvision", "ray", "numpy", "scikit-learn", "pyarrow", "pandas"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def models_folder(out_dir: str | Path, run_id: str) -> Path:
    """Where run ``run_id`` of results folder ``out_dir`` keeps its trained models: ``models/RUN_ID/``
    (written by `fedray.storage.export.save_models`, read by `analysis.models`)."""
    return Path(out_dir) / "models" / run_id


def check_writable(out_dir: str | Path, create: bool = True) -> None:
    """Raise `OSError` naming the folder if results cannot be written there (checked before anything
    starts: a run that cannot record itself should not run). ``create=False`` (a dry run) leaves
    the disk as it is: the folder, or the nearest folder above it that exists, must be writable."""
    p = Path(out_dir)
    if p.exists() and not p.is_dir():
        raise OSError(f"config key 'output': {str(p)!r} is a file, not a folder for the results")
    try:
        if create:
            p.mkdir(parents=True, exist_ok=True)
        there = p.absolute()
        while not there.exists():  # not made (a dry run): the nearest folder above it that exists
            there = there.parent
        probe = there / f".write-probe-{uuid.uuid4().hex[:8]}"  # made and removed
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        raise OSError(f"config key 'output': cannot write results to {str(p)!r}: {e.strerror or e}") from None


def run_status(out_dir: str | Path, run_id: str) -> str | None:
    """The recorded status of ``run_id`` in ``out_dir``, or None if it never started there."""
    path = Path(out_dir) / "runs" / f"{run_id}.parquet"
    if not path.is_file():
        return None
    return read_checked(path, columns=["status"]).column("status")[0].as_py()


def run_data(out_dir: str | Path, run_id: str) -> dict[str, Any] | None:
    """What ``run_id``'s row in ``out_dir`` records of its data (`fedray.data.identity`); None where
    it records none (its dataset reads no files, or it was written before rows recorded data)."""
    path = Path(out_dir) / "runs" / f"{run_id}.parquet"
    if not path.is_file():
        return None
    table = read_checked(path)
    text = table.column("data")[0].as_py() if "data" in table.column_names else None
    return json.loads(text) if text else None


class RunLocked(RuntimeError):
    """Another live process is writing this run id into this output folder."""


UNSAFE_LOCK = "fedray writes that lock file itself: remove what is there, and see who put it there"


class UnsafeLockFile(RunLocked):
    """Something fedray did not write sits where a run's lock file goes (a symbolic link, a hard
    link to another file, a FIFO): it is refused, never followed, truncated or waited on."""


class RunLock:
    """An exclusive, non-blocking flock on ``DIR/runs/.RUN_ID.lock``; the file holds the owner's pid
    and goes when its owner releases it (a later writer makes a new one).

    The path is opened without following a symbolic link and without blocking, and must be a
    regular file with one link: whatever else is planted there is refused (`UnsafeLockFile`)."""

    def __init__(self, out_dir: str | Path, run_id: str) -> None:
        self.path = Path(out_dir) / "runs" / f".{run_id}.lock"
        self.run_id = run_id
        self._fd: int | None = None

    def _open(self, flags: int) -> int:
        """The lock file's descriptor, opened without following a link or blocking, checked to be a
        regular file of its own."""
        try:
            fd = os.open(self.path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnsafeLockFile(f"{self.path} is a symbolic link; {UNSAFE_LOCK}") from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            what = "a hard link to another file" if stat.S_ISREG(st.st_mode) else "not a regular file"
            raise UnsafeLockFile(f"{self.path} is {what}; {UNSAFE_LOCK}")
        return fd

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = self._open(os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.read(fd, 64).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise RunLocked(
                    f"run {self.run_id} is being written into {self.path.parent.parent}/ by another process "
                    f"(pid {owner} on this machine); wait for it to end, or use another output folder"
                ) from None
            # Its last owner removes it on release: if that happened between our open and our lock,
            # we hold a file no longer at the path, so open the one there now.
            try:
                if os.path.samestat(os.fstat(fd), os.lstat(self.path)):
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        os.ftruncate(fd, 0)  # a regular file of its own that we hold: ours
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # while still held: nothing is left behind
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None

    def held_elsewhere(self) -> bool:
        """True if some live process holds the lock now. Read-only: a probe with a shared lock on a
        read-only descriptor, so a report over a results folder it cannot write still works."""
        if self._fd is not None:
            return False
        try:
            fd = self._open(os.O_RDONLY)
        except (FileNotFoundError, UnsafeLockFile):
            return False  # no lock, or none fedray wrote (a writer would refuse it): no live writer
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False


def run_parts(out_dir: str | Path, run_id: str, table: str) -> list[Path]:
    """A run's files in ``table``: ``RUN_ID-NNNNNN.parquet`` and ``RUN_ID-clients.parquet``, not
    another run's whose id starts with this one's (``RUN_ID-ref``, a reference's run)."""
    own = re.compile(re.escape(run_id) + r"-(\d+|clients)\.parquet")
    return sorted(p for p in (Path(out_dir) / table).glob(f"{run_id}-*.parquet") if own.fullmatch(p.name))


def run_metric(out_dir: str | Path, run_id: str, metric: str) -> list[tuple[int, float]]:
    """A run's global values of ``metric`` by round, from its own metric files (checked)."""
    got: dict[int, float] = {}
    for path in run_parts(out_dir, run_id, "metrics"):
        t = read_checked(path, ["round", "scope", "metric", "value"]).to_pydict()
        for rnd, scope, name, value in zip(t["round"], t["scope"], t["metric"], t["value"], strict=True):
            if scope == "global" and name == metric:
                got[int(rnd)] = float(value)
    return sorted(got.items())


def run_state(out_dir: str | Path, run_id: str) -> str:
    """What a re-submission should know: new | finished | failed | running (now) | interrupted."""
    status = run_status(out_dir, run_id)
    if status is None:
        return "new"
    if status == "running":
        return "running" if RunLock(out_dir, run_id).held_elsewhere() else "interrupted"
    return status


def failure_text(error: BaseException) -> str:
    """A failed run's recorded error: its type and message, then where it was raised (a client's own
    traceback where the error carries one, `fedray.federation.ClientError`)."""
    where = getattr(error, "remote_traceback", "") or "".join(traceback.format_exception(error))
    return f"{type(error).__name__}: {error}\n{where}"


def record_failure(out_dir: str | Path, run_id: str, config: dict[str, Any], error: str) -> None:
    """Record ``run_id`` as failed when it failed before its own writer could (e.g. its actors never
    fit the cluster). Leaves a run that a live process is writing, or that recorded itself, alone."""
    if run_state(out_dir, run_id) in ("new", "interrupted"):
        ResultsWriter(out_dir, run_id, config)._write_run("failed", error=error)


def mark_ended(
    out_dir: str | Path, run_id: str, status: str, rounds_done: int, detail: str, wait_s: float = 10.0
) -> bool:
    """Record a run as ``interrupted`` (stopped from outside: Ctrl-C, ``ray job stop``) or
    ``failed``, with the round reached, when its writer died before it could (a Ray coordinator is
    killed, not asked). Only a ``running`` row that no live process holds is changed; returns
    whether it was."""
    path = Path(out_dir) / "runs" / f"{run_id}.parquet"
    if run_status(out_dir, run_id) != "running":
        return False
    # A killed writer's lock goes with its process, which may take a moment to exit.
    lock, deadline = RunLock(out_dir, run_id), time.monotonic() + wait_s
    while lock.held_elsewhere():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    if run_status(out_dir, run_id) != "running":
        return False
    row = read_checked(path).to_pylist()[0]
    summary = json.loads(row["summary"] or "{}")
    ev = {
        "event": status,
        "round": rounds_done,
        "time": _now().isoformat(timespec="seconds"),
        "detail": detail,
    }
    summary["events"] = [*summary.get("events", []), ev]
    row.update(
        status=status,
        error=f"{status} after {rounds_done} of {row['rounds']} rounds ({detail})",
        summary=json.dumps(summary, sort_keys=True),
        finished=_now(),
    )
    write_atomic(pa.Table.from_pylist([row], schema=RUNS_SCHEMA), path)
    return True


# Rows a part file takes before the writer opens the next one: its rows stay in the writer's memory
# (about 15 MB at 100,000 rows) and each flush rewrites it (about 20 ms at 100,000 rows).
PART_ROWS = 100_000


class ResultsWriter:
    """The only writer of a run's results. Buffers metric rows and flushes them into part files."""

    def __init__(
        self, out_dir: str | Path, run_id: str, config: dict[str, Any], flush_every_s: float = 10.0
    ) -> None:
        self.root = Path(out_dir)
        self.run_id = run_id
        self.config = config
        self.flush_every_s = flush_every_s
        self._rows: list[dict[str, Any]] = []
        self._assignments: list[dict[str, Any]] = []
        self._seq = 0  # the open part files' number (metrics and assignments alike)
        self._open: dict[str, pa.Table] = {}  # by table: the rows its open part file holds
        self._last_flush = time.monotonic()
        self._t0 = time.monotonic()
        self._started = _now()
        self._const = {k: config[k] for k in RUN_COLUMNS if k != "source"}
        self._const["partition"] = recorded_partition(config)
        self._const["source"] = config.get("source", "fedray")
        self._lock = RunLock(out_dir, run_id)
        self.events: list[dict[str, Any]] = []
        # What the row said when `acquire` took the lock (None: no earlier attempt), and its summary.
        self.earlier_status: str | None = None
        self.earlier_summary: dict[str, Any] = {}
        # What its data is (`fedray.data.identity`), written into its row: the earlier attempt's
        # until the run says what it reads now (`_Run.start`)
        self.data: dict[str, Any] | None = None

    # --- lifecycle --------------------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the run's lock (before anything of an earlier attempt is read or touched), and keep
        the earlier attempt's start time, events, status and summary: a run that goes on is the same
        run."""
        if self._lock._fd is not None:
            return
        self._lock.acquire()
        path = self.root / "runs" / f"{self.run_id}.parquet"
        if path.is_file():
            row = read_checked(path).to_pylist()[0]
            self._started = row["started"] or self._started
            self.earlier_status = row["status"]
            self.earlier_summary = json.loads(row["summary"] or "{}")
            self.events = list(self.earlier_summary.get("events", []))
            self.data = json.loads(row["data"]) if row.get("data") else None

    def release(self) -> None:
        self._lock.release()

    def start(self, keep_through: int | None = None) -> None:
        """Begin writing. An earlier attempt's rows are removed, all of them, or with ``keep_through``
        (a run resumed from its checkpoint after that many rounds) those of later rounds only."""
        for sub in ("metrics", "assignments", "clients", "runs", "configs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.acquire()
        if keep_through is None:  # from the start: a new run, whatever an earlier attempt did
            self._started, self.events = _now(), []
            for table in ("metrics", "assignments", "clients"):
                for old in self._parts(table):
                    old.unlink()
            # and the models a finished earlier attempt saved (`--force`): until this run finishes
            # it has none, as its row says. Moved aside whole first, so none is ever left half removed.
            models = models_folder(self.root, self.run_id)
            refuse_link(models, "the run's models folder")
            if models.exists():
                aside = models.with_name(f".{self.run_id}.{uuid.uuid4().hex[:8]}.old")
                os.replace(models, aside)
                remove_tree(aside, "the earlier attempt's models")
        else:
            self._seq = max(
                self._truncate("metrics", keep_through), self._truncate("assignments", keep_through)
            )
        import yaml

        write_text_atomic(
            yaml.safe_dump(self.config, sort_keys=False), self.root / "configs" / f"{self.run_id}.yaml"
        )
        self._write_run("running")

    def _parts(self, table: str) -> list[Path]:
        return run_parts(self.root, self.run_id, table)

    def tidy(self) -> list[Path]:
        """Remove what a killed writer of this run left aside (its hidden ``.tmp`` files, a models
        folder written or moved aside): called under the run's lock, so none is being written.
        Returns what was removed."""
        own = re.compile(
            rf"\.{re.escape(self.run_id)}(-\d+|-clients)?(\.parquet|\.yaml)?\.[0-9a-f]{{8}}\.(tmp|old)"
        )
        gone = []
        for sub in ("metrics", "assignments", "clients", "runs", "configs", "partitions", "models"):
            folder = self.root / sub
            for p in folder.iterdir() if folder.is_dir() else ():
                if not own.fullmatch(p.name) or p.is_symlink():
                    continue
                if p.is_dir():
                    remove_tree(p, "a leftover")
                else:
                    p.unlink(missing_ok=True)
                gone.append(p)
        return gone

    def rounds_on_disk(self) -> set[int]:
        """The rounds this run's metric rows on disk are of."""
        return {
            r
            for path in self._parts("metrics")
            for r in read_checked(path, ["round"]).column("round").to_pylist()
        }

    def _truncate(self, table: str, keep_through: int) -> int:
        """Drop rows of rounds after ``keep_through`` from this run's part files; returns the next
        free part number."""
        seq = 0
        for path in self._parts(table):
            suffix = path.stem.removeprefix(f"{self.run_id}-")
            if suffix.isdigit():
                seq = max(seq, int(suffix) + 1)
            part = read_checked(path)
            rounds = part.column("round").to_pylist()
            if not rounds or max(rounds) <= keep_through:
                continue
            if min(rounds) > keep_through:
                path.unlink()
            else:
                kept = pa.compute.less_equal(part.column("round"), keep_through)
                write_atomic(part.filter(kept), path)
        return seq

    def event(self, kind: str, rounds_done: int, detail: str = "") -> dict[str, Any]:
        """Note what happened to the run (resumed, worker_lost, interrupted, failed); the events go
        into the summary of its row in ``runs/`` (`analysis.load.events` reads them)."""
        ev = {
            "event": kind,
            "round": rounds_done,
            "time": _now().isoformat(timespec="seconds"),
            "detail": detail,
        }
        self.events.append(ev)
        return ev

    def set_elapsed(self, seconds: float) -> None:
        """Go on counting ``elapsed`` from ``seconds`` (a resumed run: from its checkpoint's)."""
        self._t0 = time.monotonic() - seconds

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def add(self, rnd: int, records: Iterable[Record]) -> None:
        elapsed = time.monotonic() - self._t0
        for r in records:
            if is_assignment(r):
                row = {k: v for k, v in r.items() if k != "kind"}
                self._assignments.append({**self._const, "run_id": self.run_id, "round": rnd, **row})
            else:
                self._rows.append(
                    {**self._const, "run_id": self.run_id, "round": rnd, "elapsed": elapsed, **r}
                )
        if time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def write_clients(self, rows: Iterable[dict[str, Any]] | Mapping[str, Any]) -> None:
        """The run's clients (``DIR/clients/``, one file per run): role, sizes, ground truth, shift;
        given as columns (a million clients), or as rows; a column not given is the run's constant,
        or null."""
        if not isinstance(rows, Mapping):
            rows = list(rows)
            rows = {
                f.name: [r.get(f.name) for r in rows]
                for f in CLIENTS_SCHEMA
                if any(f.name in r for r in rows)
            }
        n = len(next(iter(rows.values()), ()))
        const = {**self._const, "run_id": self.run_id}
        cols = {
            f.name: rows[f.name] if f.name in rows else pa.repeat(pa.scalar(const.get(f.name), f.type), n)
            for f in CLIENTS_SCHEMA
        }
        write_atomic(
            pa.table(cols, schema=CLIENTS_SCHEMA), self.root / "clients" / f"{self.run_id}-clients.parquet"
        )

    def write_partition(self, rows: dict[str, Any], train_size: int, dataset: str) -> None:
        """The run's partition (``DIR/partitions/RUN_ID.parquet``): one row per client, split and
        sample index, in each client's order; another run reads it with ``partition: file``."""
        from fedray.data.partition_file import DATASET_KEY, TRAIN_SIZE_KEY

        n = len(rows["index"])
        cols = {
            "run_id": [self.run_id] * n,
            **{k: rows[k] for k in ("client", "split", "index", "source")},
            "group": rows.get("group", [-1] * n),
        }
        table = pa.table(cols, schema=PARTITION_SCHEMA).replace_schema_metadata(
            {TRAIN_SIZE_KEY: str(train_size).encode(), DATASET_KEY: dataset.encode()}
        )
        (self.root / "partitions").mkdir(parents=True, exist_ok=True)
        write_atomic(table, self.root / "partitions" / f"{self.run_id}.parquet")

    def flush(self) -> None:
        """Write the buffered rows: each table's open part file is written again with them added,
        and closed (the next flush opens the next number) once it holds `PART_ROWS` rows."""
        self._last_flush = time.monotonic()
        for table, rows, schema in (
            ("metrics", self._rows, METRICS_SCHEMA),
            ("assignments", self._assignments, ASSIGNMENTS_SCHEMA),
        ):
            if rows:
                new = pa.Table.from_pylist(rows, schema=schema)
                held = self._open.get(table)
                # one chunk (a table of a chunk per flush writes 10x slower after 10,000 flushes)
                part = new if held is None else pa.concat_tables([held, new]).combine_chunks()
                write_atomic(part, self.root / table / f"{self.run_id}-{self._seq:06d}.parquet")
                self._open[table] = part
        if any(part.num_rows >= PART_ROWS for part in self._open.values()):
            self._seq += 1
            self._open = {}
        self._rows, self._assignments = [], []

    def finish(self, summary: dict[str, Any], then: Callable[[], None] | None = None) -> None:
        """Record the run as finished; ``then`` runs after that, still under the run's lock (removing
        its checkpoints: no other process may resume from one half removed)."""
        try:
            self.flush()
            self._write_run("finished", summary=summary)
            if then is not None:
                then()
        finally:
            self._lock.release()

    def fail(self, error: str, summary: dict[str, Any] | None = None, status: str = "failed") -> None:
        """Record the run as ``failed`` (an error) or ``interrupted`` (stopped from outside)."""
        try:
            self.flush()
        finally:
            try:
                self._write_run(status, error=error, summary=summary or {})
            finally:
                self._lock.release()

    # --- runs/ ------------------------------------------------------------------------------------
    def write_progress(self, summary: dict[str, Any]) -> None:
        """Rewrite the row of a run still running (a new event, a checkpoint)."""
        self._write_run("running", summary=summary)

    def _write_run(self, status: str, error: str = "", summary: dict[str, Any] | None = None) -> None:
        summary = dict(summary or {})
        if self.events:
            summary["events"] = self.events
        row = {
            "run_id": self.run_id,
            **self._const,
            "num_clients": self.config["num_clients"],
            "rounds": self.config["rounds"],
            "status": status,
            "error": error,
            "config": json.dumps(self.config, sort_keys=True),
            "summary": json.dumps(summary, sort_keys=True),
            "versions": json.dumps(versions(), sort_keys=True),
            "started": self._started,
            "finished": None if status == "running" else _now(),
            "data": None if self.data is None else json.dumps(self.data, sort_keys=True),
        }
        (self.root / "runs").mkdir(parents=True, exist_ok=True)  # a failure recorded before start()
        write_atomic(
            pa.Table.from_pylist([row], schema=RUNS_SCHEMA), self.root / "runs" / f"{self.run_id}.parquet"
        )
