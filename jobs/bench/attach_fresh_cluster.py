"""Issue 51 item 5's measurement: `fedray run --address` (or `fedray sweep`) to a fresh two-node
ray.cluster_utils cluster, twice, each output line stamped with the seconds since that attempt
started.

    python -m jobs.bench.attach_fresh_cluster [NUM_CPUS_PER_ACTOR] [--head-cpus N] [--no-wait]
        [--sweep] [--busy N] [--niceness 15]

NUM_CPUS_PER_ACTOR defaults to 1 (the issue saw 2); --head-cpus: the head node's CPUs (default 2;
0 as a real cluster's head often is); --no-wait: attach before the worker node has registered;
--sweep: a 4-run sweep (jobs/configs/digits_sweep.yaml, 3 rounds each) in place of one run;
--busy N: N busy loops at normal priority beside the first attempt (a busy machine);
--niceness 15: the job's workers at Ray's default niceness, as before fedray set 0 (played as a
submitted job's runtime env, which fedray leaves as it is).

Reported: the first attach took 105 s (94 s before its first round) and printed the autoscaler's
"No available node types can fulfill resource request {'CPU': 2.0}" although the actors were
placed; the second took 28 s; with num_cpus_per_actor 2 a sweep's coordinator died after ~35 s.
Measured (docs/running.md, Priority): on a quiet machine it does not happen; beside busy loops it
does at Ray's default niceness 15, and not at 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ray.cluster_utils import Cluster

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.bench.attach_fresh_cluster")
    ap.add_argument("cpus", nargs="?", type=int, default=1)
    ap.add_argument("--head-cpus", type=int, default=2)
    ap.add_argument("--no-wait", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--busy", type=int, default=0)
    ap.add_argument("--niceness", type=int, default=None)
    args = ap.parse_args()
    cpus = args.cpus
    t0 = time.time()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.head_cpus})
    cluster.add_node(num_cpus=2)
    if not args.no_wait:
        cluster.wait_for_nodes()
    print(f"cluster up in {time.time() - t0:.1f} s at {cluster.address}", flush=True)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if args.niceness is not None:
        job = {"runtime_env": {"env_vars": {"RAY_worker_niceness": str(args.niceness)}}}
        env["RAY_JOB_CONFIG_JSON_ENV_VAR"] = json.dumps(job)
    what = ["sweep", "jobs/configs/digits_sweep.yaml", "--set", "rounds=3"] if args.sweep else ["run"]
    busy: list[subprocess.Popen] = []
    try:
        for attempt in range(2):
            busy = [
                subprocess.Popen(["sh", "-c", "while :; do :; done"])
                for _ in range(args.busy if attempt == 0 else 0)
            ]
            t1 = time.time()
            cmd = [
                sys.executable,
                "-m",
                "jobs.cli",
                *what,
                "--address",
                cluster.address,
                *([] if args.sweep else ["--set", "rounds=2"]),
                "--set",
                f"num_cpus_per_actor={cpus}",
                "--output",
                f"/tmp/attach-fresh-{attempt}",
                "--force",
            ]
            p = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            for line in p.stdout:
                print(f"[{time.time() - t1:6.1f}] {line.rstrip()}", flush=True)
            p.wait()
            print(f"attempt {attempt}: exit {p.returncode} in {time.time() - t1:.1f} s", flush=True)
            for b in busy:
                b.kill()
    finally:
        for b in busy:
            b.kill()
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
