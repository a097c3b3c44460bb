"""Benchmark: FedCat's hand-offs under Ray against FedAvg with the same K participants.

Workload (FedCat paper's setting, shortened): real Fashion-MNIST, 100 clients, 10% per round
(K = 10), client-wise Dir(0.5), McMahan et al.'s CNN (1.66M parameters), batch 50, SGD lr 0.01
momentum 0.9, ``--epochs`` local epochs, ``--cycles`` FedCat cycles of K rounds. Both algorithms
run on one Ray session with the same actors.

Prints, per algorithm, the mean round time (steady state: rounds after the first), and per cycle
the bytes sent down and up (the protocol: K models each way per round for both) and the bytes the
coordinator itself received (the objects its ray.get returned), against K model copies. FedAvg's
coordinator receives K models every round; FedCat's receives the K copies once per cycle, when it
aggregates: in between they go from one client actor to the next.

    python -m jobs.bench.fedcat [--cycles 1] [--epochs 1] [--actors 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

WORKLOAD = dict(
    experiment="bench-fedcat",
    dataset="fmnist",
    model="mcmahan_cnn",
    num_clients=100,
    participation=0.1,
    partition="clientwise_dirichlet",
    partition_beta=0.5,
    batch_size=50,
    lr=0.01,
    momentum=0.9,
    weight_decay=0.0,
    eval_batch_size=1000,
    num_cpus_per_actor=1.0,
)


def measure(algorithm: str, cycles: int, epochs: int, actors: int, out: str) -> dict:
    import pandas as pd

    from actors.driver import run_on_ray
    from fedray.data import dataset_info
    from fedray.experiment.checks import from_dict
    from fedray.models import build_model
    from fedray.params import get_params, payload_nbytes

    k = int(WORKLOAD["num_clients"] * WORKLOAD["participation"])
    cfg = from_dict(
        {
            **WORKLOAD,
            "algorithm": algorithm,
            "rounds": cycles * k,
            "local_epochs": epochs,
            "eval_every": k,
            "num_actors": actors,
            "output": out,
        }
    )
    list(run_on_ray(cfg))
    m = pd.read_parquet(f"{out}/metrics")
    m = m[(m["run_id"] == cfg.run_id()) & (m["scope"] == "global")]
    by = m.pivot_table(index="round", columns="metric", values="value").sort_index()
    info = dataset_info(cfg.data_section)
    model_bytes = payload_nbytes(get_params(build_model(cfg.model, info.input_shape, info.num_classes)))
    cyc = by.groupby((by.index - 1) // k)[["bytes_down", "bytes_up", "bytes_received"]].sum()
    return {
        "algorithm": algorithm,
        "steady_round_seconds": float(by["seconds"].iloc[1:].mean()),
        "first_round_seconds": float(by["seconds"].iloc[0]),
        "model_bytes": model_bytes,
        "per_cycle": cyc.to_dict("records"),
        "received_per_round": by["bytes_received"].tolist(),
        "final_accuracy": float(by["accuracy"].dropna().iloc[-1]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    from actors.driver import connect
    from fedray.data import check_available
    from fedray.experiment.checks import from_dict

    check_available(from_dict({k: v for k, v in WORKLOAD.items() if k in ("dataset", "model")}).data_section)
    connect()
    results = []
    with tempfile.TemporaryDirectory() as out:
        for algorithm in ("fedavg", "fedcat"):
            r = measure(algorithm, args.cycles, args.epochs, args.actors, out)
            results.append(r)
            mb = r["model_bytes"] / 1e6
            print(
                f"{algorithm}: {r['steady_round_seconds']:.2f} s/round steady ({r['first_round_seconds']:.2f} s first), "
                f"accuracy {r['final_accuracy']:.4f}; one model = {mb:.2f} MB, K copies = {10 * mb:.1f} MB"
            )
            for i, c in enumerate(r["per_cycle"]):
                print(
                    f"  cycle {i + 1}: down {c['bytes_down'] / 1e6:.1f} MB, up {c['bytes_up'] / 1e6:.1f} MB, "
                    f"coordinator received {c['bytes_received'] / 1e6:.2f} MB "
                    f"({c['bytes_received'] / (10 * r['model_bytes']):.2f} x K models)"
                )
            per_round = ", ".join(f"{b / 1e3:.0f}" for b in r["received_per_round"])
            print(f"  coordinator received per round (kB): {per_round}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
