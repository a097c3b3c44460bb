"""How a stacked call's time grows with its width: the measurement behind packing runs.

    python -m jobs.bench.stack_widths CONFIG [--set KEY=VALUE] [--device cuda] [--widths 1,4,16]
        [--conv grouped,im2col]

Builds the config's clients in this process and trains every client's FedAvg update from one
model in one `batched.train_stacked` call, the clients repeated W times for each width W (W x the
clients' models in one stack, as W runs packed together would be). The first call at a width is a
warm-up, the second is timed. Prints, for each width: seconds a call, the stack's steps (its
largest client's), milliseconds a step, and the sample-steps a second.

``--cudnn-benchmark`` lets cuDNN pick its convolution algorithms by timing them (fedray keeps
that off: the pick is not reproducible); with ``--set cuda_deterministic=false``,
``--set channels_last=false`` or ``--set cuda_tf32=false`` it measures which kernel setting the
grouped convolutions are slow under.

``--conv im2col`` runs the same calls with every convolution of the stack computed as unfold and
one batched matrix product over the models (`fedray.engine.step_options`) in place of the grouped
convolution vmap makes of it: which the GPU does faster at which width. (The matmul variant of
2026-11-27, a broadcast matrix product per model's batch, 17x slower, is gone.)
"""

from __future__ import annotations

import argparse
import sys
import time

from jobs.bench import one_run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m jobs.bench.stack_widths", description=__doc__.split("\n\n")[0]
    )
    one_run.add_args(ap)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--widths", default="1,4,16")
    ap.add_argument("--conv", default="grouped", help="grouped, im2col or both (grouped,im2col)")
    ap.add_argument("--cudnn-benchmark", action="store_true", help="cuDNN picks its algorithms by timing")
    args = ap.parse_args(argv)
    cfg = one_run.picked(args, args.sets)
    if cfg is None:
        return 2

    import dataclasses

    import torch

    from fedray.data import build_federated_data
    from fedray.engine import batched, step_options
    from fedray.engine.client import num_steps
    from fedray.engine.update import LocalUpdate
    from fedray.experiment.local import make_local_federation

    data = build_federated_data(cfg.data_section)
    fed = make_local_federation(dataclasses.replace(cfg, batched_clients="on"), data, args.device, 1)[0]
    host = fed.host
    torch.backends.cudnn.benchmark = args.cudnn_benchmark  # after the host set its own CUDA settings
    clients = [host.client(cid) for cid in host.client_ids]
    params = fed.task.init_models(1)[0]
    bs = cfg.batch_size
    sizes = [c.num_examples for c in clients]
    real = sum(num_steps(n, bs, False) * cfg.local_epochs for n in sizes)
    print(
        f"{cfg.algorithm} cell: {len(clients)} clients, sizes {min(sizes)}-{max(sizes)}, "
        f"{cfg.local_epochs} epochs of batch {bs}; device {args.device}; cuda_deterministic "
        f"{cfg.cuda_deterministic}, cuda_tf32 {cfg.cuda_tf32}, channels_last {cfg.channels_last}, "
        f"cudnn.benchmark {args.cudnn_benchmark}"
    )

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def timed(cs, width: int) -> tuple[float, int]:
        ups = [LocalUpdate(params, 0) for _ in cs]
        for _ in range(2):
            sync()
            t0 = time.perf_counter()
            got = batched.train_stacked(cs, ups)
            sync()
            took = time.perf_counter() - t0
        return took, max(t.stats.steps for t in got)

    for conv in args.conv.split(","):
        step_options.use(conv=conv)
        for w in [int(v) for v in args.widths.split(",")]:
            took, steps = timed(clients * w, w)
            samples = real * bs * w  # an upper bound on the real sample-steps (last batches full)
            print(
                f"conv {conv:8s} width {w:3d} ({len(clients) * w:5d} models): {took:8.3f} s a call, "
                f"{steps} steps, {1000 * took / steps:7.2f} ms a step, {samples / took:,.0f} sample-steps/s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
