"""The CUDA path against the CPU: one run on client actors holding a fraction of a GPU, the same run on
CPU actors, and what a user needs to trust the GPU numbers.

    python -m jobs.bench.cuda jobs/configs/fidelity_fedconcat.yaml --only algorithm=fedconcat \
        --only partition=labels --set seed=0 --gpus-per-actor 0.25 --cpus-per-actor 2 --actors 4

Prints, for each side, the devices the client actors trained on (from the run's placement: the GPU
side must say ``cuda:0``, or the command fails), the steady seconds per round by stage, and then,
round by round, the global metrics of both sides and their difference. The GPU side runs twice:
with ``cuda_deterministic: true`` (the default) the two must give the same numbers bit for bit,
or the command fails; ``--set cuda_deterministic=false`` shows how far CUDA's default kernels drift. Both sides start from the
same seed; CUDA's kernels sum in another order than the CPU's, so the first round agrees to float
precision and later rounds drift as far as the algorithm amplifies small differences (an unstable
one, such as FedAvg on #C=2 at momentum 0.9, by points; a stable one by hundredths). Needs a
machine with a GPU (Ray must see one); never part of the test suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from jobs.bench import one_run

METRICS = ("accuracy", "loss", "sgd_loss")


def run_side(cfg, label: str, placement: dict | None = None) -> tuple[list[str], dict[int, dict]]:
    """One run on Ray; the client actors' devices and each round's stage, seconds and global
    metrics (``placement``, when given, receives the run's placement)."""
    from actors.driver import run_on_ray
    from fedray.experiment.loop import RoundDone, Started

    devices, rounds = [], {}
    for ev in run_on_ray(cfg, restart=True):
        if isinstance(ev, Started):
            devices = list(ev.placement.get("devices", []))
            if placement is not None:
                placement.update(ev.placement)
            print(
                f"{label}: {cfg.algorithm} on {cfg.dataset}, {ev.num_clients} clients, "
                f"{ev.placement.get('actors')} actors on {devices}",
                flush=True,
            )
        elif isinstance(ev, RoundDone):
            rounds[ev.round] = {"stage": ev.stage, "seconds": ev.seconds, **ev.metrics}
    return devices, rounds


def round_times(rounds: dict[int, dict]) -> str:
    """Median seconds per round for each stage, the first round of a stage left out (warm-up)."""
    by_stage: dict[str, list[float]] = {}
    for r in sorted(rounds):
        by_stage.setdefault(rounds[r]["stage"], []).append(rounds[r]["seconds"])
    return ", ".join(
        f"{stage or 'round'} {statistics.median(s[1:] or s):.2f} s" for stage, s in by_stage.items()
    )


def steady(rounds: dict[int, dict]) -> float:
    """Median seconds of the rounds after each stage's first, over all stages: the whole run's pace."""
    by_stage: dict[str, list[float]] = {}
    for r in sorted(rounds):
        by_stage.setdefault(rounds[r]["stage"], []).append(rounds[r]["seconds"])
    rest = [t for s in by_stage.values() for t in (s[1:] or s)]
    return statistics.median(rest) if rest else float("nan")


def compare_sides(args: argparse.Namespace, out: Path) -> int:
    """``--side LABEL:KEY=VALUE,...``: the run once per side, then one table (seconds per round,
    the speed-up over the first side, and how far each side's metrics are from the first's)."""
    sides = []
    for spec in args.sides:
        label, _, sets = spec.partition(":")
        cfg = one_run.picked(args, [*args.sets, *[kv for kv in sets.split(",") if kv]])
        if cfg is None:
            return 2
        sides.append((label, cfg))
    header = (
        f"{'side':18s} {'actors':>6s} {'GPU each':>8s} {'batched':>7s} {'devices':12s} {'s/round':>8s} "
        f"{'x first':>7s} {'wall s':>7s} {'final acc':>9s} {'max|dacc|':>9s} {'max rel dloss':>13s}  by stage"
    )
    ref: dict[int, dict] = {}
    failed = False
    for n, (label, cfg) in enumerate(sides):
        place: dict = {}
        t0 = time.perf_counter()
        devices, rounds = run_side(dataclasses.replace(cfg, output=str(out / label)), label, place)
        wall = time.perf_counter() - t0
        if n == 0:
            ref = rounds
            print(header)
        common = sorted(set(rounds) & set(ref))
        dacc = max(
            (abs(rounds[r]["accuracy"] - ref[r]["accuracy"]) for r in common if "accuracy" in rounds[r]),
            default=0.0,
        )
        dloss = max(
            (
                abs(rounds[r]["loss"] - ref[r]["loss"]) / abs(ref[r]["loss"])
                for r in common
                if "loss" in rounds[r] and ref[r]["loss"]
            ),
            default=0.0,
        )
        final = rounds[max(rounds)].get("accuracy", float("nan")) if rounds else float("nan")
        print(
            f"{label:18s} {place.get('actors', 0):6d} {cfg.num_gpus_per_actor:8.4g} {cfg.batched_clients:>7s} "
            f"{','.join(devices):12s} {steady(rounds):8.3f} {steady(ref) / steady(rounds):7.2f} {wall:7.1f} "
            f"{final:9.4f} {dacc:9.5f} {dloss:13.2e}  {round_times(rounds)}",
            flush=True,
        )
        if cfg.num_gpus_per_actor > 0 and devices != ["cuda:0"]:
            print(f"{label}: asked for GPUs, trained on {devices}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.bench.cuda", description=__doc__.split("\n\n")[0])
    one_run.add_args(ap)
    ap.add_argument("--gpus-per-actor", type=float, default=0.25)
    ap.add_argument("--cpus-per-actor", type=float, default=2.0)
    ap.add_argument("--actors", type=int, default=4)
    ap.add_argument("--output", help="results folder (default: a scratch folder, removed at the end)")
    ap.add_argument(
        "--side",
        dest="sides",
        action="append",
        default=[],
        metavar="LABEL:KEY=VALUE,...",
        help="instead of GPU/GPU/CPU: run once per side with these keys set, then compare "
        "(e.g. per-client:batched_clients=off,num_actors=4,num_gpus_per_actor=0.25)",
    )
    args = ap.parse_args(argv)
    if args.sides:
        out = Path(args.output or tempfile.mkdtemp(prefix="fedray-cuda-"))
        try:
            return compare_sides(args, out)
        finally:
            if not args.output:
                shutil.rmtree(out, ignore_errors=True)

    cfg = one_run.picked(
        args, [*args.sets, f"num_actors={args.actors}", f"num_cpus_per_actor={args.cpus_per_actor}"]
    )
    if cfg is None:
        return 2
    out = Path(args.output or tempfile.mkdtemp(prefix="fedray-cuda-"))
    try:
        on_gpu = dataclasses.replace(cfg, num_gpus_per_actor=args.gpus_per_actor)
        gpu_dev, gpu = run_side(dataclasses.replace(on_gpu, output=str(out / "gpu")), "GPU")
        _, again = run_side(dataclasses.replace(on_gpu, output=str(out / "gpu-again")), "GPU again")
        cpu_dev, cpu = run_side(
            dataclasses.replace(cfg, num_gpus_per_actor=0.0, output=str(out / "cpu")), "CPU"
        )
        print(f"\nseconds per round (steady): GPU {round_times(gpu)}; CPU {round_times(cpu)}")
        shown = [m for m in METRICS if any(m in v for v in gpu.values())]
        print(
            "round  stage       " + "  ".join(f"{m + ' GPU':>13} {m + ' CPU':>13} {'diff':>9}" for m in shown)
        )
        worst = dict.fromkeys(shown, 0.0)
        for r in sorted(set(gpu) & set(cpu)):
            cells = []
            for m in shown:
                g, c = gpu[r].get(m, float("nan")), cpu[r].get(m, float("nan"))
                worst[m] = max(worst[m], abs(g - c))
                cells.append(f"{g:13.6f} {c:13.6f} {g - c:+9.5f}")
            print(f"{r:5d}  {gpu[r]['stage'] or '-':10s}  " + "  ".join(cells))
        print("largest |GPU - CPU|: " + ", ".join(f"{m} {w:.5f}" for m, w in worst.items()))
        same = all(gpu[r].get(m) == again.get(r, {}).get(m) for r in gpu for m in shown) and set(gpu) == set(
            again
        )
        drift = max(
            (abs(gpu[r][m] - again[r][m]) for r in set(gpu) & set(again) for m in shown if m in gpu[r]),
            default=0.0,
        )
        print(
            f"GPU run twice (cuda_deterministic={cfg.cuda_deterministic}): "
            + ("bit-identical" if same else f"differ, by up to {drift:.6f}")
        )
        if gpu_dev != ["cuda:0"] or cpu_dev != ["cpu"]:
            print(
                f"the GPU side trained on {gpu_dev} and the CPU side on {cpu_dev}: "
                "expected ['cuda:0'] and ['cpu'] (does Ray see a GPU? is torch a CUDA build?)",
                file=sys.stderr,
            )
            return 1
        if cfg.cuda_deterministic and not same:
            print("cuda_deterministic is on, yet the two GPU runs differ", file=sys.stderr)
            return 1
    finally:
        if not args.output:
            shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
