"""Benchmark: what a round costs as the client count grows (cross-device scale).

Each case is one `fedray run` in a fresh process (its own local Ray, one client actor unless
``--actors``) of one of two configs, over FedProx's Synthetic(1,1) (`dataset: fedprox_synthetic`,
every client made when it is sampled), 1 local epoch at batch 50, 10 rounds, the global model
evaluated once at the end on 1,000 fixed clients (``eval_clients``), no checkpoint:

- ``fedavg-1e4``, ``fedavg-1e5``, ``fedavg-1e6``: `jobs/configs/scale_fedavg_1m.yaml`, FedAvg with
  logreg, 100 clients a round, over 10^4, 10^5 and (the config itself) 10^6 clients;
- ``scaffold-1e4-256mb``, ``scaffold-1e5-256mb``: `jobs/configs/scale_scaffold_100k.yaml`, SCAFFOLD
  with the 2NN (``mlp``: 54,410 parameters, so each client that has trained keeps a 218 KB control
  variate) at 1% a round with ``client_state_memory_mb: 256`` (states beyond it on disk), over 10^4
  and (the config itself) 10^5 clients; ``scaffold-1e4``, ``scaffold-1e5``: the same with the
  default state budget.

For each it prints seconds per round (median of the rounds after the first), the overhead per
participant (a round's seconds less the time its clients spent in their client functions, per
participant; exact with one actor, whose calls run one at a time), the peak resident memory (the
kernel's high-water mark, VmHWM) of the driver, the coordinator and each client actor, the peak of
their sum with Ray's own processes, and the disk used by spilled client state (peak) and by the
results. Targets on a 2-core, 24 GiB machine: FedAvg over 10^6 clients under 4 GB; SCAFFOLD over
10^5 at 1% with 256 MB of state in memory under 3 GB; the overhead under 2 ms a participant.

    python -m jobs.bench.scale [--only fedavg-1e6,scaffold-1e5-256mb] [--rounds 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from fedray.config.keys import dump_yaml
from fedray.experiment.checks import load_config
from fedray.federation.client_states import PREFIX
from jobs.bench import one_run

FEDAVG, SCAFFOLD = "jobs/configs/scale_fedavg_1m.yaml", "jobs/configs/scale_scaffold_100k.yaml"
# case -> (config, keys set on it): the two target runs are these configs as they stand
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "fedavg-1e4": (FEDAVG, dict(num_clients=10_000, participation=100 / 10_000)),
    "fedavg-1e5": (FEDAVG, dict(num_clients=100_000, participation=100 / 100_000)),
    "fedavg-1e6": (FEDAVG, {}),
    "scaffold-1e4": (SCAFFOLD, dict(num_clients=10_000, client_state_memory_mb=0)),
    "scaffold-1e4-256mb": (SCAFFOLD, dict(num_clients=10_000)),
    "scaffold-1e5": (SCAFFOLD, dict(client_state_memory_mb=0)),
    "scaffold-1e5-256mb": (SCAFFOLD, {}),
}
RAY_SYSTEM = ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py", "runtime_env", "ray::IDLE")


def _proc(pid: int) -> tuple[int, str, int, int] | None:
    """(parent pid, command line, VmHWM bytes, Pss bytes) of a live process, None if it is gone.
    Pss shares each shared page out among the processes that map it, so the sum over processes is
    the memory they use together (RSS would count torch's libraries once per process)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    fields = dict(
        line.split(":", 1) for line in [*status.splitlines(), *rollup.splitlines()[1:]] if ":" in line
    )
    kb = lambda k: int(fields.get(k, "0 kB").split()[0]) * 1024  # noqa: E731
    return int(fields["PPid"]), cmd, kb("VmHWM"), kb("Pss")


def _role(pid: int, root: int, cmd: str) -> str:
    if pid == root:
        return "driver"
    if "Coordinator" in cmd:
        return "coordinator"
    if "ClientActor" in cmd:
        return f"actor {pid}"
    return "ray" if any(s in cmd for s in RAY_SYSTEM) else "other"


def _tree(root: int) -> dict[int, tuple[str, int, int]]:
    """Every live process under ``root`` (itself included): pid -> (command line, VmHWM, VmRSS)."""
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (got := _proc(int(d))) is not None:
            procs[int(d)] = got
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_rest) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in procs:
            out[pid] = procs[pid][1:]
            todo += children.get(pid, [])
    return out


def _folder_bytes(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        for f in p.rglob("*") if p.is_dir() else []:
            try:
                total += f.stat().st_size
            except OSError:
                pass
    return total


def run_case(
    name: str, config: str, over: dict[str, Any], rounds: int, actors: int, work: Path
) -> dict[str, Any]:
    cfg = load_config(config, **{**over, "rounds": rounds, "eval_every": rounds, "num_actors": actors})
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    cfg_path = work / f"{name}.yaml"
    cfg_path.write_text(dump_yaml(cfg))
    spill_root = Path(tempfile.gettempdir())
    before = set(spill_root.glob(PREFIX + "*"))
    cmd = [sys.executable, "-m", "jobs.cli", "run", str(cfg_path), "--output", str(out), "--quiet"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks: dict[str, int] = {}
    total_peak = spill_peak = 0
    while proc.poll() is None:
        tree = _tree(proc.pid)
        for pid, (cmdline, hwm, _) in tree.items():
            role = _role(pid, proc.pid, cmdline)
            peaks[role] = max(peaks.get(role, 0), hwm)  # of one process (Ray's own: the largest)
        total_peak = max(total_peak, sum(pss for _, _, pss in tree.values()))
        spill_peak = max(
            spill_peak, _folder_bytes([p for p in spill_root.glob(PREFIX + "*") if p not in before])
        )
        time.sleep(0.5)  # VmHWM is a high-water mark; the sums are sampled (the poll costs CPU)
    wall = time.perf_counter() - t0
    log = proc.stdout.read()
    if proc.returncode != 0:
        return {
            "case": name,
            "error": log.strip().splitlines()[-1] if log.strip() else f"exit {proc.returncode}",
        }
    m = pd.read_parquet(out / "metrics")
    m = m[m["scope"] == "global"].pivot_table(index="round", columns="metric", values="value")
    steady = m.iloc[1:] if len(m) > 1 else m
    overhead = (steady["seconds"] - steady["client_seconds"] / actors) / steady["participants"]
    return {
        "case": name,
        "clients": cfg.num_clients,
        "participants": int(steady["participants"].median()),
        "round_s": float(steady["seconds"].median()),
        "overhead_ms": 1000 * float(overhead.median()),
        "peak_bytes": {k: peaks[k] for k in sorted(peaks) if k != "other"},
        "total_rss_peak": total_peak,
        "spill_peak_bytes": spill_peak,
        "results_bytes": _folder_bytes([out]),
        "wall_s": wall,
        "accuracy": float(m["accuracy"].dropna().iloc[-1]) if "accuracy" in m else float("nan"),
    }


def _gb(n: int) -> str:
    return f"{n / 2**30:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.bench.scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--actors", type=int, default=1, help="client actors per run (1: the overhead is exact)")
    ap.add_argument(
        "--work", default="", help="folder for the runs' configs and results (default: a temporary one)"
    )
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    names = one_run.picked_names(args.only, list(CASES), "bench_scale", "case")
    if names is None:
        return 2
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="fedray-bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"{os.cpu_count()} CPUs; {args.rounds} rounds a case, {args.actors} client actor(s); runs in {work}",
        flush=True,
    )
    results = []
    for name in names:
        res = run_case(name, *CASES[name], args.rounds, args.actors, work)
        results.append(res)
        if "error" in res:
            print(f"{name:>19}: FAILED {res['error']}", flush=True)
            continue
        mem = ", ".join(f"{k} {_gb(v)}" for k, v in res["peak_bytes"].items())
        print(
            f"{name:>19}: {res['clients']:>9,} clients, {res['participants']:>4} a round: {res['round_s']:6.2f} s/round, "
            f"overhead {res['overhead_ms']:.2f} ms/participant; peak GB: {mem}; all processes {_gb(res['total_rss_peak'])}; "
            f"spilled state peak {res['spill_peak_bytes'] / 2**20:.0f} MB, results {res['results_bytes'] / 2**20:.1f} MB; "
            f"{res['wall_s']:.0f} s end to end",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
