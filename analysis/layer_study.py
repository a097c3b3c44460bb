"""LayerCFL's layer study (its Figs. 6 to 9) from CFL and LayerCFL runs' own records.

Every CFL/LayerCFL round on a partition with ground-truth groups records the gap of LayerCFL eqs.
21-22 (``gap`` and ``gap_l2`` on the compared layers, ``gap/LAYER`` and ``gap_l2/LAYER`` for every
layer), ``purity`` and ``num_clusters`` (fedray/algorithms/cfl.py). This module reads them back:

- `gap_onset`: rounds until the gap turns positive (the clients' updates separate the groups), per
  distance (Delta-cos and L2, on all layers, which is what CFL/FMTL compare, and on each single
  layer, which is what LayerCFL compares), per data volume per client. It reads the runs that never
  split (``hp.eps1: 0``: one model, FedAvg's updates), since after a split the clients' updates
  start from different models.
- `gaps_at`: the gap of every layer at one round, under each partition (label skew against feature
  skew: which layers separate which).
- `purity_onset`: per splitting run, the first round whose clustering is the ground truth (as many
  clusters as groups, purity 1), and the final purity and cluster count.
- `write_figures`: the three as PNGs; `section` lays them out as markdown for docs/fidelity.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.load import load_clients, load_metrics, load_runs
from analysis.plots import pyplot, save_figure
from analysis.report import field_label

ALL = "all layers"


def _finished(folder: str | Path) -> pd.DataFrame:
    runs = load_runs(folder)
    if runs.empty:
        return runs.assign(partition=[], algorithm=[], size=[], seed=[], never_splits=[])
    runs = runs[runs["status"] == "finished"].copy()
    runs["partition"] = runs["config"].map(lambda c: field_label(c, "partition"))
    runs["algorithm"] = runs["config"].map(_algorithm_label)
    runs["size"] = runs["config"].map(lambda c: int(c.get("partition_size", 0)))
    runs["seed"] = runs["config"].map(lambda c: int(c.get("seed", 0)))
    runs["never_splits"] = runs["config"].map(
        lambda c: float((c.get("hp") or {}).get("eps1", math.nan)) == 0.0
    )
    runs["rounds"] = runs["config"].map(lambda c: int(c["rounds"]))
    return runs


def _algorithm_label(c: Mapping[str, Any]) -> str:
    hp = c.get("hp") or {}
    if c["algorithm"] == "layercfl":
        return f"LayerCFL ({hp.get('layers', 'auto')})"
    return "CFL" if float(hp.get("eps1", 0.4)) != 0.0 else "CFL, never splits"


def _variant(metric: str) -> tuple[str, str]:
    """(distance, layers) of a gap metric: gap -> (Delta-cos, all layers), gap_l2/encoder.fc1 -> (L2, encoder.fc1)."""
    kind, _, layer = metric.partition("/")
    return ("Delta-cos" if kind == "gap" else "L2"), (layer or ALL)


def _gaps(folder: str | Path, runs: pd.DataFrame) -> pd.DataFrame:
    m = load_metrics(folder, scope="global")
    m = m[m["run_id"].isin(runs["run_id"]) & m["metric"].str.match(r"^gap(_l2)?(/|$)")].copy()
    variants = m["metric"].map(_variant)
    m["distance"], m["layers"] = variants.str[0], variants.str[1]
    keep = runs.set_index("run_id")[["partition", "size", "seed", "rounds"]]
    return m.drop(columns=["partition", "seed"]).join(keep, on="run_id")


def gap_onset(folder: str | Path) -> pd.DataFrame:
    """One row per (never-splitting run, distance, layers): ``onset``, the first round whose gap is
    positive (NaN if none within the run's ``rounds``), and ``positive``, how many rounds had a
    positive gap, with the run's partition, size and seed."""
    runs = _finished(folder)
    runs = runs[runs["never_splits"]]
    cols = ["partition", "size", "distance", "layers", "seed", "run_id", "rounds", "onset", "positive"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    g = _gaps(folder, runs)
    rows = []
    for (rid, dist, layers), x in g.groupby(["run_id", "distance", "layers"], sort=False):
        positive = x.loc[x["value"] > 0, "round"]
        first = x.iloc[0]
        rows.append(
            {
                "partition": first["partition"],
                "size": int(first["size"]),
                "distance": dist,
                "layers": layers,
                "seed": int(first["seed"]),
                "run_id": rid,
                "rounds": int(first["rounds"]),
                "onset": float(positive.min()) if len(positive) else math.nan,
                "positive": int(len(positive)),
            }
        )
    return pd.DataFrame(rows, columns=cols)


def gaps_at(folder: str | Path, rounds: int | list[int], size: int | None = None) -> pd.DataFrame:
    """Mean and std over seeds of every gap at each of ``rounds`` in the never-splitting runs (of
    ``size`` samples per client; default: every size), per (partition, size, distance, layers, round)."""
    rounds = [rounds] if isinstance(rounds, int) else list(rounds)
    runs = _finished(folder)
    runs = runs[runs["never_splits"] & ((runs["size"] == size) if size is not None else True)]
    g = _gaps(folder, runs) if not runs.empty else pd.DataFrame()
    if g.empty:
        return pd.DataFrame(
            columns=["partition", "size", "distance", "layers", "round", "mean", "std", "seeds"]
        )
    g = g[g["round"].isin(rounds)]
    out = g.groupby(["partition", "size", "distance", "layers", "round"], sort=False)["value"]
    return out.agg(mean="mean", std="std", seeds="count").reset_index()


def purity_onset(folder: str | Path) -> pd.DataFrame:
    """One row per splitting run: ``onset`` (the first round with as many clusters as ground-truth
    groups and purity 1; NaN if never), the final ``purity`` and ``clusters``, the number of
    ``groups``, and the rounds of the accepted splits."""
    runs = _finished(folder)
    runs = runs[~runs["never_splits"]]
    cols = [
        "partition",
        "algorithm",
        "size",
        "seed",
        "run_id",
        "groups",
        "onset",
        "purity",
        "clusters",
        "splits",
    ]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    m = load_metrics(folder)
    m = m[m["run_id"].isin(runs["run_id"])]
    clients = load_clients(folder)
    rows = []
    for r in runs.itertuples():
        x = m[m["run_id"] == r.run_id]
        groups = clients.loc[
            (clients["run_id"] == r.run_id) & (clients["role"] == "train"), "group"
        ].nunique()
        per_round = x[x["scope"] == "global"].pivot_table(index="round", columns="metric", values="value")
        right = per_round[(per_round["num_clusters"] == groups) & (per_round["purity"] >= 1.0)]
        splits = sorted(x.loc[(x["metric"] == "split") & (x["scope"] == "cluster"), "round"].astype(int))
        last = per_round.iloc[-1]
        rows.append(
            {
                "partition": r.partition,
                "algorithm": r.algorithm,
                "size": r.size,
                "seed": r.seed,
                "run_id": r.run_id,
                "groups": int(groups),
                "onset": float(right.index.min()) if len(right) else math.nan,
                "purity": float(last["purity"]),
                "clusters": int(last["num_clusters"]),
                "splits": splits,
            }
        )
    return pd.DataFrame(rows, columns=cols)


def _mean_cell(values: pd.Series, cap: int | None = None) -> str:
    """'4.3 ± 0.6 (3)'; runs with no value (never) are counted apart: '5.0 (2), never 1'."""
    v = values.dropna()
    never = len(values) - len(v)
    if v.empty:
        text = "never" + (f" (≤ {cap})" if cap else "")
        return f"{text} ({never})" if never > 1 else text
    text = f"{v.mean():.1f} ± {v.std(ddof=1):.1f} ({len(v)})" if len(v) > 1 else f"{v.mean():.1f} (1)"
    return text + (f", never {never}" if never else "")


def onset_table(onset: pd.DataFrame, what: str = "onset") -> pd.DataFrame:
    """Rows (partition, distance, layers), one column per samples-per-client: rounds until gap > 0
    (``what="onset"``), or how many rounds had a positive gap (``what="positive"``)."""
    if onset.empty:
        return pd.DataFrame()
    cap = int(onset["rounds"].max())
    t = onset.groupby(["partition", "distance", "layers", "size"], sort=False)[what].apply(
        lambda s: _mean_cell(s, cap) if what == "onset" else _mean_cell(s.astype(float))
    )
    t = t.unstack("size").sort_index(axis=1)
    t.columns = [f"{c} samples/client" for c in t.columns]
    return t.reset_index()


def purity_table(p: pd.DataFrame) -> pd.DataFrame:
    if p.empty:
        return pd.DataFrame()
    rows = []
    for (part, alg), x in p.groupby(["partition", "algorithm"], sort=True):
        rows.append(
            {
                "partition": part,
                "algorithm": alg,
                "rounds until the true clustering": _mean_cell(x["onset"]),
                "final purity": f"{x['purity'].mean():.2f}",
                "final clusters (per seed)": ", ".join(str(c) for c in x.sort_values("seed")["clusters"]),
                "split rounds (per seed)": "; ".join(
                    ",".join(map(str, s)) or "-" for s in x.sort_values("seed")["splits"]
                ),
            }
        )
    return pd.DataFrame(rows)


def write_figures(
    folder: str | Path,
    out_dir: str | Path,
    prefix: str,
    rounds: list[int],
    size: int,
    onset: pd.DataFrame | None = None,
    gaps: pd.DataFrame | None = None,
) -> list[Path]:
    """``PREFIX-onset.png`` (rounds until gap > 0 against samples per client), ``PREFIX-layers.png``
    (each layer's gap at ``rounds`` at ``size`` samples per client) and ``PREFIX-purity.png``
    (purity and cluster count per round of the splitting runs). ``onset`` and ``gaps``: `gap_onset`
    and `gaps_at` of the folder where the caller has them. Needs matplotlib; [] without it."""
    plt = pyplot()
    if plt is None:
        return []
    out_dir = Path(out_dir)
    written = []
    onset = gap_onset(folder) if onset is None else onset
    if not onset.empty:
        cap = int(onset["rounds"].max())
        parts = list(dict.fromkeys(onset["partition"]))
        fig, axes = plt.subplots(1, len(parts), figsize=(5.5 * len(parts), 3.8), squeeze=False)
        for ax, part in zip(axes[0], parts, strict=True):
            sub = onset[onset["partition"] == part]
            layer_order = list(dict.fromkeys(onset["layers"]))
            for (dist, layers), x in sub.groupby(["distance", "layers"], sort=False):
                y = x.assign(onset=x["onset"].fillna(cap + 1)).groupby("size")["onset"].mean()
                color = "black" if layers == ALL else plt.get_cmap("tab10")(layer_order.index(layers) % 10)
                ax.plot(
                    y.index,
                    y.values,
                    "-o" if dist == "Delta-cos" else "--s",
                    color=color,
                    markersize=4,
                    linewidth=2.2 if layers == ALL else 1.2,
                    label=f"{dist}, {layers}",
                )
            ax.set_xscale("log")
            ax.axhline(cap + 1, color="grey", linewidth=0.8, linestyle=":")
            ax.set_title(part)
            ax.set_xlabel("samples per client")
            ax.set_ylabel(f"rounds until gap > 0 ({cap + 1} = never)")
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
        fig.tight_layout()
        written.append(save_figure(fig, out_dir / f"{prefix}-onset.png"))
    gaps = gaps_at(folder, rounds, size) if gaps is None else gaps
    if not gaps.empty:
        parts = list(dict.fromkeys(gaps["partition"]))
        fig, axes = plt.subplots(2, len(parts), figsize=(5.5 * len(parts), 6), squeeze=False)
        width = 0.8 / len(rounds)
        for j, part in enumerate(parts):
            for i, dist in enumerate(["Delta-cos", "L2"]):
                ax = axes[i][j]
                x = gaps[(gaps["partition"] == part) & (gaps["distance"] == dist)]
                names = list(dict.fromkeys(x["layers"]))
                for b, r in enumerate(rounds):
                    y = x[x["round"] == r].set_index("layers").reindex(names)
                    ax.bar(
                        [n + (b - (len(rounds) - 1) / 2) * width for n in range(len(names))],
                        y["mean"],
                        width,
                        yerr=y["std"].fillna(0),
                        label=f"round {r}",
                    )
                ax.set_xticks(range(len(names)), [n.replace("encoder.", "") for n in names], fontsize=8)
                ax.axhline(0, color="black", linewidth=0.8)
                ax.set_title(f"{part}: {dist} gap ({size} samples/client)")
                ax.grid(alpha=0.3, axis="y")
            axes[0][j].legend(fontsize=7)
        fig.tight_layout()
        written.append(save_figure(fig, out_dir / f"{prefix}-layers.png"))
    runs = _finished(folder)
    runs = runs[~runs["never_splits"]]
    if not runs.empty:
        m = load_metrics(folder, scope="global")
        m = m[m["run_id"].isin(runs["run_id"]) & m["metric"].isin(["purity", "num_clusters"])]
        m = m.drop(columns=["partition", "algorithm"]).join(
            runs.set_index("run_id")[["partition", "algorithm"]], on="run_id"
        )
        parts = list(dict.fromkeys(runs["partition"]))
        fig, axes = plt.subplots(2, len(parts), figsize=(5.5 * len(parts), 6), squeeze=False, sharex=True)
        for j, part in enumerate(parts):
            for i, metric in enumerate(["purity", "num_clusters"]):
                ax = axes[i][j]
                x = m[(m["partition"] == part) & (m["metric"] == metric)]
                for alg, y in x.groupby("algorithm", sort=False):
                    curve = y.groupby("round")["value"].mean()
                    ax.plot(curve.index, curve.values, label=alg)
                ax.set_title(
                    f"{part}: {metric} (mean over seeds)"
                    + (" (one cluster: 1)" if metric == "purity" else "")
                )
                ax.set_xlabel("round")
                ax.grid(alpha=0.3)
            axes[0][j].legend(fontsize=7)
        fig.tight_layout()
        written.append(save_figure(fig, out_dir / f"{prefix}-purity.png"))
    return written


def section(folder: str | Path, out_dir: Path | None, options: Mapping[str, Any]) -> list[str]:
    """docs/fidelity.md's blocks for a LayerCFL section: the two tables and the figures."""
    rounds = options.get("rounds", [10])
    rounds, size = (
        ([int(rounds)] if isinstance(rounds, int) else [int(r) for r in rounds]),
        int(options.get("size", 500)),
    )
    prefix = str(options.get("prefix", "fidelity-layercfl"))
    parts = []
    onsets = gap_onset(folder)
    onset = onset_table(onsets)
    if not onset.empty:
        parts += [
            "**Rounds until gap > 0** (never-splitting runs; the first round whose gap is positive, mean ± std "
            "over seeds, the number of seeds; never = not within the run's rounds):",
            "",
            onset.to_markdown(index=False, disable_numparse=True),
            "",
        ]
        positive = onset_table(onsets, "positive")
        parts += [
            "**Rounds with gap > 0** (of the run's rounds: whether a separation, once there, lasts):",
            "",
            positive.to_markdown(index=False, disable_numparse=True),
            "",
        ]
    gaps = gaps_at(folder, rounds, size)
    if not gaps.empty:
        t = gaps.assign(
            cell=[
                f"{m:+.3f} ± {s:.3f}" if not math.isnan(s) else f"{m:+.3f}"
                for m, s in zip(gaps["mean"], gaps["std"], strict=True)
            ]
        )
        t = t.pivot_table(
            index=["partition", "distance", "round"],
            columns="layers",
            values="cell",
            aggfunc="first",
            sort=False,
        )
        parts += [
            f"**Gap per layer** at rounds {', '.join(map(str, rounds))} ({size} samples per client, "
            "never-splitting runs, mean ± std over seeds; positive: the layer's updates separate the groups):",
            "",
            t.reset_index().to_markdown(index=False, disable_numparse=True),
            "",
        ]
    purity = purity_table(purity_onset(folder))
    if not purity.empty:
        parts += [
            "**Clustering** (splitting runs; the true clustering: as many clusters as groups, purity 1):",
            "",
            purity.to_markdown(index=False, disable_numparse=True),
            "",
        ]
    if out_dir is not None:
        for path in write_figures(folder, out_dir, prefix, rounds, size, onsets, gaps):
            parts += [f"![{path.stem}]({path.name})", ""]
    return parts
