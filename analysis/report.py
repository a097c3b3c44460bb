"""Paper-style tables from a results folder: final accuracy per run, mean ± std over seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis.load import load_metrics, load_runs

# Keys that tell seeds of one setting apart; runs equal in everything else form one group.
_PER_RUN_KEYS = ("seed", "output")


def setting_key(config: dict) -> str:
    """Everything but the seed (and output folder): runs with equal keys are seeds of one setting."""
    return json.dumps({k: v for k, v in config.items() if k not in _PER_RUN_KEYS}, sort_keys=True)


def final_accuracy(metrics: pd.DataFrame, metric: str = "accuracy") -> pd.DataFrame:
    """Per run: the global ``metric`` at the last round where it was recorded."""
    m = metrics[(metrics["metric"] == metric) & (metrics["scope"] == "global")]
    if m.empty:
        return pd.DataFrame(columns=["run_id", "round", metric])
    last = m.sort_values("round").groupby("run_id", sort=True).tail(1)
    return last[["run_id", "round", "value"]].rename(columns={"value": metric}).reset_index(drop=True)


def report_table(out_dir: str | Path, metric: str = "accuracy") -> pd.DataFrame:
    runs = load_runs(out_dir)
    if runs.empty:
        return pd.DataFrame()
    acc = final_accuracy(load_metrics(out_dir), metric)
    df = runs.merge(acc, on="run_id", how="left")
    df["setting"] = df["config"].map(setting_key)
    df["clients"] = df["config"].map(lambda c: c["num_clients"])
    df["part"] = df["config"].map(partition_label)
    rows = []
    for _, g in df.groupby("setting", sort=False):
        first = g.iloc[0]
        vals = g[metric].dropna() * 100
        rows.append(
            {
                "experiment": first["experiment"],
                "algorithm": first["algorithm"],
                "dataset": first["dataset"],
                "partition": first["part"],
                "clients": int(first["clients"]),
                "seeds": len(g),
                "round": int(g["round"].max()) if g["round"].notna().any() else 0,
                metric: _mean_std(vals),
                "status": ",".join(f"{s}:{n}" for s, n in g["status"].value_counts().sort_index().items()),
            }
        )
    return (
        pd.DataFrame(rows)
        .sort_values(["experiment", "dataset", "partition", "algorithm"])
        .reset_index(drop=True)
    )


def partition_label(c: dict) -> str:
    """The partition as papers write it: #C=2, dirichlet(0.5), ..."""
    p = c["partition"]
    if p == "labels":
        return f"#C={c['partition_k']}"
    if p in ("dirichlet", "quantity", "clientwise_dirichlet"):
        return f"{p}({c['partition_beta']:g})"
    if p == "dominant":
        return f"dominant({c['partition_beta']:g},K={c['partition_clusters']})"
    return p


def _mean_std(vals: pd.Series) -> str:
    if vals.empty:
        return "-"
    if len(vals) == 1:
        return f"{vals.iloc[0]:.1f}"
    return f"{vals.mean():.1f} ± {vals.std(ddof=1):.1f}"
