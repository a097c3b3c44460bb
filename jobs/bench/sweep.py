"""Benchmark: a sweep on one Ray against the same runs as separate `fedray run` commands.

Variants, each a fresh process with a fresh local Ray and a fresh output folder:
- ``sweep``: ``fedray sweep CONFIG`` (one Ray start; as many runs at once as the CPUs allow);
- ``sweep-serial``: ``fedray sweep CONFIG --max-concurrent-runs 1`` (one Ray start; one run at a
  time, with all the actors);
- ``runs``: one ``fedray run`` per run of the sweep, one after another (a Ray start each).

Prints wall time per variant (best of ``--repeat``, variants in alternating order) and checks
that every variant wrote the same metrics (the actor count never changes a number).

    python -m jobs.bench.sweep [jobs/configs/digits_sweep.yaml] [--repeat 2] [--set rounds=10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from fedray.config.keys import dump_yaml
from fedray.records import TIMING_METRICS
from fedray.sweeps.sweep_file import load_sweep

VARIANTS = ("sweep", "sweep-serial", "runs")


def _commands(variant: str, config: str, sets: list[str], out: Path, work: Path) -> list[list[str]]:
    cli = [sys.executable, "-m", "jobs.cli"]
    set_args = [a for s in sets for a in ("--set", s)]
    if variant == "sweep":
        return [[*cli, "sweep", config, *set_args, "--output", str(out)]]
    if variant == "sweep-serial":
        return [[*cli, "sweep", config, *set_args, "--output", str(out), "--max-concurrent-runs", "1"]]
    cmds = []
    for run in load_sweep(config, sets, output=str(out)).runs:
        path = work / f"run{run.index}.yaml"
        path.write_text(dump_yaml(run.config))
        cmds.append([*cli, "run", str(path), "--output", str(out), "--quiet"])
    return cmds


def _metrics(out: Path) -> pd.DataFrame:
    df = pd.read_parquet(out / "metrics")
    df = df[~df["metric"].isin(TIMING_METRICS)]
    return df.sort_values(["run_id", "round", "metric", "scope", "entity"])[
        ["run_id", "round", "metric", "scope", "entity", "value"]
    ].reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.bench.sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("config", nargs="?", default="jobs/configs/digits_sweep.yaml")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of all variants, in alternating order")
    ap.add_argument(
        "--only", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}"
    )
    args = ap.parse_args(argv)
    variants = [v for v in args.only.split(",") if v]
    runs = load_sweep(args.config, args.sets).runs
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # each variant starts its own Ray
    print(f"{args.config}: {len(runs)} runs; {os.cpu_count()} CPUs; best of {args.repeat}", flush=True)
    times: dict[str, list[float]] = {v: [] for v in variants}
    tables: dict[str, pd.DataFrame] = {}
    with tempfile.TemporaryDirectory(prefix="fedray-bench-sweep-") as tmp:
        for rep in range(args.repeat):
            order = variants if rep % 2 == 0 else variants[::-1]
            for v in order:
                out, work = Path(tmp) / v / "out", Path(tmp) / v
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir(parents=True)
                cmds = _commands(v, args.config, args.sets, out, work)
                t0 = time.perf_counter()
                for cmd in cmds:
                    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
                    if p.returncode != 0:
                        print(p.stdout, p.stderr, file=sys.stderr)
                        return 1
                times[v].append(time.perf_counter() - t0)
                tables[v] = _metrics(out)
                print(
                    f"  {v:<13} {times[v][-1]:7.1f} s  ({len(cmds)} command{'s' if len(cmds) > 1 else ''})",
                    flush=True,
                )
    best = {v: min(t) for v, t in times.items()}
    ref = best.get("runs")
    print(f"\n{'variant':<14}{'best wall (s)':>14}{'vs runs':>10}")
    for v in variants:
        ratio = f"{best[v] / ref:.2f}x" if ref else "-"
        print(f"{v:<14}{best[v]:>14.1f}{ratio:>10}")
    first = tables[variants[0]]
    same = all(t.equals(first) for t in tables.values())
    print(f"identical metrics across variants: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
