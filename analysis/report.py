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
from fedray.config.keys import NOT_IN_RUN_ID

# Keys that tell replicates of one setting apart or cannot change a number (fedray.config.NOT_IN_RUN_ID),
# and where the work ran (CPUs and GPUs per actor, and whether the run trained packed with other runs:
# at most the last bits of a float sum, as another machine would): runs that differ only there are
# seeds of one cell, never columns of their own.
_PER_RUN_KEYS = ("seed", *NOT_IN_RUN_ID, "num_cpus_per_actor", "num_gpus_per_actor", "pack_runs")
AT = ("final", "best-train", "best")
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
    rows: pd.DataFrame, metric: str, at: str, round_: int | None, stage: str | None, better: str = "higher"
) -> tuple[float, float]:
    """(round, value) for one run's global rows (already cut to the stage); NaNs where absent. ``at``
    best: the first round of the highest value, or with ``better`` lower the lowest."""
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
    if at == "final":
        r = vals.index.max()
    elif at == "best":
        r = vals.idxmax() if better == "higher" else vals.idxmin()
    else:  # best-train: the round with the best training accuracy among those where the metric exists
        train = (
            rows[rows["metric"] == "train_accuracy"].drop_duplicates("round", keep="last").set_index("round")
        )
        train = train["value"].reindex(vals.index).dropna()
        if train.empty:
            return math.nan, math.nan
        r = train.idxmax()  # the first round with the best value
    return float(r), float(vals[r])


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
    if at not in AT:
        raise ReportError(f"--at must be one of {', '.join(AT)}, got {at!r}")
    way = better_for(metric, better, "--at best") if at == "best" and round is None else "higher"
    if round is not None and round < 1:
        raise ReportError(f"--round must be >= 1, got {round}")
    runs = load_runs(out_dir)
    cols = ["run_id", "status", "config", "started", "hparams", "round", "value"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    # runs that evaluated on validation (tuning's trials) have val_* metrics, the others test's: a
    # table reads one kind; how many of the other were left out is in attrs["left_out"]
    on_val = runs["config"].map(lambda c: c.get("evaluate_on") == "validation")
    wanted = on_val if metric.startswith("val_") else ~on_val
    left_out = int((~wanted).sum())
    runs = runs[wanted]
    if not include_unfinished:
        runs = runs[runs["status"] == "finished"]
    every = load_metrics(out_dir, scope="global")
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
        elif at == "final" and round is None and stage is None and _short(by_run[r], done[r]):
            read.append((math.nan, math.nan))  # its last rows are missing: no round of it is its final
        elif stage is None or r in staged:
            read.append(_value_at(by_run[r], metric, at, round, stage, way))
        else:
            read.append(_value_at(by_run[r], metric, "final", None, None))
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
    out["round"] = [r for r, _ in read]
    out["value"] = [v for _, v in read]
    out["in_stage"] = out["run_id"].isin(staged) if stage is not None else True
    out = out.reset_index(drop=True)
    out.attrs["left_out"] = left_out
    return out


# Config keys that do not make one setting another: what a run evaluated on, and the experiment
# its tuning trials are filed under (EXPERIMENT-tune)
_NOT_A_SETTING = ("evaluate_on", "experiment", "output")


def _setting_key(config: Mapping[str, Any]) -> str:
    return json.dumps(
        {k: v for k, v in config.items() if k not in _NOT_A_SETTING}, sort_keys=True, default=str
    )


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
    ever holds seeds of one setting. With ``tuned``, differing ``hp.*`` keys go to a ``setting``
    column instead (the candidates `pivot` picks the best of).
    """
    df = runs.copy()
    df["experiment"] = df["config"].map(lambda c: c["experiment"])
    recorded = recorded_partitions(df)
    df["row"] = [
        tuple(field_label(c, f, p) for f in rows) for c, p in zip(df["config"], recorded, strict=True)
    ]
    df["col"] = [column_label(c, cols, p) for c, p in zip(df["config"], recorded, strict=True)]
    covered = _covered([*rows, *cols]) | set(_PER_RUN_KEYS) | {"experiment"}
    if "hp" in cols or "hp" in rows:
        covered |= {k for c in df["config"] for k in flat_config(c) if k.startswith("hp.")}
    extra: dict[tuple[str, str], set[str]] = {}  # (experiment, column) -> the keys its label adds
    for (exp, _, col), cell in df.groupby(["experiment", "row", "col"], sort=False):
        flats = [flat_config(c) for c in cell["config"]]
        keys = {k for f in flats for k in f} - covered
        extra.setdefault((exp, col), set()).update(
            k for k in keys if len({json.dumps(f.get(k, "<unset>"), sort_keys=True) for f in flats}) > 1
        )

    def suffix(c: dict, hparams: dict, keys: set[str]) -> str:
        """``k=value`` for the keys; an hp value the config leaves at its default is named too."""
        f = run_flat(c, hparams)
        return " ".join(f"{k}={value_text(f[k])}" for k in sorted(keys) if k in f)

    hps = df["hparams"] if "hparams" in df else [{}] * len(df)

    def tunable(exp: str, col: str) -> set[str]:
        return {k for k in extra[exp, col] if k.startswith("hp.") or k in TUNED_KEYS} if tuned else set()

    labels, settings = [], []
    for exp, col, c, h in zip(df["experiment"], df["col"], df["config"], hps, strict=True):
        keys, tune = extra[exp, col], tunable(exp, col)
        labels.append(f"{col} {suffix(c, h, keys - tune)}".strip())
        settings.append(suffix(c, h, tune))
    df["col"], df["setting"] = labels, settings
    return df


def tuned_choice(grid: Mapping[str, tuple[list[float], int]], better: str = "higher") -> str:
    """The best setting of a tuned cell: {setting: (per-seed values, runs that diverged)}. Settings
    with no value (every run diverged, or none read) cannot win. Of the others, only those run with
    the most seeds (values and diverged runs together) compete, so a grid point that one lucky seed
    has reached cannot win over one run in full; among them, those with the fewest diverged runs,
    then the best mean, the highest or with ``better`` lower the lowest (the first listed on a tie).
    A NaN value (a run not read) counts as no seed. A cell where no setting has a value keeps the
    first."""
    if not grid:
        raise ValueError("tuned_choice: no settings")
    clean = {s: ([x for x in v if not math.isnan(x)], d) for s, (v, d) in grid.items()}
    valued = {s: (v, d) for s, (v, d) in clean.items() if v}
    if not valued:
        return next(iter(grid))
    most = max(len(v) + d for v, d in valued.values())
    full = {s: (v, d) for s, (v, d) in valued.items() if len(v) + d == most}
    fewest = min(d for _, d in full.values())
    scored = [(sum(v) / len(v), s) for s, (v, d) in full.items() if d == fewest]
    best = (max if better == "higher" else min)(m for m, _ in scored)
    return next(s for m, s in scored if m == best)


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
    return cells[out_cols]


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
    where = {
        "final": "the final round",
        "best-train": "the round of best train_accuracy",
        "best": f"its best round (its {'highest' if better == 'higher' else 'lowest'} value)",
    }[at]
    if round_ is not None:
        where = f"round {round_}" + (f" of stage {stage!r}" if stage else "")
    elif stage:
        where += f" of stage {stage!r}"
    return f"{metric}{unit} at {where}; mean ± std over seeds (number of seeds)"
