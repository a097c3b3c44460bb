"""Benchmark: fedray (Ray and --local) against plain PyTorch loops over the same clients.

Workload (issue 2): real Fashion-MNIST, 40 clients, Dir(0.5), simple CNN, 1 local epoch, 3 rounds,
batch 64, SGD lr 0.01 momentum 0.9, evaluation on the 10,000 test images every round. Every
variant does the same work per round: each client trains from the global weights, the server
takes the weighted average, the global model is evaluated.

Variants:
- ``ray``: ``fedray run`` semantics, a fresh local Ray (start included in end to end).
- ``local``: ``fedray run --local`` (one process, clients one after another).
- ``plain``: a plain PyTorch loop in one process (torch's default thread count).
- ``plain-pool``: plain PyTorch with one worker process per core, one thread each, clients
  handed out dynamically (the fastest plain loop on a small machine).

Prints seconds per round (steady state = rounds after the first) and end to end for each, and
for fedray the steady round split into training (with aggregation) and evaluation. Every variant
evaluates the global model on the test set; ``--eval-train`` adds fedray's default evaluation of
every client's training split (60,000 samples a round, which the plain loops do not do).
Targets: Ray's steady-state round within 1.1x of the fastest plain loop; end to end within 1.5x.

    python -m jobs.bench [--rounds 3] [--clients 40] [--only ray,plain-pool] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedray.config.keys import Config
from fedray.data import build_federated_data, check_available
from fedray.experiment.checks import from_dict
from jobs.bench import one_run

WORKLOAD = dict(
    experiment="bench",
    dataset="fmnist",
    model="simple_cnn",
    num_clients=40,
    partition="dirichlet",
    partition_beta=0.5,
    local_epochs=1,
    rounds=3,
    batch_size=64,
    lr=0.01,
    momentum=0.9,
    weight_decay=1e-5,
    eval_batch_size=1000,
    num_cpus_per_actor=1.0,
    # The plain loops evaluate the global model on the test set only; fedray's default also
    # evaluates every client's training split (60,000 samples a round, six times the test set).
    eval_train=False,
)


# ----------------------------------------------------------------------------------------------------
# fedray
# ----------------------------------------------------------------------------------------------------


def _fedray(cfg: Config, events, t0: float) -> dict[str, Any]:
    """Round times, accuracy and placement; ``start``: where the seconds before the first round went
    (``t0``: when the variant began, on the perf_counter clock)."""
    from fedray.experiment.loop import Finished, RoundDone, Started

    rounds, placement, start = [], {}, {}
    for ev in events:
        if isinstance(ev, Started):
            now, wall = time.perf_counter(), time.time()
            begun = now - (wall - ev.timings["begun"])  # execute's start on this clock (same machine)
            start = {
                "before execute": begun - t0,
                "data": ev.timings["data"],
                "federation": ev.timings["federation"],
                "until the first round": now - t0,
            }
        elif isinstance(ev, RoundDone):
            rounds.append(
                (
                    ev.seconds + ev.metrics.get("eval_seconds", 0.0),
                    ev.metrics["accuracy"],
                    ev.metrics.get("eval_seconds", 0.0),
                )
            )
        elif isinstance(ev, Finished):
            placement = ev.summary["placement"]
    return {
        "round_seconds": [r[0] for r in rounds],
        "eval_seconds": [r[2] for r in rounds],
        "accuracy": rounds[-1][1],
        "placement": placement,
        "start": start,
    }


def bench_ray(cfg: Config) -> dict[str, Any]:
    t0 = time.perf_counter()
    import ray

    from actors.driver import connect, run_on_ray

    if ray.is_initialized():
        raise RuntimeError("bench_ray must start its own Ray (end to end includes the start)")
    imported = time.perf_counter()
    ours = connect()  # attaches to a Ray that `ray start` left running here, else starts one
    started = time.perf_counter()
    try:
        out = _fedray(cfg, run_on_ray(cfg), t0)
    finally:
        ray.shutdown()
    coordinator = out["start"]["before execute"] - (started - t0)
    out["placement"] = {**out["placement"], "ray": "started here" if ours else "attached (ray start)"}
    out["start"] = {
        "import ray": imported - t0,
        ("ray.init" if ours else "ray.init (attach)"): started - imported,
        "coordinator and actors start": coordinator,
        **{k: v for k, v in out["start"].items() if k != "before execute"},
    }
    return out


def bench_local(cfg: Config) -> dict[str, Any]:
    t0 = time.perf_counter()
    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import execute

    return _fedray(cfg, execute(cfg, make_local_federation), t0)


# ----------------------------------------------------------------------------------------------------
# Plain PyTorch
# ----------------------------------------------------------------------------------------------------

_W: dict[str, Any] = {}  # per-process data for the plain loops


def _plain_setup(cfg_dict: dict, threads: int) -> None:
    torch.set_num_threads(threads)
    cfg = from_dict(cfg_dict)
    data = build_federated_data(cfg.data_section)
    ds = data.dataset
    _W["x"] = torch.from_numpy(ds.train.x.astype(np.float32) / 255.0)
    _W["y"] = torch.from_numpy(ds.train.y)
    _W["idx"] = {c: ix.train for c, ix in data.clients.items()}
    _W["cfg"] = cfg
    from fedray.models import build_model

    _W["model"] = build_model(cfg.model, ds.spec.input_shape, ds.spec.num_classes)
    _W["test"] = (torch.from_numpy(ds.test.x.astype(np.float32) / 255.0), torch.from_numpy(ds.test.y))
    if cfg.channels_last:  # the same memory format as fedray's trainer, for a like-for-like loop
        _W["model"] = _W["model"].to(memory_format=torch.channels_last)
        _W["x"] = _W["x"].contiguous(memory_format=torch.channels_last)
        _W["test"] = (_W["test"][0].contiguous(memory_format=torch.channels_last), _W["test"][1])


def _plain_client(job: tuple[int, int, dict]) -> tuple[int, dict, int]:
    cid, rnd, state = job
    cfg, model = _W["cfg"], _W["model"]
    model.load_state_dict(state)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    idx = _W["idx"][cid]
    g = np.random.default_rng([cfg.seed, cid, rnd])
    for _ in range(cfg.local_epochs):
        order = g.permutation(idx)
        for s in range(0, len(order), cfg.batch_size):
            b = order[s : s + cfg.batch_size]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(_W["x"][b]), _W["y"][b]).backward()
            opt.step()
    return cid, {k: v.detach().clone() for k, v in model.state_dict().items()}, len(idx)


def _average(results: list[tuple[int, dict, int]]) -> dict:
    total = sum(n for _, _, n in results)
    return {k: sum(s[k] * (n / total) for _, s, n in results) for k in results[0][1]}


@torch.no_grad()
def _evaluate(state: dict) -> float:
    model = _W["model"]
    model.load_state_dict(state)
    model.eval()
    x, y = _W["test"]
    correct = sum(
        int((model(x[s : s + 1000]).argmax(1) == y[s : s + 1000]).sum()) for s in range(0, len(y), 1000)
    )
    return correct / len(y)


def _plain_loop(cfg: Config, run_clients: Callable[[list[tuple[int, int, dict]]], list]) -> dict[str, Any]:
    state = {k: v.clone() for k, v in _W["model"].state_dict().items()}
    seconds, acc = [], 0.0
    for rnd in range(cfg.rounds):
        t0 = time.perf_counter()
        results = sorted(run_clients([(c, rnd, state) for c in sorted(_W["idx"])]), key=lambda r: r[0])
        state = _average(results)
        acc = _evaluate(state)
        seconds.append(time.perf_counter() - t0)
    return {"round_seconds": seconds, "accuracy": acc}


def bench_plain(cfg: Config) -> dict[str, Any]:
    threads = os.cpu_count() or 1
    _plain_setup(cfg.to_dict(), threads)
    out = _plain_loop(cfg, lambda jobs: [_plain_client(j) for j in jobs])
    out["placement"] = {"processes": 1, "threads": threads}
    return out


def bench_plain_pool(cfg: Config) -> dict[str, Any]:
    n = os.cpu_count() or 1
    ctx = mp.get_context("spawn")  # fork after torch has started threads is unsafe
    with ctx.Pool(n, initializer=_plain_setup, initargs=(cfg.to_dict(), 1)) as pool:
        _plain_setup(cfg.to_dict(), n)  # the parent aggregates and evaluates while the workers idle
        out = _plain_loop(cfg, lambda jobs: pool.map(_plain_client, jobs, chunksize=1))
    out["placement"] = {"processes": n, "threads_per_process": 1}
    return out


VARIANTS: dict[str, Callable[[Config], dict[str, Any]]] = {
    "ray": bench_ray,
    "local": bench_local,
    "plain": bench_plain,
    "plain-pool": bench_plain_pool,
}


def _run_variant(name: str, cfg_dict: dict, queue) -> None:
    """Each variant in a fresh process: no warm imports, caches or Ray left over from another."""
    t0 = time.perf_counter()
    try:
        res = VARIANTS[name](from_dict(cfg_dict))
        res["end_to_end"] = time.perf_counter() - t0
        queue.put(res)
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        queue.put({"error": f"{type(e).__name__}: {e}"})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fedray bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=WORKLOAD["rounds"])
    ap.add_argument(
        "--eval-train",
        action="store_true",
        help="fedray also evaluates every client's training split each round (its default; "
        "the plain loops do not, so it is off here)",
    )
    ap.add_argument("--clients", type=int, default=WORKLOAD["num_clients"])
    ap.add_argument(
        "--only", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}"
    )
    ap.add_argument("--data-root", default="", help="Fashion-MNIST folder (default: the Debian package path)")
    ap.add_argument("--output", default="out/bench", help="results folder for the fedray variants")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every variant this many times (order alternates), report the best",
    )
    ap.add_argument("--json", help="also write the figures to this JSON file")
    ap.add_argument(
        "--memory-format",
        choices=("channels_last", "contiguous"),
        default="channels_last",
        help="images and conv weights in every variant (fedray: config key channels_last)",
    )
    args = ap.parse_args(argv)
    names = one_run.picked_names(args.only, VARIANTS, "fedray bench", "variant")
    if names is None:
        return 2
    cfg = from_dict(
        {
            **WORKLOAD,
            "rounds": args.rounds,
            "num_clients": args.clients,
            "data_root": args.data_root,
            "output": args.output,
            "channels_last": args.memory_format == "channels_last",
            "eval_train": args.eval_train,
        }
    )
    check_available(cfg.data_section)
    build_federated_data(cfg.data_section)  # warm the page cache so no variant pays for the first disk read

    print(
        f"workload: {cfg.dataset}, {cfg.num_clients} clients, Dir({cfg.partition_beta}), {cfg.model}, "
        f"{cfg.local_epochs} local epoch, {cfg.rounds} rounds, batch {cfg.batch_size}, {args.memory_format}; {os.cpu_count()} CPUs",
        flush=True,
    )
    results: dict[str, dict[str, Any]] = {}
    ctx = mp.get_context("spawn")
    for rep in range(args.repeat):
        for name in names if rep % 2 == 0 else names[::-1]:
            q = ctx.Queue()
            # Each fedray variant writes a fresh run into its own output subfolder.
            cfg_dict = {**cfg.to_dict(), "output": os.path.join(args.output, name, str(time.time_ns()))}
            p = ctx.Process(target=_run_variant, args=(name, cfg_dict, q))
            p.start()
            res = q.get()
            p.join()
            if "error" in res:
                print(f"{name:>11}: FAILED {res['error']}", flush=True)
                results.setdefault(name, res)
                continue
            rs = res["round_seconds"]
            res["steady_round"] = float(np.mean(rs[1:] if len(rs) > 1 else rs))
            print(
                f"{name:>11}: steady round {res['steady_round']:6.2f} s   end to end {res['end_to_end']:6.1f} s   "
                f"rounds {', '.join(f'{s:.2f}' for s in rs)}   accuracy {res['accuracy']:.4f}   {res['placement']}",
                flush=True,
            )
            if res.get("eval_seconds"):
                ev = res["eval_seconds"]
                steady_eval = float(np.mean(ev[1:] if len(ev) > 1 else ev))
                print(
                    " "
                    * 13
                    + f"steady round: training and aggregation {res['steady_round'] - steady_eval:.2f} s, "
                    f"evaluation {steady_eval:.2f} s",
                    flush=True,
                )
            if res.get("start"):
                print(
                    " " * 13 + "start: " + ", ".join(f"{k} {v:.1f} s" for k, v in res["start"].items()),
                    flush=True,
                )
            best = results.get(name)
            if best is None or "error" in best:
                results[name] = {**res, "runs": [res]}
            else:
                best["runs"].append(res)
                best["steady_round"] = min(best["steady_round"], res["steady_round"])
                best["end_to_end"] = min(best["end_to_end"], res["end_to_end"])
    if args.repeat > 1:
        print(f"best of {args.repeat}:")
        for name, r in results.items():
            if "error" not in r:
                print(
                    f"{name:>11}: steady round {r['steady_round']:6.2f} s   end to end {r['end_to_end']:6.1f} s"
                )

    plain = {k: v for k, v in results.items() if k.startswith("plain") and "error" not in v}
    if "ray" in results and "error" not in results["ray"] and plain:
        best_round = min(plain, key=lambda k: plain[k]["steady_round"])
        best_e2e = min(plain, key=lambda k: plain[k]["end_to_end"])
        r_round = results["ray"]["steady_round"] / plain[best_round]["steady_round"]
        r_e2e = results["ray"]["end_to_end"] / plain[best_e2e]["end_to_end"]
        print(f"ray / fastest plain ({best_round}) steady round: {r_round:.2f}x (target <= 1.10)")
        print(f"ray / fastest plain ({best_e2e}) end to end:   {r_e2e:.2f}x (target <= 1.50)")
        results["ratios"] = {"steady_round": r_round, "end_to_end": r_e2e}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
