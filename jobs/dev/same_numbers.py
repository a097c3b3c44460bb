"""Show that a change leaves every algorithm's numbers as they were: one small run per algorithm at a
git revision (a detached worktree of it) and in this working tree, then every metric compared bit
for bit.

    .venv/bin/python jobs/dev/same_numbers.py REV [--out DIR] [--set KEY=VALUE ...]

The runs: the embedded digits data, 10 clients, Dir(0.5), 4 rounds of 1 local epoch, in-process
(`fedray sweep --local`), each algorithm at small hyperparameters (two clusters, FedConcat 2 + 2
rounds). Prints one line per algorithm (identical, or the metrics that differ and by how much) and
exits 1 if any differs. Timings (``*seconds``) are not compared; ``bytes_*`` metrics are reported
but not counted: they measure pickled messages, which name the modules their classes live in, so
moving a class changes them. ``--reuse`` compares the runs already in ``--out`` again. ``--set``
changes a key of every run on both sides (``--set batched_clients=on``: the stacked engine's path).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SWEEP = """\
experiment: same-numbers
dataset: digits
model: mlp
num_clients: 10
partition: dirichlet
partition_beta: 0.5
rounds: 4
local_epochs: 1
batch_size: 32
lr: 0.05
momentum: 0.9
participation: 1.0
grid:
  algorithm:
    - fedavg
    - {algorithm: fedprox, hp: {mu: 0.1}}
    - scaffold
    - fednova
    - moon
    - fedrs
    - fedlc
    - {algorithm: clusterfedavg, hp: {num_clusters: 2}}
    - {algorithm: fedconcat, hp: {num_clusters: 2, encoder_rounds: 2}}
    - {algorithm: fedconcat_id, hp: {num_clusters: 2, encoder_rounds: 2}}
    - {algorithm: fedcat, rounds: 10}  # one cycle of its K = 10 hand-offs
    - clusamp
    - {algorithm: fedem, hp: {num_clusters: 2}}
    - {algorithm: fedrc, hp: {num_clusters: 2}}
    - {algorithm: cfl, hp: {eps1: 10.0, eps2: 0.0}}
    - {algorithm: layercfl, hp: {eps1: 10.0, eps2: 0.0}}
    - {algorithm: ifca, hp: {num_clusters: 2}}
    - {algorithm: fesem, hp: {num_clusters: 2}}
    - {algorithm: fedsoft, hp: {num_clusters: 2}}
    # the paths the plain runs above leave out: ground-truth groups (purity, the layers' gaps),
    # FedConcat's stage 2 by a clustered algorithm, every FedRC option
    - {algorithm: cfl, partition: dominant, partition_clusters: 2, hp: {eps1: 10.0, eps2: 0.0}}
    - {algorithm: layercfl, partition: dominant, partition_clusters: 2, hp: {eps1: 10.0, eps2: 0.0, distance: delta_l2}}
    - {algorithm: fedconcat, hp: {num_clusters: 2, encoder_rounds: 2, clustering: ifca}}
    - {algorithm: fedrc, client_test_fraction: 0.2, hp: {num_clusters: 3, adam: paper, delta: 0.2, xi: 1.0, finetune: true}}
seeds: [0]
"""


def run_sweep(tree: Path, out: Path, python: str, sets: list[str]) -> None:
    cfg = out / "same-numbers.yaml"
    out.mkdir(parents=True, exist_ok=True)
    cfg.write_text(SWEEP)
    cmd = [python, "-m", "jobs.cli", "sweep", str(cfg), "--output", str(out / "runs"), "--local"]
    cmd += [arg for kv in sets for arg in ("--set", kv)]
    subprocess.run(
        cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True, stdout=subprocess.DEVNULL
    )


def metrics(out: Path):
    sys.path.insert(0, str(ROOT))
    from analysis import load_metrics, load_runs

    runs = load_runs(out / "runs").set_index("run_id")["algorithm"]
    m = load_metrics(out / "runs")  # each run by its algorithm and its config's digest (the run id's end)
    m["algorithm"] = m["run_id"].map({rid: f"{alg} {rid.rsplit('-', 1)[-1]}" for rid, alg in runs.items()})
    keys = ["algorithm", "round", "stage", "metric", "scope", "entity"]
    return m.set_index(keys)["value"].sort_index()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rev", help="the git revision to compare with (e.g. HEAD, main~3)")
    p.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    p.add_argument("--reuse", action="store_true", help="compare the runs already in --out, run nothing")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a key for every run")
    args = p.parse_args(argv)
    python = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        if not args.reuse:
            run_both(args.rev, out, python, args.set)
        before, after = metrics(out / "before"), metrics(out / "after")
    return compare(before, after)


def run_both(rev: str, out: Path, python: str, sets: list[str]) -> None:
    """The sweep at ``rev`` (a detached worktree of it, removed after) and in this working tree."""
    before_tree = out / "tree"
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-f", str(before_tree), rev],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    try:
        run_sweep(before_tree, out / "before", python, sets)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before_tree)], cwd=ROOT, check=False)
    run_sweep(ROOT, out / "after", python, sets)


def compare(before, after) -> int:
    before = before[~before.index.get_level_values("metric").str.endswith("seconds")]
    after = after[~after.index.get_level_values("metric").str.endswith("seconds")]
    differ = 0
    for alg in sorted(set(before.index.get_level_values(0)) | set(after.index.get_level_values(0))):
        b, a = before.get(alg), after.get(alg)
        if b is None or a is None:
            print(f"{alg:25s} only {'after' if b is None else 'before'}")
            differ += 1
            continue
        both = b.to_frame("before").join(a.to_frame("after"), how="outer")
        bad = both[~((both["before"] == both["after"]) | (both["before"].isna() & both["after"].isna()))]
        counted = bad[~bad.index.get_level_values("metric").str.startswith("bytes_")]
        note = (
            ""
            if bad.empty
            else f" (bytes metrics differ: {sorted(set(bad.index.get_level_values('metric')))})"
        )
        if counted.empty:
            print(f"{alg:25s} identical: {len(both)} values{note}")
        else:
            differ += 1
            print(f"{alg:25s} DIFFERS in {len(counted)} of {len(both)} values:\n{counted.head(10)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
