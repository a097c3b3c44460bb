"""Plots from a results folder: global accuracy against round, one line per setting.

Seeds of one setting are averaged, with a ±1 std band. Needs matplotlib (``pip install
fedray[plot]``); `write_plots` says so instead of failing when it is missing.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.load import load_metrics, load_runs
from analysis.report import partition_label, setting_key


def accuracy_curves(out_dir: str | Path, metric: str = "accuracy") -> pd.DataFrame:
    """Per (experiment, setting, round): mean and std of the global ``metric`` over seeds."""
    m = load_metrics(out_dir)
    m = m[(m["metric"] == metric) & (m["scope"] == "global")]
    runs = load_runs(out_dir)
    if m.empty or runs.empty:
        return pd.DataFrame(columns=["experiment", "label", "round", "mean", "std", "seeds"])
    runs["setting"] = runs["config"].map(setting_key)
    runs["label"] = runs["config"].map(
        lambda c: f"{c['algorithm']} {c['dataset']} {partition_label(c)} N={c['num_clients']}"
    )
    df = m.merge(runs[["run_id", "setting", "label"]], on="run_id")
    g = df.groupby(["experiment", "setting", "label", "round"])["value"]
    return g.agg(mean="mean", std="std", seeds="count").reset_index().fillna({"std": 0.0})


def write_plots(out_dir: str | Path, metric: str = "accuracy") -> list[Path]:
    """One PNG per experiment under ``out_dir/plots/``; returns the files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return []
    curves = accuracy_curves(out_dir, metric)
    written = []
    folder = Path(out_dir) / "plots"
    for exp, ce in curves.groupby("experiment"):
        folder.mkdir(exist_ok=True)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for (_, label), c in ce.groupby(["setting", "label"]):
            seeds = int(c["seeds"].max())
            ax.plot(c["round"], 100 * c["mean"], label=f"{label} ({seeds} seed{'s' if seeds > 1 else ''})")
            ax.fill_between(c["round"], 100 * (c["mean"] - c["std"]), 100 * (c["mean"] + c["std"]), alpha=0.2)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel(f"{metric} (%)")
        ax.set_title(str(exp))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = folder / f"{exp}-{metric}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
