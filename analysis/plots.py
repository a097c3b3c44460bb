"""Plots from a results folder: a global metric against round, laid out like the report's table.

One PNG per experiment; one panel per table row (e.g. per partition), one line per column (e.g.
per algorithm), the mean over seeds with a ±1 std band. With a stage, the x axis counts that
stage's rounds. Needs matplotlib (``pip install fedray[plot]``); `write_plots` says so instead of
failing when it is missing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.load import load_metrics, load_runs
from analysis.report import label_runs
from fedray.config.coercion import count


def accuracy_curves(
    out_dir: str | Path,
    metric: str = "accuracy",
    rows: Sequence[str] = ("dataset", "partition"),
    cols: Sequence[str] = ("algorithm",),
    stage: str | None = None,
    include_unfinished: bool = False,
) -> pd.DataFrame:
    """Per (experiment, row, col, round): mean and std of the global ``metric`` over seeds."""
    out_cols = ["experiment", "row", "col", "round", "mean", "std", "seeds"]
    runs = load_runs(out_dir)
    if not include_unfinished and not runs.empty:
        runs = runs[runs["status"] == "finished"]
    m = load_metrics(out_dir, scope="global")
    m = m[m["run_id"].isin(runs["run_id"])]
    if stage is not None:
        m = m[m["stage"] == stage]
        # the x axis counts the stage's rounds, from 1
        first = m.groupby("run_id")["round"].transform("min")
        m = m.assign(round=m["round"] - first + 1)
    m = m[m["metric"] == metric]
    if m.empty:
        return pd.DataFrame(columns=out_cols)
    labelled = label_runs(runs.sort_values("started", kind="stable"), rows, cols)
    df = m.merge(labelled[["run_id", "experiment", "row", "col"]], on="run_id", suffixes=("_m", ""))
    # Panels and lines in the table's order: the order the runs started (a sweep file's order).
    rank = {k: i for i, k in enumerate(dict.fromkeys([*labelled["row"], *labelled["col"]]))}
    df = df.assign(_r=df["row"].map(rank), _c=df["col"].map(rank)).sort_values(
        ["_r", "_c", "round"], kind="stable"
    )
    g = df.groupby(["experiment", "row", "col", "round"], sort=False)["value"]
    return g.agg(mean="mean", std="std", seeds="count").reset_index().fillna({"std": 0.0})[out_cols]


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(fig: Any, path: Path) -> Path:
    """Write ``fig`` to ``path`` (its folder made) and close it. No version stamp in the PNG: the
    same results give the same bytes, whatever matplotlib wrote them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write_plots(
    out_dir: str | Path,
    metric: str = "accuracy",
    rows: Sequence[str] = ("dataset", "partition"),
    cols: Sequence[str] = ("algorithm",),
    stage: str | None = None,
    include_unfinished: bool = False,
) -> list[Path]:
    """One PNG per experiment under ``out_dir/plots/``; returns the files written."""
    plt = pyplot()
    if plt is None:
        return []
    import matplotlib.ticker

    curves = accuracy_curves(out_dir, metric, rows, cols, stage, include_unfinished)
    scale = 100.0 if "accuracy" in metric else 1.0
    written = []
    folder = Path(out_dir) / "plots"
    for exp, ce in curves.groupby("experiment", sort=False):
        panels = list(dict.fromkeys(ce["row"]))
        ncols = min(len(panels), 3)
        nrows = math.ceil(len(panels) / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 4 * nrows), squeeze=False, sharey=True)
        color = {col: f"C{i % 10}" for i, col in enumerate(dict.fromkeys(ce["col"]))}  # one colour per column
        for ax, panel in zip(axes.flat, panels, strict=False):
            for col, c in ce[ce["row"] == panel].groupby("col", sort=False):
                seeds = int(c["seeds"].max())
                label = f"{col} ({count(seeds, 'seed')})"
                ax.plot(c["round"], scale * c["mean"], color=color[col], label=label)
                low, high = scale * (c["mean"] - c["std"]), scale * (c["mean"] + c["std"])
                ax.fill_between(c["round"], low, high, color=color[col], alpha=0.2)
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
            ax.set_title(" ".join(panel), fontsize=10)
            ax.set_xlabel("round" if stage is None else f"{stage} round")
            ax.set_ylabel(f"{metric}{' (%)' if scale == 100 else ''}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        for ax in list(axes.flat)[len(panels) :]:
            ax.set_visible(False)
        fig.suptitle(str(exp))
        fig.tight_layout()
        suffix = f"-{stage}" if stage else ""
        # the file name from a recorded experiment name: never a path (results written before names
        # were checked may hold one)
        name = re.sub(r"[^A-Za-z0-9._+=#@-]", "_", f"{exp}-{metric}{suffix}").lstrip(".") or "plot"
        written.append(save_figure(fig, folder / f"{name}.png"))
    return written


def write_trial_plots(out_dir: str | Path, cells: Sequence[dict[str, Any]]) -> list[Path]:
    """One PNG per searched cell (``out_dir/plots/trials-CELL.png``): each trial's validation
    metric against round (the mean over its seeds), the chosen trial drawn thick. ``cells``: what
    tuned.yaml records (`fedray.sweeps.tuning.read_tuned`)."""
    plt = pyplot()
    if plt is None or not cells:
        return []
    import matplotlib.ticker

    m = load_metrics(out_dir, scope="global")
    written = []
    for cell in cells:
        metric = cell["metric"]
        rows = m[m["metric"] == metric]
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for i, t in enumerate(cell.get("trial_list", [])):
            curve = rows[rows["run_id"].isin(t["runs"])].groupby("round")["value"].mean()
            curve = curve[
                curve.index <= t.get("rounds", curve.index.max() if len(curve) else 0)
            ]  # as the search read it
            chosen = t["runs"] == cell["chosen_runs"]
            label = ", ".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in t["values"].items()
            )
            ax.plot(
                curve.index,
                curve.values,
                lw=2.5 if chosen else 1.0,
                color=f"C{i % 10}",
                label=label + (" (chosen)" if chosen else ""),
            )
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel(f"{metric} (validation)")
        ax.set_title(
            f"{cell['experiment']} {cell['cell'] or cell['algorithm']}: {len(cell.get('trial_list', []))} trials",
            fontsize=10,
        )
        ax.grid(alpha=0.3)
        if len(cell.get("trial_list", [])) <= 16:
            ax.legend(fontsize=7)
        fig.tight_layout()
        name = re.sub(
            r"[^A-Za-z0-9._+=#@-]", "_", f"trials-{cell['experiment']}-{cell['cell'] or cell['algorithm']}"
        ).lstrip(".")
        written.append(save_figure(fig, Path(out_dir) / "plots" / f"{name[:120]}.png"))
    return written
