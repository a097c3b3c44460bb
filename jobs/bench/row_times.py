"""Where a short sweep's time went, and what the full budget would take (scripts/gpu_check.sh).

    python -m jobs.bench.row_times RESULTS_FOLDER [RUNS_AT_ONCE]

For each finished run: its training round's seconds (the first round apart: CUDA graphs and data
come in it), its evaluation's seconds, batched_calls, its wall time, and the estimate of the same
run at the paper's budget (50 rounds; FedConcat's 31 encoder + 200 classifier rounds), each
round's steady time with its evaluation. The last line sums the estimate for the whole table
(4 partitions x 3 seeds of this row) on the same device with RUNS_AT_ONCE runs sharing it, as the
sweep ran them (default 1): the runs' seconds summed, over RUNS_AT_ONCE.
"""

from __future__ import annotations

import json
import sys

import pandas as pd

TWO_STAGE = {"fedconcat": (31, 200), "fedconcat_id": (31, 200)}
ROUNDS = 50
TABLE_COPIES = 4 * 3  # partitions x seeds of jobs/configs/table1_fmnist.yaml


def main(folder: str, at_once: int = 1) -> None:
    runs = pd.read_parquet(f"{folder}/runs")
    metrics = pd.read_parquet(f"{folder}/metrics")
    timing = metrics[metrics.metric.isin(["seconds", "eval_seconds"])]
    rows = []
    for run in runs.itertuples():
        cfg, summary = json.loads(run.config), json.loads(run.summary)
        t = timing[timing.run_id == run.run_id].pivot_table(
            index=["round", "stage"], columns="metric", values="value"
        )
        t = t.reset_index().sort_values("round")
        steady = t[t["round"] > 1]
        per_stage = steady.groupby("stage")[["seconds", "eval_seconds"]].mean()
        if cfg["algorithm"] in TWO_STAGE:
            enc, cls = TWO_STAGE[cfg["algorithm"]]
            stages = list(dict.fromkeys(steady.sort_values("round")["stage"]))  # in the order they ran
            first = per_stage.loc[stages[0]].sum() if stages else float("nan")
            last = per_stage.loc[stages[-1]].sum() if stages else float("nan")
            full = enc * first + cls * last
        else:
            full = ROUNDS * per_stage.sum(axis=1).mean()
        hparams = {**summary.get("hparams", {}), **cfg.get("hp", {})}
        hp = {k: v for k, v in hparams.items() if k in ("mu", "tau", "alpha", "num_clusters")}
        rows.append(
            {
                "algorithm": cfg["algorithm"] + (f" {hp}" if hp else ""),
                "status": run.status,
                "first round s": float(t["seconds"].iloc[0]) if len(t) else float("nan"),
                "round s": float(steady["seconds"].mean()),
                "eval s": float(steady["eval_seconds"].mean()),
                "batched_calls": summary.get("batched_calls"),
                "wall s": (run.finished - run.started).total_seconds()
                if run.finished is not None
                else float("nan"),
                "full-budget s": full,
            }
        )
    table = pd.DataFrame(rows).sort_values("algorithm")
    with pd.option_context(
        "display.width", 200, "display.max_colwidth", 60, "display.float_format", "{:.3f}".format
    ):
        print(table.to_string(index=False))
    total = table["full-budget s"].sum()
    print(
        f"this row at the paper's budget: {total / 60:.1f} min; the whole table ({TABLE_COPIES} such rows) one run after another: {TABLE_COPIES * total / 3600:.2f} h"
    )


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
