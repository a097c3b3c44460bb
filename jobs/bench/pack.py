"""Packed runs against the same runs one after another: what packing (pack_runs, fedray/sweeps/pack.py)
gives a sweep on one worker.

    python -m jobs.bench.pack CONFIG [--only KEY=VALUE] [--set KEY=VALUE] [--device cuda]
        [--runs 4] [--rounds 4] [--vary seed|hp.mu=0.001,0.01,...] [--threads 1]
        [--stacked-conv im2col] [--stacked-compile]

Makes ``--runs`` runs of the config, differing in ``--vary`` (default: seeds 0, 1, ...; or one
config key's values, such as a tuned hp), with batched training on. Runs them in this process into
a temporary results folder twice: each alone, one after the other (as a worker runs them with
pack_runs off), and all as one pack (pack_runs on). Whole runs, as a sweep runs them: their
evaluation and the writing of their rows included, their data built and first round (warm-up:
caches, CUDA graphs) not timed. Prints for each: run-rounds a second over all runs, seconds a
round of one run (alone) or of the pack, and for the pack the share of client calls stacked with
another run's, and the speed-up; then the largest difference between a packed run's final accuracy
and the same run's alone (float round-off: the stacks sum in another order). ``--stacked-conv`` and
``--stacked-compile`` as in `jobs.bench.batched`, for both sides (a compiled step's first round
compiles, for each stack shape). Needs no GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from typing import Any

from jobs.bench import batched as bench_batched
from jobs.bench import one_run


def varied(cfg: Any, vary: str, runs: int) -> list[Any]:
    """``runs`` configs: seeds 0.. (``seed``), or ``KEY=V1,V2,...``'s values (hp.NAME for an hp)."""
    from fedray.experiment.checks import from_dict

    if vary == "seed":
        return [dataclasses.replace(cfg, seed=s) for s in range(runs)]
    key, _, values = vary.partition("=")
    out = []
    for raw in values.split(",")[:runs]:
        d = cfg.to_dict()
        if key.startswith("hp."):
            d["hp"] = {**d["hp"], key[3:]: float(raw)}
        else:
            d[key] = type(d[key])(raw)
        out.append(from_dict(d))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.bench.pack", description=__doc__.split("\n\n")[0])
    one_run.add_args(ap)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--runs", type=int, default=4, help="runs in the pack (default 4)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds a run, the first untimed (default 4)")
    ap.add_argument("--vary", default="seed", help="seed (default), or KEY=V1,V2,... (hp.NAME for an hp)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as one actor)")
    bench_batched.add_stack_args(ap)
    args = ap.parse_args(argv)
    if args.rounds < 2 or args.runs < 2:
        print(f"{ap.prog}: --rounds and --runs must be 2 or more", file=sys.stderr)
        return 2
    cfg = one_run.picked(args, [*args.sets, f"rounds={args.rounds}"])
    if cfg is None:
        return 2

    import torch

    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import Finished, RoundDone, execute
    from fedray.sweeps.pack import Ended, execute_pack

    cuda = args.device.startswith("cuda")
    bench_batched.use_stack_args(args)

    def factory(cfg: Any, data: Any, packer: Any = None) -> Any:
        return make_local_federation(cfg, data, args.device, args.threads, packer=packer)

    def clock() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="bench_pack_") as out:
        base = dataclasses.replace(
            cfg,
            batched_clients="on",
            checkpoint_every=0,
            save_models=False,
            num_gpus_per_actor=1.0 if cuda else 0.0,
        )
        configs = varied(base, args.vary, args.runs)
        name = torch.cuda.get_device_name() if cuda else "cpu"
        print(
            f"{len(configs)} runs of {cfg.algorithm} on {cfg.dataset} ({cfg.partition}), {cfg.model}, "
            f"{cfg.num_clients} clients, {cfg.local_epochs} local epochs of batch {cfg.batch_size}, "
            f"varying {args.vary}; device {name}, {args.threads} thread(s); {args.rounds} rounds a run, the first untimed",
            flush=True,
        )
        # alone: each run's rounds after its first, summed over the runs
        alone_s, finals = 0.0, {}
        for k, c in enumerate(configs):
            c = dataclasses.replace(c, pack_runs="off", output=f"{out}/alone")
            first = None
            for ev in execute(c, factory, restart=True):
                if isinstance(ev, RoundDone) and ev.round == 1:
                    first = clock()
                elif isinstance(ev, Finished):
                    alone_s += clock() - first
                    finals[k] = ev.summary.get("final_accuracy")
        timed = len(configs) * (args.rounds - 1)
        print(
            f"alone    {timed / alone_s:8.3f} run-rounds/s   {alone_s / timed:8.3f} s a round of one run",
            flush=True,
        )
        # packed: from when every run has done its first round to when the last has finished
        packed = [dataclasses.replace(c, pack_runs="on", output=f"{out}/packed") for c in configs]
        done1, start, end, summaries = set(), None, None, {}
        for k, ev in execute_pack(packed, factory, [True] * len(packed)):
            if isinstance(ev, RoundDone) and ev.round == 1:
                done1.add(k)
                if len(done1) == len(packed):
                    start = clock()
            elif isinstance(ev, Finished):
                summaries[k] = ev.summary
            elif isinstance(ev, Ended):
                if ev.error is not None:
                    raise ev.error
                end = clock()
        pack_s = end - start
        calls = sum(s["batched_calls"] for s in summaries.values())
        merged = sum(s["packed_calls"] for s in summaries.values())
        print(
            f"packed   {timed / pack_s:8.3f} run-rounds/s   {pack_s / (args.rounds - 1):8.3f} s a round of the pack   "
            f"{merged} of {calls} client calls stacked with another run's"
        )
        print(f"speed-up {alone_s / pack_s:8.2f}x")
        diffs = [
            abs(summaries[k]["final_accuracy"] - finals[k])
            for k in summaries
            if finals.get(k) is not None and "final_accuracy" in summaries[k]
        ]
        if diffs:
            print(f"final accuracy, packed against alone: largest |difference| {max(diffs):.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
