"""Load a results folder into pandas. Hidden temporary files of a killed writer are skipped."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from fedray.config.keys import ADDED_LATER
from fedray.config.notes import say_once
from fedray.storage.files import DamagedResults, open_whole, read_checked
from fedray.storage.results import (
    ASSIGNMENTS_SCHEMA,
    CLIENTS_SCHEMA,
    METRICS_SCHEMA,
    PARTITION_SCHEMA,
    RUNS_SCHEMA,
    run_state,
)

_SCHEMAS = {
    "metrics": METRICS_SCHEMA,
    "runs": RUNS_SCHEMA,
    "clients": CLIENTS_SCHEMA,
    "assignments": ASSIGNMENTS_SCHEMA,
    "partitions": PARTITION_SCHEMA,
}


def _owner_ok(stem: str, run_id: str, exact: bool = False) -> bool:
    """Whether a file named ``stem`` may hold rows of ``run_id``: its own file (``RUN_ID``), or
    unless ``exact`` (runs/ holds a run's one file) a part of it (``RUN_ID-NNNNNN``, ``RUN_ID-clients``)."""
    rest = stem[len(run_id) :] if stem.startswith(run_id) else None
    if exact:
        return rest == ""
    return rest is not None and (rest in ("", "-clients") or (rest[:1] == "-" and rest[1:].isdigit()))


# A copy of a results file that a sync tool or a file manager made beside it (Google Drive's and
# Dropbox's "RUN_ID (1)", "(conflicted copy ...)", Syncthing's ".sync-conflict-...", "RUN_ID copy",
# "RUN_ID - Copy (2)", an editor's "~" or ".bak"): never a name fedray writes, so never read, said.
_COPY = re.compile(
    r".+?(\s*\((\d+|[^()]*(conflict|copy)[^()]*)\)|\.sync-conflict-.*|( -)? copy( \d+)?( \(\d+\))?|~\d*"
    r"|\.(bak|orig|old))",
    re.IGNORECASE,
)


def conflict_copy(name: str) -> bool:
    """Whether a results file's name (without ``.parquet``) is a copy's that a sync tool or a file
    manager made beside the file (`_COPY`): ``RUN_ID (1)``, ``RUN_ID-000000 (conflicted copy)``."""
    return _COPY.fullmatch(name) is not None


def _not_of(runs: set[str], where: ds.Expression | None) -> ds.Expression | None:
    """``where``, and not a row of ``runs`` (those whose own files are read)."""
    if not runs:
        return where
    apart = ~ds.field("run_id").isin(sorted(runs))
    return apart if where is None else where & apart


def _named(where: ds.Expression | None) -> ds.Expression:
    """``where``, and only rows that name their run (a null run_id is no run's row)."""
    valid = ds.field("run_id").is_valid()
    return valid if where is None else where & valid


# Files a read holds open at once: the parts of a large folder are read this many at a time, under
# the usual limit of 1,024 open files.
OPEN_AT_ONCE = 256

# The columns that tell a table's rows of one run apart: a run's row is counted once, whichever of
# its files holds it (a part copied under another part number once doubled a run's rows). runs/
# needs none: a run has one file there, named by its id.
KEYS = {
    "metrics": ("round", "stage", "scope", "entity", "metric"),
    "assignments": ("round", "stage", "client", "cluster"),
    "clients": ("client",),
    "partitions": ("client", "split", "index", "source"),
}


# A run's one file in a table that has one a run (its name's end after the run id)
_OWN_FILE = {"clients": "-clients", "partitions": ""}


@dataclasses.dataclass
class _Held:
    """What a part file's footer says of it: the runs its rows name, how many name none, and the
    rounds it holds (None: unknown, or the table has no rounds)."""

    runs: set[str]
    nameless: int
    rounds: tuple[int, int] | None


def _footer(fragment: ds.Fragment, rounds: bool) -> _Held:
    """`_Held` from each row group's statistics (the run_id column's smallest and largest value and
    its null count, the round column's range); the run_id column itself only where a file has no
    such statistics."""
    meta = fragment.metadata
    names = meta.schema.names
    if "run_id" not in names:  # rows that name no run
        return _Held(set(), meta.num_rows, None)
    run_col = names.index("run_id")
    round_col = names.index("round") if rounds and "round" in names else -1
    found: set[str] = set()
    nameless, lo, hi, known_rounds = 0, None, None, round_col >= 0
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        stats = group.column(run_col).statistics
        if stats is None or not stats.has_null_count:
            break
        nameless += stats.null_count
        if stats.has_min_max:
            found |= {stats.min, stats.max}
        elif stats.null_count < group.num_rows:
            break
        if known_rounds:
            r = group.column(round_col).statistics
            if r is None or not r.has_min_max:
                known_rounds = False
            else:
                lo, hi = (r.min, r.max) if lo is None else (min(lo, r.min), max(hi, r.max))
    else:
        return _Held(found, nameless, (lo, hi) if known_rounds and lo is not None else None)
    column = fragment.to_table(columns=["run_id"]).column("run_id")
    held = _Held(set(column.unique().drop_null().to_pylist()), column.null_count, None)
    if known_rounds:
        r = fragment.to_table(columns=["round"]).column("round")
        if r.null_count < len(r) and len(r):
            held.rounds = (pc.min(r).as_py(), pc.max(r).as_py())
    return held


def _check_owner(path: Path, runs: set[str], exact: bool) -> None:
    """A part file holds rows of the run its name says (``RUN_ID.parquet``, ``RUN_ID-NNNNNN.parquet``,
    ``RUN_ID-clients.parquet``; in runs/ ``RUN_ID.parquet`` alone: ``exact``): a file that holds
    another run's rows (copied over this run's, or renamed) would be counted as this run's; it is
    refused, named. An archive's one file of many runs (`archive`: ``archive.parquet``) holds any."""
    if path.stem == "archive":
        return
    for run_id in sorted(runs):
        if not _owner_ok(path.stem, run_id, exact):
            raise DamagedResults(
                f"results file {str(path)!r} holds rows of run {run_id}, not of the run its name "
                "says (another run's file copied or renamed into its place): move it away, or run "
                "that run again (--restart)"
            )


def _repeats(seen: dict[str, list[tuple[int, int] | None]], held: _Held, rounds: bool) -> bool:
    """Whether a file may hold rows its run's files read before it hold (``seen``: each run's files'
    rounds so far, updated here): where the table has rounds, a file whose rounds overlap an earlier
    file's (a writer's parts follow each other; touching at one round, a flush split there, is
    checked too); else any second file of a run."""
    again = False
    for run in held.runs:
        before = seen.setdefault(run, [])
        if not rounds:
            again |= bool(before)
        elif held.rounds is None or None in before:  # rounds unknown: checked row by row
            again |= bool(before)
        else:
            lo, hi = held.rounds
            again |= any(a <= hi and lo <= b for a, b in before)  # type: ignore[misc]
        before.append(held.rounds)
    return again


def _run_of(stem: str, known: set[str] | None) -> str | None:
    """The run a part file is of, by its name (`_owner_ok`'s: RUN_ID, RUN_ID-NNNNNN, RUN_ID-clients):
    a run the folder's runs/ records (its files there are RUN_ID.parquet), or, where there is no
    runs/ to ask, any; None: a name fedray never writes."""
    if known is not None and stem in known:
        return stem
    prefix = stem.rsplit("-", 1)[0]
    if prefix != stem and _owner_ok(stem, prefix) and (known is None or prefix in known):
        return prefix
    return stem if known is None else None


def _known_runs(table_dir: Path) -> set[str] | None:
    """The run ids the results folder's runs/ records (its files' names, and an archive's rows)."""
    runs = table_dir.parent / "runs"
    if not runs.is_dir():
        return None
    known = {
        p.stem
        for p in runs.glob("*.parquet")
        if not p.name.startswith((".", "_")) and p.stem != "archive" and not conflict_copy(p.stem)
    }
    return known | _archived_runs(runs)


def _archived_runs(table_dir: Path) -> set[str]:
    """The runs a table's archive file holds rows of (none where it has no archive)."""
    archive = table_dir / "archive.parquet"
    if not archive.is_file():
        return set()
    return set(read_checked(archive, ["run_id"]).column(0).drop_null().to_pylist())


def _some(names: list[str]) -> str:
    return f"{', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"


def _read_files(
    files: list[Path],
    schema: pa.Schema | None,
    where: ds.Expression | None,
    fmt: ds.FileFormat,
    keys: tuple[str, ...] | None = None,
    exact: bool = False,
) -> pa.Table | None:
    """``files``' rows that ``where`` keeps, each file's owner checked (`_check_owner`; ``exact``:
    runs/), rows that name no run left out, and with ``keys`` (the columns that tell a run's rows
    apart, `KEYS`) each row of a run once, however many of its files hold it (`_once`). Each file
    is opened once and read through that handle (`open_whole`): a part its writer replaces
    meanwhile reads as it was when opened (a report read during a sweep failed, before), and one its
    writer removed since it was listed (a run started over, or cut back to its checkpoint) is left
    out (None: every one of them was). The files are read together, in one dataset a few hundred at
    a time (fast: thousands of parts); only one that may repeat rows read before it (`_repeats`, from
    the footers: a copied part's rounds overlap its original's), or that holds nameless rows, is
    read apart."""
    rounds = keys is not None and "round" in keys
    seen: dict[str, list[tuple[int, int] | None]] = {}
    tables: list[pa.Table] = []
    again: list[tuple[Path, pa.Table]] = []  # files that may repeat rows read before them
    nameless: list[str] = []
    for group in (files[i : i + OPEN_AT_ONCE] for i in range(0, len(files), OPEN_AT_ONCE)):
        with contextlib.ExitStack() as held:
            opened = []
            for p in group:
                with contextlib.suppress(FileNotFoundError):
                    opened.append((p, held.enter_context(open_whole(p))))
            if not opened:
                continue
            fragments = [(p, fmt.make_fragment(f)) for p, f in opened]
            schema = schema or fragments[0][1].physical_schema
            together = []
            for p, fragment in fragments:
                if "run_id" not in schema.names:
                    together.append(fragment)
                    continue
                footer = _footer(fragment, rounds)
                _check_owner(p, footer.runs, exact)
                repeats = keys is not None and p.stem != "archive" and _repeats(seen, footer, rounds)
                if footer.nameless:
                    nameless.append(p.name)
                if not (footer.nameless or repeats):
                    together.append(fragment)
                    continue
                table = fragment.to_table(schema=schema, filter=_named(where))
                if repeats:
                    again.append((p, table))
                else:
                    tables.append(table)
            if together:
                tables.append(ds.FileSystemDataset(together, schema, fmt).to_table(filter=where))
    if nameless:
        say_once(
            f"{files[0].parent}: {_some(nameless)} hold rows that name no run (run_id null): those rows "
            "are not read"
        )
    if not tables and not again:
        return None
    table = pa.concat_tables(tables) if tables else again[0][1].slice(0, 0)
    if again and keys is not None:
        table = _once(table, again, keys)
    return table


def _once(table: pa.Table, again: list[tuple[Path, pa.Table]], keys: tuple[str, ...]) -> pa.Table:
    """``table`` with the rows of each file of ``again`` (in order) that no file read before holds
    (``keys`` and run_id tell rows apart): a part copied under another part number is read once,
    said in one note naming it. A row another file holds with other values is `DamagedResults`
    naming the file: which of them is the run's, the reader cannot tell."""
    key = ["run_id", *keys]
    repeated = []
    for path, part in again:
        runs = part.column("run_id").unique()
        earlier = table.filter(pc.is_in(table.column("run_id"), value_set=runs))
        if "round" in keys and part.num_rows:
            lo, hi = pc.min(part.column("round")).as_py(), pc.max(part.column("round")).as_py()
            r = earlier.column("round")
            earlier = earlier.filter(pc.and_(pc.greater_equal(r, lo), pc.less_equal(r, hi)))
        if not earlier.num_rows or not part.num_rows:
            table = pa.concat_tables([table, part])
            continue
        new, old = part.to_pandas(), earlier.to_pandas().drop_duplicates(key)
        new["_row"] = range(len(new))
        both = new.merge(old, on=key, how="left", suffixes=("", " earlier"), indicator=True)
        hit = both["_merge"] == "both"
        if hit.any():
            for col in (c for c in old.columns if c not in key):
                a, b = both.loc[hit, col], both.loc[hit, f"{col} earlier"]
                same = (a == b).astype("boolean").fillna(False) | (a.isna() & b.isna())
                if not same.all():
                    first = both.loc[hit][~same.to_numpy(dtype=bool)].iloc[0]
                    where_ = ", ".join(f"{k} {first[k]}" for k in keys if k in ("round", "metric", "client"))
                    raise DamagedResults(
                        f"results file {str(path)!r} holds rows of run {first['run_id']} ({where_}) that "
                        f"another of its files holds with another {col}: one of them is not the run's (a "
                        "copy of an earlier attempt's file?): move it away, or run that run again (--restart)"
                    )
            repeated.append(path.name)
        keep = both.loc[~hit, "_row"].to_numpy()
        table = pa.concat_tables([table, part.take(pa.array(keep, pa.int64()))])
    if repeated:
        say_once(
            f"{again[0][0].parent}: {_some(repeated)}: rows that another file of the same run holds too (a "
            "copy under another part number?): each row is read once"
        )
    return table


def _parts(path: Path, known: set[str] | None) -> list[Path]:
    """The table's files fedray wrote (a run's parts of a run ``known`` holds, and an archive's one
    file of many runs), said once for what else lies there (a copy named otherwise, a sync tool's
    conflict copy, would be read as more rows of its run); an archive's rows of a run that has its
    own files are left to those (`_read_dir`)."""
    found = sorted(p for p in path.iterdir() if p.suffix == ".parquet" and not p.name.startswith((".", "_")))
    own, others = [], []
    for p in found:
        named = p.stem == "archive" or (not conflict_copy(p.stem) and _run_of(p.stem, known) is not None)
        (own if named else others).append(p)
    if others:
        written = "RUN_ID.parquet" if path.name == "runs" else "RUN_ID.parquet, RUN_ID-NNNNNN.parquet"
        say_once(
            f"{path}: {_some([p.name for p in others])} not read (fedray writes {written} and archive.parquet "
            "there; a copy named otherwise, a sync tool's conflict copy among them, would count its rows twice)"
        )
    return own


def _read_dir(path: Path, where: ds.Expression | None = None) -> pd.DataFrame | None:
    if not path.is_dir():
        return None
    known = None if path.name == "runs" else _known_runs(path)  # a runs/ file names its own run
    parts = _parts(path, known)
    if not parts:
        return None
    # Names starting with "." or "_" (files still being written) are not listed (`_parts`).
    # The table's schema is given, so a file written before a column existed reads it as null.
    schema = _SCHEMAS.get(path.name)
    checked = ds.ParquetFileFormat(
        default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True)
    )
    keys, exact = KEYS.get(path.name), path.name == "runs"
    # each file's run: in runs/ its name (a run id may end in -DIGITS, as a part's name does)
    of = {p: p.stem if exact else _run_of(p.stem, known) or p.stem for p in parts if p.stem != "archive"}
    # a run's own file first (RUN_ID-clients.parquet before a copy of it named as a part): where two
    # files hold the same rows, the later is the one said (`_once`)
    mine = _OWN_FILE.get(path.name)
    own = sorted(of, key=lambda p: (of[p], mine is not None and p.stem != of[p] + mine, p.name))
    runs = set(of.values())
    tables = []
    try:
        for files, kept in ((own, where), ([p for p in parts if p.stem == "archive"], _not_of(runs, where))):
            if files and (table := _read_files(files, schema, kept, checked, keys, exact)) is not None:
                tables.append(table)
    except DamagedResults:
        raise
    except (OSError, pa.ArrowException):
        for part in parts:
            if part.exists():  # one its writer removed meanwhile is not damaged
                read_checked(part)  # names the damaged file
        raise
    if not tables:  # every part was removed by its writer since it was listed
        return None
    if len(tables) == 2 and runs and "run_id" in tables[0].column_names:
        # the archive's rows of runs with their own files: theirs twice
        if twice := runs & _archived_runs(path):
            say_once(
                f"{path}/archive.parquet: {len(twice)} of its runs have their own files here: their rows are "
                "read from those alone"
            )
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    df = table.to_pandas()
    if "source" in df:
        df["source"] = df["source"].fillna("fedray")
    return df


def load_metrics(out_dir: str | Path, scope: str | None = None) -> pd.DataFrame:
    """One tidy table over all runs in ``out_dir`` (docs/output.md#output); empty if nothing was written yet.

    ``scope`` ("global", "cluster", "client") reads only those rows: the filter is applied while
    reading, so per-client rows of large runs never reach memory when only global ones are wanted.
    """
    root = Path(out_dir)
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "does not exist"
        raise FileNotFoundError(f"results folder {str(root)!r} {what}")
    df = _read_dir(root / "metrics", None if scope is None else ds.field("scope") == scope)
    if df is None:
        return pd.DataFrame(
            columns=[
                "run_id",
                "experiment",
                "algorithm",
                "dataset",
                "partition",
                "model",
                "seed",
                "source",
                "round",
                "stage",
                "scope",
                "entity",
                "metric",
                "value",
                "elapsed",
            ]
        )
    return df.sort_values(["run_id", "round", "metric", "scope", "entity"], kind="stable").reset_index(
        drop=True
    )


def load_runs(out_dir: str | Path) -> pd.DataFrame:
    """One row per run with status, parsed config and summary columns. A config key added after a
    run was recorded reads as the value that means "as before" (`fedray.config.ADDED_LATER`), so the
    run groups with later runs of the same setting."""
    root = Path(out_dir)
    df = _read_dir(root / "runs")
    if df is None:
        return pd.DataFrame(columns=["run_id", "status", "config", "summary"])
    df["config"] = df["config"].map(lambda text: {**ADDED_LATER, **json.loads(text)})
    df["summary"] = df["summary"].map(json.loads)
    # A run recorded as running whose writer is gone (killed, machine rebooted) was interrupted.
    running = df["status"] == "running"
    df.loc[running, "status"] = [run_state(root, r) for r in df.loc[running, "run_id"]]
    return df.sort_values("run_id").reset_index(drop=True)


def load_events(out_dir: str | Path) -> pd.DataFrame:
    """What happened to each run besides its rounds, one row per event: resumed (from a checkpoint),
    worker_lost (client actors lost; the run went on from its checkpoint), interrupted, failed.
    Columns: run_id, event, round (rounds done at the time), time, detail."""
    runs = load_runs(out_dir)
    rows = [
        {"run_id": r, **e}
        for r, s in zip(runs["run_id"], runs["summary"], strict=True)
        for e in s.get("events", [])
    ]
    return pd.DataFrame(rows, columns=["run_id", "event", "round", "time", "detail"])


def load_clients(out_dir: str | Path) -> pd.DataFrame:
    """Every run's clients: run_id, client, role (train | test), num_train, num_test, group, and
    with FedRC's shift its concept, corruption and severity (a groupby key for per-client metrics)."""
    df = _read_dir(Path(out_dir) / "clients")
    if df is None:
        return pd.DataFrame(
            columns=[
                "run_id",
                "client",
                "role",
                "num_train",
                "num_test",
                "group",
                "concept",
                "corruption",
                "severity",
            ]
        )
    return df.sort_values(["run_id", "client"], kind="stable").reset_index(drop=True)


def load_partitions(out_dir: str | Path) -> pd.DataFrame:
    """Every run's partition: run_id, client, split (train | test), index (into the dataset's
    training set, or its test set where source is test), source, group. `partition: file` reads
    one run's file (``DIR/partitions/RUN_ID.parquet``) back."""
    df = _read_dir(Path(out_dir) / "partitions")
    if df is None:
        return pd.DataFrame(columns=["run_id", "client", "split", "index", "source", "group"])
    return df.reset_index(drop=True)


def load_assignments(out_dir: str | Path) -> pd.DataFrame:
    """Cluster assignments of clustered algorithms: run_id, round, stage, client, cluster, weight."""
    df = _read_dir(Path(out_dir) / "assignments")
    if df is None:
        return pd.DataFrame(columns=["run_id", "round", "stage", "client", "cluster", "weight"])
    return df.sort_values(["run_id", "round", "client", "cluster"], kind="stable").reset_index(drop=True)


ARCHIVED = ("runs", "metrics", "clients", "assignments")


def diverged(run: Any) -> bool:
    """Whether a run (a row of `load_runs`) diverged: fedray stops a run whose numbers turn
    non-finite with a FloatingPointError; an imported reference run that trained on through them
    has a ``diverged_round`` in its summary. A result, not a failure: the fidelity tables count it."""
    summary = run.summary if isinstance(run.summary, dict) else {}
    error = run.error if isinstance(run.error, str) else ""
    return summary.get("diverged_round") is not None or (
        run.status == "failed" and error.startswith("FloatingPointError")
    )


def archive(src: str | Path, dst: str | Path) -> list[str]:
    """Copy what the analysis reads of ``src``'s finished runs, and of its runs that diverged (a
    result: the fidelity tables count them), into ``dst``: their rows of the runs, metrics, clients
    and assignments tables, one Parquet file per table, and their configs. It replaces what ``dst``
    held: a results folder small enough to keep beside the page it backs (no checkpoints, models or
    partitions). A run that failed for another reason, or is unfinished, stays behind. Returns the
    run ids copied."""
    import shutil

    import pyarrow as pa

    from fedray.storage.files import write_atomic

    src, dst = Path(src), Path(dst)
    if not (src / "runs").is_dir():
        raise FileNotFoundError(f"{str(src)!r} is not a results folder (no runs/)")
    finished = [r.run_id for r in load_runs(src).itertuples() if r.status == "finished" or diverged(r)]
    for name in (*ARCHIVED, "configs"):
        shutil.rmtree(dst / name, ignore_errors=True)
    for name in ARCHIVED:
        df = _read_dir(src / name, ds.field("run_id").isin(finished))
        if df is None or df.empty:
            continue
        (dst / name).mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pandas(df.reset_index(drop=True), schema=_SCHEMAS[name], preserve_index=False)
        write_atomic(table, dst / name / "archive.parquet")
    (dst / "configs").mkdir(parents=True, exist_ok=True)
    for run_id in finished:
        if (src / "configs" / f"{run_id}.yaml").exists():
            shutil.copyfile(src / "configs" / f"{run_id}.yaml", dst / "configs" / f"{run_id}.yaml")
    return finished


def layer_gaps(out_dir: str | Path) -> pd.DataFrame:
    """The per-layer gaps of CFL and LayerCFL (metrics ``gap/LAYER`` and ``gap_l2/LAYER``) as a table:
    the metric rows with ``layer`` and ``distance`` (cos | l2) columns, so LayerCFL's layer study
    (its Figs. 5 and 8) is ``layer_gaps(DIR).groupby(["layer", "distance", "round"])["value"]``."""
    m = load_metrics(out_dir, scope="global")
    m = m[m["metric"].str.startswith(("gap/", "gap_l2/"))].copy()
    kind_layer = m["metric"].str.split("/", n=1)
    m["distance"] = kind_layer.str[0].map({"gap": "cos", "gap_l2": "l2"})
    m["layer"] = kind_layer.str[1]
    return m.reset_index(drop=True)
