"""Issue 51 item 5's measurement: `fedray run --address` to a fresh two-node ray.cluster_utils
cluster, twice, each output line stamped with the seconds since that attempt started.

    python -m scripts.attach_fresh_cluster [NUM_CPUS_PER_ACTOR] [--head-cpus N] [--no-wait]

NUM_CPUS_PER_ACTOR defaults to 1 (the issue saw 2); --head-cpus: the head node's CPUs (default 2;
0 as a real cluster's head often is); --no-wait: attach before the worker node has registered.

Reported: the first attach took 105 s (94 s before its first round) and printed the autoscaler's
"No available node types can fulfill resource request {'CPU': 2.0}" although the actors were
placed; the second took 28 s; with num_cpus_per_actor 2 a sweep's coordinator died after ~35 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from ray.cluster_utils import Cluster

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.attach_fresh_cluster")
    ap.add_argument("cpus", nargs="?", type=int, default=1)
    ap.add_argument("--head-cpus", type=int, default=2)
    ap.add_argument("--no-wait", action="store_true")
    args = ap.parse_args()
    cpus = args.cpus
    t0 = time.time()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.head_cpus})
    cluster.add_node(num_cpus=2)
    if not args.no_wait:
        cluster.wait_for_nodes()
    print(f"cluster up in {time.time() - t0:.1f} s at {cluster.address}", flush=True)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    try:
        for attempt in range(2):
            t1 = time.time()
            cmd = [
                sys.executable,
                "-m",
                "jobs.cli",
                "run",
                "--address",
                cluster.address,
                "--set",
                "rounds=2",
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
    finally:
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
