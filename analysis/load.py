"""Load a results folder into pandas. Hidden temporary files of a killed writer are skipped."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
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


def _owner_ok(stem: str, run_id: str) -> bool:
    rest = stem[len(run_id) :] if stem.startswith(run_id) else None
    return rest is not None and (rest in ("", "-clients") or (rest[:1] == "-" and rest[1:].isdigit()))


def _not_of(runs: set[str], where: ds.Expression | None) -> ds.Expression | None:
    """``where``, and not a row of ``runs`` (those whose own files are read)."""
    if not runs:
        return where
    apart = ~ds.field("run_id").isin(sorted(runs))
    return apart if where is None else where & apart


# Files a read holds open at once: the parts of a large folder are read this many at a time, under
# the usual limit of 1,024 open files.
OPEN_AT_ONCE = 256


def _check_owners(fragments: list[tuple[Path, ds.Fragment]]) -> None:
    """Every part file holds rows of the run its name says (``RUN_ID.parquet``,
    ``RUN_ID-NNNNNN.parquet``, ``RUN_ID-clients.parquet``): a file that holds another run's rows
    (copied over this run's, or renamed) would be counted as this run's; it is refused, named. Read
    from each file's footer (its run_id column's smallest and largest value); the column itself
    only where a file has no such statistics. An archive's one file of many runs (`archive`:
    ``archive.parquet``) holds any."""
    for path, fragment in fragments:
        if path.stem == "archive":
            continue
        meta = fragment.metadata
        column = meta.schema.to_arrow_schema().get_field_index("run_id")
        found: set[str] = set()
        for i in range(meta.num_row_groups):
            stats = meta.row_group(i).column(column).statistics if column >= 0 else None
            if stats is None or not stats.has_min_max:
                found |= set(fragment.to_table(columns=["run_id"]).column("run_id").unique().to_pylist())
                break
            found |= {stats.min, stats.max}
        for run_id in sorted(found):
            if not _owner_ok(path.stem, run_id):
                raise DamagedResults(
                    f"results file {str(path)!r} holds rows of run {run_id}, not of the run its name "
                    "says (another run's file copied or renamed into its place): move it away, or run "
                    "that run again (--restart)"
                )


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
        p.stem for p in runs.glob("*.parquet") if not p.name.startswith((".", "_")) and p.stem != "archive"
    }
    return known | _archived_runs(runs)


def _archived_runs(table_dir: Path) -> set[str]:
    """The runs a table's archive file holds rows of (none where it has no archive)."""
    archive = table_dir / "archive.parquet"
    if not archive.is_file():
        return set()
    return set(read_checked(archive, ["run_id"]).column(0).to_pylist())


def _read_files(
    files: list[Path], schema: pa.Schema | None, where: ds.Expression | None, fmt: ds.FileFormat
) -> pa.Table | None:
    """``files``' rows that ``where`` keeps, each file's owner checked (`_check_owners`). Each file is
    opened once and read through that handle (`open_whole`): a part its writer replaces meanwhile
    reads as it was when opened (a report read during a sweep failed, before), and one its writer
    removed since it was listed (a run started over, or cut back to its checkpoint) is left out
    (None: every one of them was)."""
    tables = []
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
            if "run_id" in schema.names:
                _check_owners(fragments)
            dataset = ds.FileSystemDataset([f for _, f in fragments], schema, fmt)
            tables.append(dataset.to_table(filter=where))
    return pa.concat_tables(tables) if tables else None


def _parts(path: Path, known: set[str] | None) -> list[Path]:
    """The table's files fedray wrote (a run's parts of a run ``known`` holds, and an archive's one
    file of many runs), said once for what else lies there (a copy named otherwise would be read as
    more rows of its run); an archive's rows of a run that has its own files are left to those
    (`_read_dir`)."""
    found = sorted(p for p in path.iterdir() if p.suffix == ".parquet" and not p.name.startswith((".", "_")))
    own = [p for p in found if p.stem == "archive" or _run_of(p.stem, known) is not None]
    if others := [p.name for p in found if p not in own]:
        say_once(
            f"{path}: {', '.join(others[:5])}{' ...' if len(others) > 5 else ''} not read (fedray writes "
            "RUN_ID.parquet, RUN_ID-NNNNNN.parquet and archive.parquet there; a copy named otherwise would "
            "count its rows twice)"
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
    own = [p for p in parts if p.stem != "archive"]
    runs = {_run_of(p.stem, known) for p in own} - {None}
    tables = []
    try:
        for files, kept in ((own, where), ([p for p in parts if p.stem == "archive"], _not_of(runs, where))):
            if files and (table := _read_files(files, schema, kept, checked)) is not None:
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
