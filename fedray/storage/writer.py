"""The results writer (docs/output.md#output): Parquet part files under ``metrics/``, one row per run under ``runs/``.

Every file is written aside under a dot-name and renamed into place (`fedray.storage.files`), so a
killed job leaves only complete files (readers skip dot-files). A run that starts again under the
same run id first removes the part files of its earlier attempt, so no row is ever counted twice.

A flush rewrites the run's open part file with the new rows added (the whole file again, renamed
over the old one), and a part holding `PART_ROWS` rows is closed: a run that flushes every 10 s for
days leaves a few part files, not one per flush, which every reader would open (a results folder of
40,000 part files took 20 s to load on a laptop, and a shared file system is slower per file).

While a run is being written its writer holds the run's lock (`fedray.storage.lock`).
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute

from fedray.data import recorded_partition
from fedray.records import Record, is_assignment
from fedray.storage.checkpoint import FORMAT_KEY, MANIFEST_FORMAT
from fedray.storage.files import read_checked, refuse_link, remove_tree, write_atomic, write_text_atomic
from fedray.storage.lock import RunLock
from fedray.storage.results import (
    ASSIGNMENTS_SCHEMA,
    CLIENTS_SCHEMA,
    METRICS_SCHEMA,
    PARTITION_SCHEMA,
    RUN_COLUMNS,
    RUNS_SCHEMA,
    models_folder,
    run_parts,
    run_state,
    run_status,
    utc_now,
    versions,
)


def record_failure(out_dir: str | Path, run_id: str, config: dict[str, Any], error: str) -> None:
    """Record ``run_id`` as failed when it failed before its own writer could (e.g. its actors never
    fit the cluster). Leaves a run that a live process is writing, or that recorded itself, alone."""
    if run_state(out_dir, run_id) in ("new", "interrupted", "stopped"):
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
        "time": utc_now().isoformat(timespec="seconds"),
        "detail": detail,
    }
    summary["events"] = [*summary.get("events", []), ev]
    row.update(
        status=status,
        error=f"{status} after {rounds_done} of {row['rounds']} rounds ({detail})",
        summary=json.dumps(summary, sort_keys=True),
        finished=utc_now(),
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
        self._started = utc_now()
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
            self._started, self.events = utc_now(), []
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
            "time": utc_now().isoformat(timespec="seconds"),
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

    def stop(self, note: str, summary: dict[str, Any]) -> None:
        """Record the run as ``stopped`` before its budget, as asked (a search's successive halving):
        every round it ran is in its rows; it goes on from its checkpoint when asked to go further."""
        try:
            self.flush()
            self._write_run("stopped", error=note, summary=summary)
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
        # the checkpoint format this fedray writes: a run's older-format checkpoint is then a relabelled
        # one (`fedray.storage.checkpoint.Checkpoints.latest`), from its first row on
        summary[FORMAT_KEY] = MANIFEST_FORMAT
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
            "finished": None if status == "running" else utc_now(),
            "data": None if self.data is None else json.dumps(self.data, sort_keys=True),
        }
        (self.root / "runs").mkdir(parents=True, exist_ok=True)  # a failure recorded before start()
        write_atomic(
            pa.Table.from_pylist([row], schema=RUNS_SCHEMA), self.root / "runs" / f"{self.run_id}.parquet"
        )
