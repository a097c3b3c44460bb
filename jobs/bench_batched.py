"""One round's local training of many clients, one client at a time against batched (fedray/batched.py).

    python -m jobs.bench_batched jobs/configs/bench_gpu_c2.yaml [--device cuda] [--clients 40] [--repeat 3] [--profile 15]

Builds the run's clients in this process (no Ray), then times FedAvg's local update of the first
``--clients`` clients from the same model: the per-client path (`local_update` on each client in
turn) and the batched one (`local_update_batched`: every client in one stack), each ``--repeat``
times after a warm-up, and prints the median seconds, the speed-up, the optimizer steps, the time
per stacked step, and how far the two paths' trained parameters are apart (largest absolute
difference, relative to the largest parameter); ``--profile N`` adds where one batched call's
time goes, operator by operator (torch.profiler). Needs no GPU (``--device cpu``, the default); on
a GPU it synchronises before reading the clock.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from jobs import one_run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.bench_batched", description=__doc__.split("\n\n")[0])
    one_run.add_args(ap)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--clients", type=int, default=40, help="clients trained (default 40)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as one actor)")
    ap.add_argument("--profile", type=int, default=0, metavar="ROWS",
                    help="also profile one batched call (torch.profiler) and print its ROWS costliest "
                         "operators by self time, on the host and on the device")  # fmt: skip
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from fedray.algorithms.rounds import local_update, local_update_batched
    from fedray.client import Task
    from fedray.data import build_federated_data
    from fedray.host import ClientHost
    from fedray.params import get_params

    cfg = one_run.picked(args, args.sets)
    if cfg is None:
        return 2
    torch.set_num_threads(args.threads)
    data = build_federated_data(cfg)
    task = Task.from_config(cfg, data.dataset.spec)
    host = ClientHost(task, data.dataset.train, data.clients, args.device, test=data.dataset.test)
    cids = host.client_ids[: args.clients]
    msg = {"params": get_params(task.build_model()), "round": 0}

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def per_client():
        return [local_update(host.client(c), None, msg)[0] for c in cids]

    def batched():
        return [
            r
            for r, _ in local_update_batched(
                [host.client(c) for c in cids], [None] * len(cids), [msg] * len(cids)
            )
        ]

    times: dict[str, list[float]] = {}
    got = {}
    for name, fn in (("per-client", per_client), ("batched", batched)):
        got[name] = fn()  # warm-up (and the replies compared below)
        for _ in range(args.repeat):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.setdefault(name, []).append(time.perf_counter() - t0)
    steps = [r["steps"] for r in got["per-client"]]
    a, b = got["per-client"], got["batched"]
    scale = max(float(np.abs(r["params"][k]).max()) for r in a for k in r["params"])
    diff = max(
        float(np.abs(x["params"][k] - y["params"][k]).max())
        for x, y in zip(a, b, strict=True)
        for k in x["params"]
    )
    pc, bt = statistics.median(times["per-client"]), statistics.median(times["batched"])
    print(f"{cfg.model} on {cfg.dataset}, {len(cids)} clients, {cfg.local_epochs} local epochs of batch "
          f"{cfg.batch_size}, device {args.device}, {args.threads} thread(s)")  # fmt: skip
    print(f"steps per client: min {min(steps)}, max {max(steps)}, total {sum(steps)}")
    print(f"per-client  {pc:8.3f} s  ({1000 * pc / sum(steps):.2f} ms per client step)")
    print(
        f"batched     {bt:8.3f} s  ({1000 * bt / max(steps):.2f} ms per stacked step of up to {len(cids)} clients)"
    )
    print(f"speed-up    {pc / bt:8.2f}x")
    print(f"largest |parameter difference| {diff:.3g} (largest parameter {scale:.3g})")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
        with profile(activities=acts) as prof:
            batched()
            sync()
        for key in ["self_cpu_time_total"] + (["self_cuda_time_total"] if len(acts) > 1 else []):
            print(f"\nbatched call, by {key}:")
            print(prof.key_averages().table(sort_by=key, row_limit=args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
