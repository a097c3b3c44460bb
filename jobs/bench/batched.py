"""Whole rounds of one algorithm, its clients trained one at a time against stacked (fedray/engine/batched.py).

    python -m jobs.bench.batched CONFIG [--only KEY=VALUE] [--set KEY=VALUE] [--device cuda]
        [--rounds 3] [--engines per-client,batched] [--profile ROWS]

Builds the run's clients in this process (no Ray, one host holding every client, as ``--local``)
and runs the config's algorithm for ``--rounds`` rounds with each engine from the same start: the
per-client engine (``batched_clients: off``) and the stacked one (``on``). The first round is a
warm-up (caches, CUDA graphs, MOON's first round has no previous model) and is not timed. Prints,
for each engine: seconds a round (median of the timed rounds), the real sample-steps a round (the
samples every local step took, summed) and their rate, the achieved FLOP/s (a training step taken
as forward + backward, counted by `torch.utils.flop_counter` on one batch) against the device's
float32 peak where it is known, and ``stacked work: R x the real sample-steps`` (the rows the stacks
stepped, padding included, over the real ones; 1.00 when no step is padded), and the seconds of
the round's evaluation after it (what a run records as ``eval_seconds``); each round's line as it
ends, so a run cut off by a time limit still shows its rounds. Then the speed-up and
how far the two engines' models are after the first round (largest |difference| over the largest
parameter). ``--profile N`` adds where one stacked round's time goes, operator by operator
(torch.profiler). ``--fold-mb`` sets how many megabytes of replies a folded round (FedEM, FedRC,
SCAFFOLD) gives a worker per call, so how many clients one call stacks; ``--stacked-conv im2col``
computes the stack's convolutions as im2col and one batched matrix product; ``--stacked-compile``
runs the stack's step compiled by ``torch.compile`` (its first round, untimed, compiles);
``--stacked-eval off`` evaluates a client's several models a pass a model where a GPU would stack
them (the mixtures' E-steps and ensembles). Needs no GPU
(``--device cpu``, the default); on a GPU it synchronises before reading the clock.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from typing import Any

from fedray.experiment.local import task_for
from jobs.bench import one_run

ENGINES = {"per-client": "off", "batched": "on"}
# float32 peaks (dense, no tensor cores), FLOP/s, by the device name's telling part
PEAKS = {"H100": 67e12, "H200": 67e12, "A100": 19.5e12}


class Work:
    """Sample-steps counted from the engines' own results: the real ones, and the rows stepped."""

    def __init__(self) -> None:
        self.samples = 0
        self.rows = 0

    def install(self) -> None:
        from fedray.engine import batched, drive

        train_update, train_stacked = drive.train_update, batched.train_stacked

        def one(client, update, draw=0):
            got = train_update(client, update, draw)
            self.samples += got.stats.samples
            self.rows += got.stats.samples
            return got

        def stacked(clients, updates, fixed=None, options=None):
            got = train_stacked(clients, updates, fixed, options)
            self.samples += sum(t.stats.samples for t in got)
            self.rows += sum(t.stats.stacked for t in got)
            return got

        drive.train_update = one
        drive.batched.train_stacked = stacked

    def take(self) -> tuple[int, int]:
        out = (self.samples, self.rows)
        self.samples = self.rows = 0
        return out


def step_flops(task: Any, arch: Any = None) -> float:
    """FLOPs of one training sample-step (forward and backward) of the task's model."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from fedray.models import TASK

    model = task.build_model(arch=arch or TASK)
    x = torch.zeros((8, *task.spec.input_shape))
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(x), torch.zeros(8, dtype=torch.long)).backward()
    return counter.get_total_flops() / 8


def add_stack_args(ap: argparse.ArgumentParser) -> None:
    """``--stacked-conv``, ``--stacked-compile`` and ``--stacked-eval``: how the stacked engine
    computes (`use_stack_args`)."""
    ap.add_argument(
        "--stacked-conv",
        default="grouped",
        choices=["grouped", "im2col"],
        help="how the stacked engine computes a convolution (fedray.engine.step_options; default grouped)",
    )
    ap.add_argument(
        "--stacked-compile",
        action="store_true",
        help="the stacked engine's step compiled by torch.compile (fedray.engine.step_options)",
    )
    ap.add_argument(
        "--stacked-eval",
        default="auto",
        choices=["auto", "on", "off"],
        help="a client's evaluations of several models as one stacked forward "
        "(fedray.engine.step_options; default auto: on a CUDA device)",
    )


def use_stack_args(args: argparse.Namespace) -> None:
    """Set the stacked engine's step options from `add_stack_args`' options."""
    from fedray.engine import step_options

    step_options.use(conv=args.stacked_conv, compile=args.stacked_compile, stacked_eval=args.stacked_eval)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.bench.batched", description=__doc__.split("\n\n")[0])
    one_run.add_args(ap)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per engine, the first untimed (default 3)")
    ap.add_argument("--engines", default="per-client,batched", help="which engines (default both)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as one actor)")
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="ROWS",
        help="also profile one stacked round (torch.profiler) and print its ROWS costliest "
        "operators by self time, on the host and on the device",
    )
    ap.add_argument(
        "--fold-mb",
        type=float,
        default=None,
        metavar="MB",
        help="the replies a worker holds at a time in a folded round (FedEM, FedRC, SCAFFOLD), so "
        "the clients a call stacks (default: fedray.federation.host.fold_bytes: 64 MB on the CPU, "
        "a 32nd of the device's memory on a GPU)",
    )
    add_stack_args(ap)
    args = ap.parse_args(argv)
    engines = one_run.picked_names(args.engines, list(ENGINES), ap.prog, "engine")
    if engines is None:
        return 2
    if args.rounds < 2:
        print(f"{ap.prog}: --rounds must be 2 or more (the first is a warm-up)", file=sys.stderr)
        return 2

    import numpy as np
    import torch

    from fedray.algorithms import ALGORITHMS
    from fedray.data import build_federated_data
    from fedray.experiment.local import make_local_federation
    from fedray.federation.local import LocalFederation

    cfg = one_run.picked(args, args.sets)
    if cfg is None:
        return 2
    use_stack_args(args)
    if args.fold_mb is not None:
        from fedray.federation import host

        budget = int(args.fold_mb * (1 << 20))
        host.fold_bytes = lambda *_, **__: budget  # every host of this process, whatever its device
    data = build_federated_data(cfg.data_section)
    alg = ALGORITHMS[cfg.algorithm]
    hp = alg.make_hparams(cfg.hp)
    work = Work()
    work.install()

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def federation(mode: str) -> LocalFederation:
        return make_local_federation(
            dataclasses.replace(cfg, batched_clients=mode), data, args.device, args.threads
        )[0]

    flops = step_flops(task_for(cfg, data.dataset.spec))
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    peak = next((v for k, v in PEAKS.items() if k in name), None)
    print(
        f"{cfg.algorithm} on {cfg.dataset} ({cfg.partition}), {cfg.model}, {len(data.clients)} clients at "
        f"participation {cfg.participation}, {cfg.local_epochs} local epochs of batch {cfg.batch_size}; "
        f"device {name}, {args.threads} thread(s); {flops / 1e6:.2f} MFLOP a sample-step"
    )
    seconds, first_models = {}, {}
    for engine in engines:
        fed = federation(ENGINES[engine])
        state = alg.init(fed, hp)
        times, samples, rows, evals = [], [], [], []
        for rnd in range(args.rounds):
            sync()
            t0 = time.perf_counter()
            state, _ = alg.round(state, fed, hp, rnd)
            sync()
            took = time.perf_counter() - t0
            real, stepped = work.take()
            # the round's evaluation as a run records it (its eval_seconds), timed on its own
            t1 = time.perf_counter()
            alg.evaluate(state, fed, hp, rnd)
            sync()
            evaluated = time.perf_counter() - t1
            # each round as it ends, so a run cut off by a time limit still gives its rounds
            print(
                f"{'':10s}  {engine} round {rnd}{' (untimed)' if rnd == 0 else ''}: {took:.3f} s, "
                f"evaluation {evaluated:.3f} s",
                flush=True,
            )
            if rnd == 0:
                first_models[engine] = params_of(state)
                continue
            evals.append(evaluated)
            times.append(took)
            samples.append(real)
            rows.append(stepped)
        sec = statistics.median(times)
        seconds[engine] = sec
        rate = statistics.median(s / t for s, t in zip(samples, times, strict=True))
        achieved = rate * flops
        vs_peak = (
            f" ({100 * achieved / peak:.2f}% of the float32 peak {peak / 1e12:.0f} TFLOP/s)" if peak else ""
        )
        print(
            f"{engine:10s}  {sec:8.3f} s a round   {statistics.median(samples):,.0f} sample-steps a round   "
            f"{rate:,.0f} sample-steps/s   {achieved / 1e12:.3f} TFLOP/s{vs_peak}"
        )
        print(f"{'':10s}  stacked work: {sum(rows) / max(1, sum(samples)):.2f} x the real sample-steps")
        print(
            f"{'':10s}  evaluation: {statistics.median(evals):.3f} s a round (global test set, clients' splits)"
        )
        if args.profile and engine == "batched":
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + (
                [ProfilerActivity.CUDA] if args.device.startswith("cuda") else []
            )
            with profile(activities=acts) as prof:
                alg.round(state, fed, hp, args.rounds)
                sync()
            for key in ["self_cpu_time_total"] + (["self_cuda_time_total"] if len(acts) > 1 else []):
                print(f"\nstacked round, by {key}:")
                print(prof.key_averages().table(sort_by=key, row_limit=args.profile))
    if len(seconds) == 2:
        print(f"speed-up    {seconds['per-client'] / seconds['batched']:8.2f}x")
        a, b = first_models["per-client"], first_models["batched"]
        scale = max(float(np.abs(v).max()) for v in a.values()) or 1.0
        diff = max(float(np.abs(a[k] - b[k]).max()) for k in a)
        print(f"after round 1: largest |parameter difference| {diff:.3g} (largest parameter {scale:.3g})")
    return 0


def params_of(state: Any) -> dict:
    """The first model a state holds (FedAvg's params, a cluster's, FedCat's m_glb), as float arrays."""
    import numpy as np

    for name in ("params", "models", "encoders"):
        value = getattr(state, name, None)
        if isinstance(value, dict) and value and isinstance(next(iter(value.values())), np.ndarray):
            return value
        if isinstance(value, (list, dict)) and value:
            first = value[0] if isinstance(value, list) else next(iter(value.values()))
            if isinstance(first, dict):
                return first
    return {}


if __name__ == "__main__":
    sys.exit(main())
