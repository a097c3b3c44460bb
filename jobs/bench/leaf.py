"""Benchmark: LEAF's data sets at their own scale, on generated LEAF-format JSON of their shape.

For FEMNIST (3,550 writers, about 227 samples each, LEAF's Table 1) and Shakespeare (1,129 speaking
roles, about 3,743 samples each), it writes JSON as LEAF's scripts do (``all_data/*.json``: users,
num_samples, user_data; random grey levels and random text over LEAF's 80 symbols, ``--fraction``
of each user's samples where disk or time is short), then, in this process:

- reads it as a run does (LEAF's split by sample; Shakespeare's roles too short to keep a test
  sample after LEAF's 79-sample gap dropped, as LEAF drops them), from the JSON, then from the arrays fedray keeps
  beside it, and prints both times and the arrays' size;
- runs rounds in-process at LEAF's setting (FEMNIST: FedAvg, 3 writers a round, batch 10, 1 epoch,
  lr 0.004, leaf_cnn; Shakespeare: 10 roles a round, lr 0.8, leaf_lstm; every client hosted), and
  with ``--spill`` SCAFFOLD at the same setting with ``client_state_memory_mb: 64`` (each sampled
  client keeps its control variate; those beyond 64 MB go to disk), printing seconds a round
  (median of the rounds after the first) and the process's peak resident memory.

    python -m jobs.bench.leaf [--only femnist,shakespeare] [--fraction 1.0] [--rounds 5] [--spill] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from fedray.data.leaf import FEMNIST, SHAKESPEARE, SHAKESPEARE_VOCAB, leaf_data, read_users

# LEAF's Table 1: users, mean and standard deviation of samples per user
SHAPES = {"femnist": (3550, 226.83, 88.94), "shakespeare": (1129, 3743.2, 6212.26)}
SETTING = {
    "femnist": dict(model="leaf_cnn", clients_per_round=3, lr=0.004),
    "shakespeare": dict(model="leaf_lstm", clients_per_round=10, lr=0.8),
}
USERS_A_FILE = 100


def write_json(kind: str, root: Path, fraction: float, seed: int = 0) -> int:
    """LEAF-format JSON of ``kind``'s shape under ``root/all_data``; returns the samples written."""
    users, mean, std = SHAPES[kind]
    rng = np.random.default_rng(seed)
    sizes = np.maximum(
        2,
        np.rint(
            rng.lognormal(
                np.log(mean) - 0.5 * np.log1p((std / mean) ** 2), np.sqrt(np.log1p((std / mean) ** 2)), users
            )
            * fraction
        ),
    ).astype(int)
    (root / "all_data").mkdir(parents=True, exist_ok=True)
    symbols = np.array(list(SHAKESPEARE_VOCAB))
    for start in range(0, users, USERS_A_FILE):
        names = [f"{kind[0]}{u:05d}" for u in range(start, min(users, start + USERS_A_FILE))]
        data = {"users": names, "num_samples": [], "user_data": {}}
        for name, n in zip(names, sizes[start : start + len(names)], strict=True):
            if kind == "femnist":
                grey = np.round(rng.integers(0, 256, (n, 784)) / 255, 4)
                x, y = grey.tolist(), rng.integers(0, 62, n).tolist()
            else:
                text = rng.choice(symbols, (n, 81))
                x, y = ["".join(r[:80]) for r in text], [r[80] for r in text]
            data["num_samples"].append(int(n))
            data["user_data"][name] = {"x": x, "y": y}
        (root / "all_data" / f"all_data_{start // USERS_A_FILE}.json").write_text(json.dumps(data))
    return int(sizes.sum())


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench(kind: str, root: Path, fraction: float, rounds: int, spill: bool) -> None:
    import fedray.data.leaf as leaf
    from fedray.experiment.checks import from_dict
    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import RoundDone, execute

    t0 = time.perf_counter()
    samples = write_json(kind, root, fraction)
    wrote = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in (root / "all_data").iterdir())
    t0 = time.perf_counter()
    users = read_users(FEMNIST if kind == "femnist" else SHAKESPEARE, root)
    from_json = time.perf_counter() - t0
    leaf._READ.clear()
    t0 = time.perf_counter()
    read_users(FEMNIST if kind == "femnist" else SHAKESPEARE, root)
    kept = time.perf_counter() - t0
    print(
        f"{kind}: {len(users.names):,} users, {samples:,} samples ({fraction:g} of LEAF's), JSON {size / 1e9:.2f} GB "
        f"written in {wrote:.0f} s; read from JSON {from_json:.1f} s, from the kept arrays {kept:.2f} s "
        f"({(users.x.nbytes + users.y.nbytes) / 1e6:,.0f} MB); peak {peak_mb():,.0f} MB",
        flush=True,
    )
    cases = [("fedavg", {})] + ([("scaffold", {"client_state_memory_mb": 64})] if spill else [])
    for algorithm, more in cases:
        cfg = from_dict(
            {
                "dataset": kind,
                "data_root": str(root),
                "algorithm": algorithm,
                "rounds": rounds,
                "local_epochs": 1,
                "batch_size": 10,
                "eval_every": rounds,
                "eval_train": False,
                "checkpoint_every": 0,
                "output": str(root / f"out-{algorithm}"),
                **SETTING[kind],
                **more,
            }
        )
        t0 = time.perf_counter()
        data = leaf_data(FEMNIST if kind == "femnist" else SHAKESPEARE, cfg.data_section)
        built = time.perf_counter() - t0
        del data
        seconds = [ev.seconds for ev in execute(cfg, make_local_federation) if isinstance(ev, RoundDone)]
        steady = statistics.median(seconds[1:-1] or seconds)  # the last round evaluates
        print(
            f"  {algorithm}{' (64 MB of client state in memory)' if more else ''}: {cfg.num_clients:,} clients "
            f"built in {built:.1f} s; "
            f"{steady:.2f} s a round (median of rounds 2..{rounds - 1}), with the evaluation {seconds[-1]:.1f} s; "
            f"peak {peak_mb():,.0f} MB",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.bench.leaf", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="femnist,shakespeare")
    ap.add_argument("--fraction", type=float, default=1.0, help="of each user's samples (default 1: LEAF's)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--spill", action="store_true", help="also SCAFFOLD with 64 MB of client state in memory")
    ap.add_argument("--dir", help="where the JSON goes (default: a temporary folder, removed)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for kind in args.only.split(","):
            bench(kind, Path(tmp) / kind, args.fraction, args.rounds, args.spill)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
