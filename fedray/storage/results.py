"""The results tables as fedray writes them (docs/output.md#output): their schemas, and what a run's
files say of it (its status, its data, its part files, one metric) without loading the folder.
The writer is `fedray.storage.writer`; the analysis readers (`analysis.load`) read these tables.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import re
import traceback
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from fedray.storage.files import read_checked
from fedray.storage.lock import RunLock

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
        ("status", pa.string()),  # running | finished | stopped | failed | interrupted
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


def utc_now() -> dt.datetime:
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


def read_run_row(out_dir: str | Path, run_id: str) -> dict[str, Any] | None:
    """``run_id``'s row in ``out_dir``'s ``runs/`` as a dict (checked), or None if it never started there."""
    path = Path(out_dir) / "runs" / f"{run_id}.parquet"
    if not path.is_file():
        return None
    return read_checked(path).to_pylist()[0]


def run_data(out_dir: str | Path, run_id: str) -> dict[str, Any] | None:
    """What ``run_id``'s row in ``out_dir`` records of its data (`fedray.data.identity`); None where
    it records none (its dataset reads no files, or it was written before rows recorded data)."""
    path = Path(out_dir) / "runs" / f"{run_id}.parquet"
    if not path.is_file():
        return None
    table = read_checked(path)
    text = table.column("data")[0].as_py() if "data" in table.column_names else None
    return json.loads(text) if text else None


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


def run_metric_names(out_dir: str | Path, run_id: str) -> list[str]:
    """The metrics a run recorded in the global scope, from its own metric files (checked), sorted."""
    names: set[str] = set()
    for path in run_parts(out_dir, run_id, "metrics"):
        t = read_checked(path, ["scope", "metric"]).to_pydict()
        names.update(m for s, m in zip(t["scope"], t["metric"], strict=True) if s == "global")
    return sorted(names)


def run_state(out_dir: str | Path, run_id: str) -> str:
    """What a re-submission should know: new | finished | failed | running (now) | interrupted.

    A writer takes the run's lock before it writes its first row (which may come long after:
    the data and the actors are built first) and lets it go only after its last, so a live lock
    means "running" whatever the row says yet: none, or an earlier attempt's "interrupted" or
    "failed". A "finished" row stands: its writer may still hold the lock while it removes the
    run's checkpoints, and a run finished is not run again without ``--force``. Where no lock is
    held the row is read again: its writer may have ended between the first read and the probe,
    and the row it left is the run's state, not "interrupted"."""
    status = run_status(out_dir, run_id)
    if status != "finished":
        if RunLock(out_dir, run_id).held_elsewhere():
            return "running"
        status = run_status(out_dir, run_id)
    if status is None:
        return "new"
    return "interrupted" if status == "running" else status


def failure_text(error: BaseException) -> str:
    """A failed run's recorded error: its type and message, then where it was raised (a client's own
    traceback where the error carries one, `fedray.federation.ClientError`)."""
    where = getattr(error, "remote_traceback", "") or "".join(traceback.format_exception(error))
    return f"{type(error).__name__}: {error}\n{where}"
