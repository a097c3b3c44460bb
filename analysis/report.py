"""Paper-style tables from a results folder (pandas over the Parquet files; no fedray or Ray imports).

- `run_values`: one number per run: a global metric at the final round, at a fixed round (counted
  within a stage when one is given: FedConcat's "classifier round 173"), at the round of best
  training accuracy (FedRC's protocol), or its best value.
- `pivot`: runs laid out as the papers do: rows = settings (default dataset + partition), columns =
  algorithms, each cell mean ± std over seeds with the number of seeds. Runs that differ in a key
  the rows and columns do not show (a FedProx mu grid, say) get that key added to their column
  (that column's only: the other algorithms keep their names), so a cell never mixes two settings.
- `format_table`: text, markdown, CSV or LaTeX.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.load import load_metrics, load_runs
from fedray.config.coercion import suggest
from fedray.config.keys import BY_CONTENT, NOT_IN_RUN_ID, PER_RUN_KEYS, TRIAL_KEYS
from fedray.config.run_ids import content_file
from fedray.sweeps.choosing import At, parse_at, ranked, read_at

# Besides the hp.* keys, what `--tuned` picks the best of: the local learning rate (the FedRC paper
# tunes every algorithm's from {0.01, 0.03, 0.06, 0.1}).
TUNED_KEYS = ("lr",)
FORMATS = ("text", "markdown", "csv", "latex")


BETTER = ("higher", "lower")


class ReportError(ValueError):
    """A report option names something the results folder does not have; the message says what it has."""


def better_of(metric: str) -> str | None:
    """Which way ``metric`` improves, where its name tells: "higher" for accuracies and purity,
    "lower" for losses, seconds and bytes; None for the rest (participants, cluster counts, norms,
    a plug-in's own metric), whose best a report must be told (``--better``)."""
    if "accuracy" in metric or metric == "purity":
        return "higher"
    if "loss" in metric or metric.endswith("seconds") or metric.startswith("bytes_"):
        return "lower"
    return None


def better_for(metric: str, better: str | None, why: str) -> str:
    """``better`` (checked), else the way ``metric`` improves (`better_of`); a `ReportError` saying
    so where neither tells, ``why`` naming what needs it."""
    if better is not None:
        if better not in BETTER:
            raise ReportError(f"--better must be one of {', '.join(BETTER)}, got {better!r}")
        return better
    known = better_of(metric)
    if known is None:
        raise ReportError(
            f"{why} needs to know which way metric {metric!r} improves, and its name does not tell "
            "(accuracies and purity: higher; losses, seconds, bytes: lower): add --better higher or "
            "--better lower"
        )
    return known


def partition_label(c: dict, recorded: str | None = None) -> str:
    """The partition as papers write it: #C=2, dirichlet(0.5), ... (each partition's label in the
    partition registry, fedray/data/partitions.py); a federated data set that comes as its clients'
    files (``dataset: client_files``) is partitioned by them: ``files:FOLDER``. A plug-in's partition
    or data set, not registered in this process, reads as the run labelled it (``recorded``: its
    summary's ``partition_label``)."""
    # the registries (imported when a label is needed)
    from fedray.data import DATASETS, PARTITIONS
    from fedray.data import partition_label as label

    if recorded and (c.get("partition") not in PARTITIONS or c.get("dataset") not in DATASETS):
        return recorded
    return label(c)


def recorded_partitions(runs: pd.DataFrame) -> list[str | None]:
    """Each run's partition label as the run wrote it (`partition_label`), from a ``partition_label``
    column (`run_values`) or the runs' summaries (`load_runs`); None for a run that did not."""
    if "partition_label" in runs:
        return [v if isinstance(v, str) else None for v in runs["partition_label"]]
    if "summary" in runs:
        return [sm.get("partition_label") if isinstance(sm, dict) else None for sm in runs["summary"]]
    return [None] * len(runs)


def data_digest(recorded: Any) -> str | None:
    """The SHA-256 over the data files a run read, from its runs/ row's ``data`` (JSON,
    `fedray.data.identity`); None where it recorded none (its dataset reads no files, or it was
    recorded before fedray recorded data)."""
    if not isinstance(recorded, str) or not recorded:
        return None
    try:
        found = json.loads(recorded)
    except ValueError:
        return None
    sha = found.get("sha256") if isinstance(found, dict) else None
    return sha if isinstance(sha, str) else None


def one_partition_file(config: Mapping[str, Any]) -> bool:
    """Whether a run read its partition from a file every seed reads (``partition: file``, a
    ``partition_file`` without ``{seed}``): the seeds of one setting then share one partition."""
    path = config.get("partition_file") or ""
    return config.get("partition") == "file" and bool(path) and "{seed}" not in path


def partition_digest(out_dir: str | Path, run_id: str) -> str | None:
    """The SHA-256 over the clients a run's partition holds, as it wrote them
    (``DIR/partitions/RUN_ID.parquet``: client, split, index, source; the file's bytes apart, so
    another pyarrow's writing of the same clients is the same partition); None where it wrote none."""
    import hashlib

    from fedray.storage.files import read_checked

    path = Path(out_dir) / "partitions" / f"{run_id}.parquet"
    if not path.is_file():
        return None
    rows = read_checked(path, ["client", "split", "index", "source"]).to_pandas()
    return hashlib.sha256(pd.util.hash_pandas_object(rows, index=False).to_numpy().tobytes()).hexdigest()


# A run's inputs that its config names by path alone, told by their content (`run_values`' columns):
# runs of one setting on other data, or on another partition file's content, are other cells.
INPUTS = ("data_sha256", "partition_sha256")


def _inputs(runs: pd.DataFrame) -> list[dict[str, str]]:
    """Each run's `INPUTS` as config-like keys (the digest's first 8 hex digits),
    where it has them: from `run_values`' columns, or a runs table's ``data`` (`load_runs`)."""
    out: list[dict[str, str]] = [{} for _ in range(len(runs))]
    data = (
        runs["data_sha256"]
        if "data_sha256" in runs
        else runs["data"].map(data_digest)
        if "data" in runs
        else [None] * len(runs)
    )
    parts = runs["partition_sha256"] if "partition_sha256" in runs else [None] * len(runs)
    for found, d, p in zip(out, data, parts, strict=True):
        for key, sha in (("data_sha256", d), ("partition_sha256", p)):
            if isinstance(sha, str) and sha:
                found[key] = sha[:8]
    return out


def _plugin_text(spec: str) -> str:
    """A recorded plug-in as a label names it: its file or module name and its source's hash,
    ``fedavgm.py@3f2a9c1b`` (the path apart: the same source elsewhere is the same plug-in)."""
    from fedray.config.plugins import PIN

    name, _, sha = spec.partition(PIN)
    short = name.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    return f"{short}@{sha[:8]}" if sha else short


def flat_config(config: dict) -> dict[str, Any]:
    out = {k: v for k, v in config.items() if k != "hp"}
    if out.get("plugins"):
        out["plugins"] = [_plugin_text(s) for s in out["plugins"]]
    out.update({f"hp.{k}": v for k, v in (config.get("hp") or {}).items()})
    return out


def run_flat(config: dict, hparams: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run's config flattened, with every hp value it used (``hparams``: its summary's, defaults
    included), so an hp left at its default reads as its value, the same as one set to it. An hp
    the algorithm gained after the run was recorded reads as its default (what the run did), as a
    config key added later does (`fedray.config.ADDED_LATER`)."""
    now = _current_hparams(config.get("algorithm"))
    return {f"hp.{k}": v for k, v in {**now, **(hparams or {})}.items()} | flat_config(config)


@functools.cache
def _current_hparams(algorithm: str | None) -> dict[str, Any]:
    """Every hp of a registered algorithm at its default ({} for one not registered here)."""
    from fedray.algorithms import ALGORITHMS

    alg = ALGORITHMS.get(algorithm or "")
    return alg.full_hparams({}) if alg is not None else {}


def value_text(value: Any) -> str:
    """A config value as labels show it: 0.03, true, [1, 2], a string as is."""
    if isinstance(value, float):
        return f"{value:g}"
    return value if isinstance(value, str) else json.dumps(value)


def hp_pairs(config: Mapping[str, Any]) -> list[str]:
    """The config's hp as ``key=value`` texts, sorted by key (what differs from the algorithm's defaults)."""
    return [f"{k}={value_text(v)}" for k, v in sorted((config.get("hp") or {}).items())]


def field_label(config: dict, name: str, partition: str | None = None) -> str:
    """How run ``config`` reads under field ``name``: a config key (hp.x too), `partition` (paper
    style; ``partition``: the label the run recorded, `partition_label`), or `hp` (all of it)."""
    if name == "partition":
        return partition_label(config, partition)
    if name == "source":  # who ran it: fedray, or a reference implementation whose results were imported
        return config.get("source", "fedray")
    if name == "hp":
        return ",".join(hp_pairs(config)) or "-"
    flat = flat_config(config)
    if name not in flat and name.startswith("hp."):  # an hp the run left at its default: that value
        full = run_flat(config, None)
        return value_text(full[name]) if name in full else "-"  # "-": its algorithm has no such hp
    if name not in flat:
        raise ReportError(
            f"unknown field {name!r} for --rows/--cols{suggest(name, ['partition', 'hp', *flat])} "
            f"(fields: partition, hp, and the config keys: {', '.join(sorted(flat))})"
        )
    return value_text(flat[name])


def column_label(config: dict, fields: Sequence[str], partition: str | None = None) -> str:
    """A column's label: its fields' labels joined by spaces. A run at its algorithm's default hp
    says so only when hp is the whole label (``fedavg``, not ``fedavg -``)."""
    labels = [field_label(config, f, partition) for f in fields]
    shown = [lab for f, lab in zip(fields, labels, strict=True) if not (f == "hp" and lab == "-")]
    return " ".join(shown or labels)


def _covered(fields: Sequence[str]) -> set[str]:
    out = set(fields)
    if "partition" in fields:  # and the config keys the paper-style partition label stands for
        from fedray.data import partition_label_keys

        out |= {"partition", *partition_label_keys()}
    return out


# ------------------------------------------------------------------------------------------------
# One value per run
# ------------------------------------------------------------------------------------------------


def _value_at(
    rows: pd.DataFrame, metric: str, at: At, round_: int | None, stage: str | None, better: str = "higher"
) -> tuple[float, float]:
    """(round, value) for one run's global rows (already cut to the stage); NaNs where absent: at
    ``round_``, else read at ``at`` by the rule every chooser shares (`fedray.sweeps.choosing.read_at`:
    best, the first round of the highest value, or with ``better`` lower the lowest)."""
    vals = rows[rows["metric"] == metric].drop_duplicates("round", keep="last").set_index("round")["value"]
    if vals.empty:
        return math.nan, math.nan
    if round_ is not None:
        if stage is None:
            target = round_
        else:  # the R-th round of this stage, counted over every row the stage wrote
            stage_rounds = sorted(rows["round"].unique())
            if round_ > len(stage_rounds):
                return math.nan, math.nan
            target = stage_rounds[round_ - 1]
        return (float(target), float(vals[target])) if target in vals.index else (math.nan, math.nan)
    curve = list(vals.sort_index().items())
    train = None
    # best-train: the round with the best training accuracy among those where the metric exists
    if at.how == "best-train":
        seen = rows[rows["metric"] == "train_accuracy"].drop_duplicates("round", keep="last")
        train = list(seen.set_index("round")["value"].sort_index().items())
    return read_at(curve, at, better, train)


def _short(rows: pd.DataFrame, rounds_done: Any) -> bool:
    """Whether a run's rows stop before the rounds its summary says it did (an earlier fedray could
    record a run finished with rows missing): its last round with rows is then not its final."""
    return isinstance(rounds_done, int) and bool(len(rows)) and int(rows["round"].max()) < rounds_done


def run_values(
    out_dir: str | Path,
    metric: str = "accuracy",
    at: str = "final",
    round: int | None = None,  # noqa: A002 - the option's name
    stage: str | None = None,
    include_unfinished: bool = False,
    better: str | None = None,
) -> pd.DataFrame:
    """One row per run: run_id, status, config, started, round (where the value was read), value,
    in_stage (False for a run read at its final round because it never had ``stage``).

    With ``stage``, ``round`` counts that stage's rounds, and ``at`` looks only within it; runs that
    never had the stage are read at their final round. ``at`` best reads the metric's best value:
    its highest or lowest, as ``better`` says or else its name (`better_of`: a loss's lowest). Only
    finished runs unless ``include_unfinished``. Raises `ReportError` for a metric or stage the
    folder never recorded, and for a best whose direction nothing tells.
    """
    try:
        where = parse_at(at)
    except ValueError as e:
        raise ReportError(f"--at: {e}") from None
    way = better_for(metric, better, "--at best") if where.how == "best" and round is None else "higher"
    if round is not None and round < 1:
        raise ReportError(f"--round must be >= 1, got {round}")
    runs = load_runs(out_dir)
    cols = ["run_id", "status", "config", "started", "hparams", "round", "value", *INPUTS]
    if runs.empty:
        empty = pd.DataFrame(columns=cols)
        empty.attrs.update(left_out=0, left_out_finished=0)
        return empty
    every = load_metrics(out_dir, scope="global")
    # runs that evaluated on validation (tuning's trials) have val_* metrics, the others test's: a
    # table reads one kind (a run that recorded a val_* metric asked for is read, whatever its config
    # says); how many of the other were left out is in attrs["left_out"], of them finished in
    # attrs["left_out_finished"]
    on_val = runs["config"].map(lambda c: c.get("evaluate_on") == "validation")
    if metric.startswith("val_"):
        wanted = on_val | runs["run_id"].isin(set(every.loc[every["metric"] == metric, "run_id"]))
    else:
        wanted = ~on_val
    left_out = int((~wanted).sum())
    left_out_finished = int((runs.loc[~wanted, "status"] == "finished").sum())
    runs = runs[wanted]
    if not include_unfinished:
        runs = runs[runs["status"] == "finished"]
    m = every[every["run_id"].isin(runs["run_id"])]
    if not m.empty and metric not in set(m["metric"]):
        raise ReportError(
            f"metric {metric!r} was not recorded{suggest(metric, set(m['metric']))} "
            f"(global metrics: {', '.join(sorted(set(m['metric'])))})"
        )
    staged: set[str] = set()
    if stage is not None and not m.empty:
        # a stage only unfinished runs have reached so far is no typo: the finished runs without it
        # are read at their final round, as beside a finished staged run
        stages = sorted(set(every["stage"]))
        if stage not in stages:
            named = [s for s in stages if s]  # "" is no stage: the rounds of a run without stages
            raise ReportError(
                f"stage {stage!r} was not recorded"
                + (
                    f"{suggest(stage, named)} (stages: {', '.join(named)})"
                    if named
                    else ": these runs have no stages (FedConcat's are encoder and classifier)"
                )
            )
        staged = set(m.loc[m["stage"] == stage, "run_id"])
        # Runs that have the stage are read within it; the others (FedAvg next to FedConcat) keep
        # all their rows and are read at their final round: the paper's equal-communication table.
        m = m[(m["stage"] == stage) | ~m["run_id"].isin(staged)]
    by_run = dict(tuple(m.groupby("run_id", sort=False)))
    done = {
        r: s.get("rounds_done") if isinstance(s, dict) else None
        for r, s in zip(runs["run_id"], runs["summary"], strict=True)
    }
    read = []
    for r in runs["run_id"]:
        if r not in by_run:
            read.append((math.nan, math.nan))
        elif (
            where.how in ("final", "mean_last")
            and round is None
            and stage is None
            and _short(by_run[r], done[r])
        ):
            # its last rows are missing: no round of it is its final (nor its last K)
            read.append((math.nan, math.nan))
        elif stage is None or r in staged:
            read.append(_value_at(by_run[r], metric, where, round, stage, way))
        else:
            read.append(_value_at(by_run[r], metric, At("final"), None, None))
    if round is not None and by_run and all(math.isnan(v) for _, v in read):
        # a round beyond every run is a question the folder cannot answer (a round some run reached
        # without a value there, under eval_every, is a table of "-")
        reached = max(
            len(g["round"].unique()) if r in staged else int(g["round"].max()) for r, g in by_run.items()
        )
        if round > reached:
            within = f" of stage {stage!r}" if stage is not None else ""
            raise ReportError(f"--round {round}: no run got that far (the furthest: round {reached}{within})")
    out = runs[["run_id", "status", "config", "started"]].copy()
    # every hp value the run used, defaults included (its config names only non-defaults)
    out["hparams"] = [sm.get("hparams", {}) if isinstance(sm, dict) else {} for sm in runs["summary"]]
    out["partition_label"] = recorded_partitions(runs)
    # what the runs read, by content: runs of one setting on other data, or on another content of
    # the one partition file their seeds share, are never seeds of one cell (`label_runs`)
    out["data_sha256"] = [data_digest(t) for t in runs["data"]] if "data" in runs else None
    out["partition_sha256"] = [
        partition_digest(out_dir, r) if one_partition_file(c) else None
        for r, c in zip(runs["run_id"], runs["config"], strict=True)
    ]
    out["round"] = [r for r, _ in read]
    out["value"] = [v for _, v in read]
    out["in_stage"] = out["run_id"].isin(staged) if stage is not None else True
    out = out.reset_index(drop=True)
    out.attrs["left_out"] = left_out
    out.attrs["left_out_finished"] = left_out_finished
    return out


def other_split(metric: str) -> tuple[str, str, str | None]:
    """For a table of ``metric``: the split it reads (test, or validation for a val_* metric), the
    other, and the metric that reads the runs of the other (None where there is none: a metric an
    evaluation does not read, train_accuracy, is not renamed on validation)."""
    from fedray.records import EVALUATED_ON_TEST

    if metric.startswith("val_"):
        plain = metric.removeprefix("val_")
        return "validation", "test", plain if plain in EVALUATED_ON_TEST else None
    return "test", "validation", f"val_{metric}" if metric in EVALUATED_ON_TEST else None


def _setting_key(config: Mapping[str, Any]) -> str:
    """A run's setting and seed, but the keys a search's trials set otherwise than the test runs
    of the settings they tune (`fedray.config.keys.TRIAL_KEYS`: what a run evaluated on, the
    experiment its trials are filed under, EXPERIMENT-tune, and the folder)."""
    return json.dumps({k: v for k, v in config.items() if k not in TRIAL_KEYS}, sort_keys=True, default=str)


def validation_picks(values: pd.DataFrame, validation: pd.DataFrame) -> pd.DataFrame | None:
    """What `--tuned` chooses by where the folder has runs that evaluated on validation: each run's
    value on validation, read from the run of the same setting and seed that evaluated on
    validation (run_values' columns: run_id, value). None where no run on test has such a twin."""
    if validation.empty:
        return None
    twins = dict(zip(validation["config"].map(_setting_key), validation["value"], strict=True))
    picked = values.assign(value=values["config"].map(lambda c: twins.get(_setting_key(c), math.nan)))
    return picked if picked["value"].notna().any() else None


# ------------------------------------------------------------------------------------------------
# The paper-style pivot
# ------------------------------------------------------------------------------------------------


def label_runs(
    runs: pd.DataFrame, rows: Sequence[str], cols: Sequence[str], tuned: bool = False
) -> pd.DataFrame:
    """Add experiment, row and column labels to runs (one row each, with a ``config`` column).

    A key that differs between runs of one (experiment, row, column) other than by seed is added to
    that column's label (in every row of its experiment; other columns keep theirs), so a cell only
    ever holds seeds of one setting. So are the data a run read and the one partition file its seeds
    share, by content (`INPUTS`: ``data_sha256=3f2a9c1b``; a run that recorded none is not
    told apart by it). With ``tuned``, differing ``hp.*`` keys go to a ``setting`` column instead
    (the candidates `pivot` picks the best of).

    A seed a cell holds twice (a partition file edited and the seed run again: another run id, the
    same config) counts once, from the run that started last (``runs`` in the order they started):
    the others are left out, listed in ``attrs["repeats"]`` (`repeats_line` says them).
    """
    df = runs.copy()
    df["experiment"] = df["config"].map(lambda c: c["experiment"])
    recorded = recorded_partitions(df)
    df["row"] = [
        tuple(field_label(c, f, p) for f in rows) for c, p in zip(df["config"], recorded, strict=True)
    ]
    df["col"] = [column_label(c, cols, p) for c, p in zip(df["config"], recorded, strict=True)]
    inputs = _inputs(df)
    covered = _covered([*rows, *cols]) | set(PER_RUN_KEYS) | {"experiment"}
    if "hp" in cols or "hp" in rows:
        covered |= {k for c in df["config"] for k in flat_config(c) if k.startswith("hp.")}
    extra: dict[tuple[str, str], set[str]] = {}  # (experiment, column) -> the keys its label adds
    for (exp, _, col), cell in df.assign(_at=range(len(df))).groupby(
        ["experiment", "row", "col"], sort=False
    ):
        flats = [flat_config(c) | inputs[i] for c, i in zip(cell["config"], cell["_at"], strict=True)]
        keys = {k for f in flats for k in f} - covered

        def differs(k: str, flats: list[dict] = flats) -> bool:
            told = [f[k] for f in flats if k in f] if k in INPUTS else [f.get(k, "<unset>") for f in flats]
            return len({json.dumps(v, sort_keys=True) for v in told}) > 1

        extra.setdefault((exp, col), set()).update(k for k in keys if differs(k))

    def suffix(f: dict, keys: set[str]) -> str:
        """``k=value`` for the keys; an hp value the config leaves at its default is named too."""
        return " ".join(f"{k}={value_text(f[k])}" for k in sorted(keys) if k in f)

    hps = df["hparams"] if "hparams" in df else [{}] * len(df)

    def tunable(exp: str, col: str) -> set[str]:
        return {k for k in extra[exp, col] if k.startswith("hp.") or k in TUNED_KEYS} if tuned else set()

    labels, settings, flats = [], [], []
    for exp, col, c, h, i in zip(df["experiment"], df["col"], df["config"], hps, inputs, strict=True):
        keys, tune = extra[exp, col], tunable(exp, col)
        flats.append(run_flat(c, h) | i)
        labels.append(f"{col} {suffix(flats[-1], keys - tune)}".strip())
        settings.append(suffix(flats[-1], tune))
    df["col"], df["setting"] = labels, settings
    return _counted_once(df, flats)


def _counted_once(df: pd.DataFrame, flats: list[dict[str, Any]]) -> pd.DataFrame:
    """``df`` (labelled, in the order the runs started) with each cell's seed once: of the runs of
    one (experiment, row, column, setting) and seed, the last; the others in ``attrs["repeats"]``,
    each with the run counted and what differs between them (``flats``: each run's `run_flat`)."""
    cells = list(zip(df["experiment"], df["row"], df["col"], df["setting"], strict=True))
    seeds = [c.get("seed") for c in df["config"]]
    last = {(cell, seed): i for i, (cell, seed) in enumerate(zip(cells, seeds, strict=True))}
    repeats = []
    for i, (cell, seed) in enumerate(zip(cells, seeds, strict=True)):
        kept = last[cell, seed]
        if kept != i:
            exp, row, col, setting = cell
            repeats.append(
                {
                    "run_id": df["run_id"].iloc[i],
                    "counted": df["run_id"].iloc[kept],
                    "seed": seed,
                    "cell": " ".join([f"{exp}:", *map(str, row), col, setting]).strip(),
                    "differs": _what_differs(flats[i], flats[kept], df["config"].iloc[i]),
                }
            )
    out = df.iloc[sorted(set(last.values()))] if repeats else df
    out.attrs["repeats"] = repeats
    return out


def _what_differs(a: dict[str, Any], b: dict[str, Any], config: Mapping[str, Any]) -> str:
    """What two runs of one cell and seed differ in, in words: the keys their rows record (`INPUTS`
    too) but those that cannot change a number; else the content of a file the config names by
    path alone (`fedray.config.keys.BY_CONTENT`: their run ids hash it); else nothing recorded (one setting under two
    run ids: the runs recorded by fedray versions that named runs otherwise)."""
    skip = {*NOT_IN_RUN_ID, "experiment"}
    keys = [
        k
        for k in sorted(a.keys() | b.keys())
        if k not in skip and json.dumps(a.get(k), sort_keys=True) != json.dumps(b.get(k), sort_keys=True)
    ]
    if keys:
        return ", ".join(f"{k} ({value_text(a.get(k, '-'))}, then {value_text(b.get(k, '-'))})" for k in keys)
    files = [f"{k} {value_text(config[k])!r}" for k in BY_CONTENT if content_file(config, k) is not None]
    if len(files) == 1:
        return f"the content of {files[0]} (the run id hashes it: the file changed between the runs)"
    if files:
        return f"the content of {' or '.join(files)} (the run id hashes them: one changed between the runs)"
    return "nothing their rows record (one setting under two run ids: recorded by another fedray version?)"


def repeats_line(repeats: Sequence[Mapping[str, Any]]) -> str | None:
    """One line naming the runs a table left out because their seed was run again in their cell
    (`label_runs`' ``attrs["repeats"]``), and what differs; None where there are none."""
    if not repeats:
        return None
    said = [
        f"{r['run_id']} (seed {r['seed']} of {r['cell']}; {r['counted']} counted; they differ in: {r['differs']})"
        for r in repeats[:3]
    ]
    more = f"; and {len(repeats) - 3} more" if len(repeats) > 3 else ""
    n = len(repeats)
    return (
        f"({n} run{'s' if n > 1 else ''} left out: a seed is counted once in its cell, from its latest run: "
        f"{'; '.join(said)}{more})"
    )


def tuned_choice(grid: Mapping[str, tuple[list[float], int]], better: str = "higher") -> str:
    """The best setting of a tuned cell: {setting: (per-seed values, runs that diverged)}, by the
    rule a search ranks its trials by too (`fedray.sweeps.choosing.ranked`). Settings
    with no value (every run diverged, or none read) cannot win. Of the others, only those run with
    the most seeds (values and diverged runs together) compete, so a grid point that one lucky seed
    has reached cannot win over one run in full; among them, those with the fewest diverged runs,
    then the best mean, the highest or with ``better`` lower the lowest (the first listed on a tie).
    A NaN value (a run not read) counts as no seed. A cell where no setting has a value keeps the
    first."""
    if not grid:
        raise ValueError("tuned_choice: no settings")
    names = list(grid)
    return names[ranked([grid[n] for n in names], better)[0]]


def pivot(
    values: pd.DataFrame,
    rows: Sequence[str] = ("dataset", "partition"),
    cols: Sequence[str] = ("algorithm",),
    tuned: bool = False,
    tuned_by: pd.DataFrame | None = None,
    better: str = "higher",
) -> pd.DataFrame:
    """Long table of cells: experiment, row fields..., col, mean, std, n (seeds with a value), runs,
    setting.

    With ``tuned``, runs that differ in hyperparameters (``hp.*``, and ``lr``) share a cell, and the cell shows
    the setting with the best mean over its seeds (the first seen on a tie), as papers report tuned
    baselines; ``setting`` names it ("" where there was nothing to choose). Only the settings with the
    most seeds read (a value, not NaN) compete, so a grid point that one lucky seed has reached cannot
    win over one run in full (`tuned_choice`, which docs/fidelity.md's tuned sections use too, with
    their diverged runs). The choice is made per
    cell, on the value read, so it is only as fair as that value (a test-set choice, as in the papers);
    ``tuned_by`` (`run_values` of another metric) makes it on that reading instead (purity shown at the
    lr each algorithm's accuracy picked). ``better``: which way the choosing reading improves (a
    loss's best mean is its lowest: `better_for`).
    """
    out_cols = ["experiment", *rows, "col", "mean", "std", "n", "runs", "setting"]
    if values.empty:
        return pd.DataFrame(columns=out_cols)
    df = label_runs(values.sort_values("started", kind="stable"), rows, cols, tuned)
    g = df.groupby(["experiment", "row", "col", "setting"], sort=False)["value"]
    cells = g.agg(
        mean="mean", std=lambda v: v.std(ddof=1) if v.count() > 1 else math.nan, n="count", runs="size"
    )
    cells = cells.reset_index()
    if tuned:  # the best setting of each cell (`tuned_choice`, no run counted as diverged here)
        if tuned_by is not None:  # a run not read there counts as no seed
            df["pick"] = df["run_id"].map(tuned_by.set_index("run_id")["value"]).astype(float)
        values = df.groupby(["experiment", "row", "col", "setting"], sort=False)[
            "value" if tuned_by is None else "pick"
        ].agg(list)
        grids: dict[tuple, dict[str, tuple[list[float], int]]] = {}
        for (exp, row, col, setting), v in values.items():
            grids.setdefault((exp, row, col), {})[setting] = (v, 0)
        best = {key: tuned_choice(grid, better) for key, grid in grids.items()}
        keep = [
            best[(e, r, c)] == s
            for e, r, c, s in cells[["experiment", "row", "col", "setting"]].itertuples(index=False)
        ]
        cells = cells[keep].reset_index(drop=True)
    for i, f in enumerate(rows):
        cells[f] = cells["row"].map(lambda r, i=i: r[i])
    cells = cells[out_cols]
    cells.attrs["repeats"] = df.attrs.get("repeats", [])
    return cells


def _is_fraction(metric: str) -> bool:
    return "accuracy" in metric or metric == "purity"


def _cell(mean: float, std: float, n: int, digits: int) -> str:
    if n == 0 or math.isnan(mean):
        return "-"
    if n == 1 or math.isnan(std):
        return f"{mean:.{digits}f} ({n})"
    return f"{mean:.{digits}f} ± {std:.{digits}f} ({n})"


def wide_tables(cells: pd.DataFrame, rows: Sequence[str], metric: str) -> dict[str, pd.DataFrame]:
    """Per experiment: rows x columns of formatted cells ("84.4 ± 0.6 (3)"), in first-seen order."""
    scale, digits = (100.0, 1) if _is_fraction(metric) else (1.0, 4)
    out = {}
    for exp, c in cells.groupby("experiment", sort=False):
        text = [
            _cell(m * scale, s * scale, n, digits)
            for m, s, n in zip(c["mean"], c["std"], c["n"], strict=True)
        ]
        c = c.assign(cell=text)
        wide = c.pivot_table(index=list(rows), columns="col", values="cell", aggfunc="first", sort=False)
        wide = wide.reindex(columns=list(dict.fromkeys(c["col"]))).fillna("-").reset_index()
        wide.columns.name = None
        out[str(exp)] = wide
    return out


def format_table(table: pd.DataFrame, fmt: str) -> str:
    if fmt == "text":
        with pd.option_context("display.max_rows", None, "display.max_columns", None, "display.width", 250):
            return table.to_string(index=False)
    if fmt == "markdown":
        return table.to_markdown(index=False)
    if fmt == "csv":
        return table.to_csv(index=False).rstrip("\n")
    if fmt == "latex":
        return table.to_latex(index=False, escape=True).rstrip("\n")
    raise ReportError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def describe_value(
    metric: str, at: str, round_: int | None, stage: str | None, better: str = "higher"
) -> str:
    unit = " (%)" if _is_fraction(metric) else ""
    read = parse_at(at)
    where = {
        "final": "the final round",
        "best-train": "the round of best train_accuracy",
        "best": f"its best round (its {'highest' if better == 'higher' else 'lowest'} value)",
        "mean_last": f"the mean of its last {read.last} evaluations",
    }[read.how]
    if round_ is not None:
        where = f"round {round_}" + (f" of stage {stage!r}" if stage else "")
    elif stage:
        where += f" of stage {stage!r}"
    return f"{metric}{unit} at {where}; mean ± std over seeds (number of seeds)"
