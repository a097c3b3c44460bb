"""Checkpoint cost: time and size per checkpoint, the time to verify and read one back, and the
overhead on the round time at a given ``checkpoint_every``.

    python -m jobs.bench.checkpoint jobs/configs/fmnist_fedavg.yaml --set num_clients=40 --rounds 4 --every 2
    python -m jobs.bench.checkpoint jobs/configs/fedrc_fmnist_small.yaml --only algorithm=fedrc --rounds 4 --every 2

Runs the config (on Ray unless ``--local``) for ``--rounds`` rounds with a checkpoint every
``--every`` rounds, into a scratch folder (removed at the end unless ``--keep``), and prints figures.
A sweep file is accepted with ``--only`` picking one of its runs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from jobs.bench import one_run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.bench.checkpoint", description=__doc__.split("\n\n")[0])
    one_run.add_args(ap)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument(
        "--default-every",
        type=int,
        default=None,
        help="checkpoint_every for the overhead (default: the config's)",
    )
    ap.add_argument("--local", action="store_true")
    ap.add_argument("--output", help="results folder (default: a scratch folder, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args(argv)

    from fedray.experiment.checks import from_dict
    from fedray.experiment.loop import Checkpointed, RoundDone, Started
    from fedray.storage.blobs import read_blob
    from fedray.storage.checkpoint import Checkpoints

    out = Path(args.output or tempfile.mkdtemp(prefix="fedray-ckpt-"))
    sets = [
        *args.sets,
        f"rounds={args.rounds}",
        f"checkpoint_every={args.every}",
        "keep_checkpoints=1",
        "save_models=false",
        f"output={out}",
    ]
    cfg = one_run.picked(args, sets)
    if cfg is None:
        return 2
    default_every = args.default_every or from_dict({}).checkpoint_every
    if args.local:
        from fedray.experiment.local import make_local_federation
        from fedray.experiment.loop import execute

        events = execute(cfg, make_local_federation, restart=True)
    else:
        from actors.driver import run_on_ray

        events = run_on_ray(cfg, restart=True)
    rounds, ckpts = [], []
    try:
        for ev in events:
            if isinstance(ev, Started):
                print(
                    f"{cfg.algorithm} on {cfg.dataset}, {ev.num_clients} clients, {ev.placement.get('actors')} actors; "
                    f"{args.rounds} rounds, a checkpoint every {args.every}",
                    flush=True,
                )
            elif isinstance(ev, RoundDone):
                rounds.append(ev.seconds)
                print(f"  round {ev.round}: {ev.seconds:.2f} s", flush=True)
            elif isinstance(ev, Checkpointed):
                ckpts.append(ev)
                print(
                    f"  checkpoint after round {ev.round}: {ev.bytes / 1e6:.1f} MB in {ev.seconds:.2f} s "
                    f"({ev.bytes / 1e6 / max(ev.seconds, 1e-9):.0f} MB/s)",
                    flush=True,
                )
        t0 = time.perf_counter()
        latest = Checkpoints(cfg.output, cfg.run_id()).latest()
        verify = time.perf_counter() - t0
        t0 = time.perf_counter()
        read_blob(latest.path / "state.npz")
        for name in latest.files:
            if name.startswith("clients/"):
                read_blob(latest.path / name)
        read = time.perf_counter() - t0
        steady = rounds[1:] or rounds
        round_s = sum(steady) / len(steady)
        ck_s = sum(c.seconds for c in ckpts) / len(ckpts)
        size = ckpts[-1].bytes
        print(
            f"checkpoint: {size / 1e6:.1f} MB ({len(latest.files)} files), written in {ck_s:.2f} s on average; "
            f"verified (SHA-256) in {verify:.2f} s, read back in {read:.2f} s"
        )
        print(
            f"round: {round_s:.2f} s (steady); overhead at checkpoint_every={default_every}: "
            f"{100 * ck_s / (default_every * round_s):.1f}% of the round time"
        )
    finally:
        if not args.output and not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
