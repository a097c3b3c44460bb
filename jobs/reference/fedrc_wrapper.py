"""Run LINs-lab/FedRC's ``run_experiment.py`` (commit ce79229) unchanged on a ``client_files``
folder, on the CPU (or the first GPU: ``--device cuda``), and record its per-round global numbers.
Run by `jobs.reference.fedrc` under the reference's own Python (its dependencies: torch,
torchvision, scikit-learn, tensorboard, networkx, optionally cvxpy), in a working folder of its
own (the script writes ``./logs/fmnist-c/`` there).

What this wrapper changes, from outside, and why:

- ``learners.autoencoder``, which ``utils/utils.py`` imports and the commit does not have, is an
  empty module (nothing the FMNIST-C runs call is in it);
- ``args.n_gmm`` (read, never defined by the argument parser) is 1, and the module-level ``args``
  that ``init_clients`` reads (``args.phi_model``) is the run's arguments, as when the script runs
  as ``__main__``;
- the device is ``--device``: ``cpu`` (the parser takes a GPU index only), or ``cuda`` for GPU 0,
  the script's default; cuDNN is set deterministic, without benchmarking, as the script's
  ``__main__`` sets it;
- ``cvxpy``, which ``utils/decentralized.py`` imports for the decentralised methods only, may be
  missing: a module that says so when one of those runs touches it stands in (the solvers it
  pulls in are over 60 MB; the methods driven here never call it);
- scikit-learn's ``AgglomerativeClustering(affinity=...)`` (renamed ``metric`` in 1.2, removed in
  1.4; CFL's split calls it) is given its new name;
- the clients come from the ``client_files`` folder instead of ``./data/fmnist-c/*.pkl``, through
  the script's own dataset class (``SubFEMNISTC``: ToTensor, Normalize(0.1307, 0.3081)) and its
  loaders' settings (batch ``--bz``, shuffled; training batches drop the last partial one; the
  "validation" split is the training split, as the script's): the same clients and the same
  90/10 split fedray reads (the script's own split is unseeded);
- the global numbers it logs to TensorBoard (``train/global`` and ``test/global``: Train/Metric,
  Test/Metric, Train/Loss, Test/Loss per logged round) are also kept and written to ``--result`` as
  JSON, with the wall time of each round, the device, and at each logged round what the clusters
  are: every training client's ``learners_weights`` (its omega, in client order) and, for the
  clustered method, the aggregator's ``clusters_indices`` (read after ``Aggregator.write_logs``,
  which every aggregator inherits; nothing is changed).

Nothing of fedray is imported: this file runs in the reference's environment.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import types
from pathlib import Path


def client_loaders(folder: Path, batch_size: int, test: bool, datasets_module, loader_cls):
    """The script's get_fmnistC_loaders result, from client_files: (train, val, test iterators,
    client types, feature types)."""
    import numpy as np

    pattern = "test_client_{:04d}.npz" if test else "client_{:04d}.npz"
    out = ([], [], [], [], [])
    i = 0
    while (folder / pattern.format(i)).is_file():
        with np.load(folder / pattern.format(i), allow_pickle=False) as z:
            x = np.concatenate([z["x_train"], z["x_test"]]).astype(np.uint8)
            y = np.concatenate([z["y_train"], z["y_test"]]).astype(np.int64)
            n_train = len(z["y_train"])
            kind = int(z["group"]) if test else int(z["reference_type"])
        train_idx, test_idx = list(range(n_train)), list(range(n_train, len(y)))
        sets = [
            datasets_module.SubFEMNISTC(ix, cifar10_data=x, cifar10_targets=y)
            for ix in (train_idx, train_idx, test_idx)
        ]
        out[0].append(loader_cls(sets[0], batch_size=batch_size, shuffle=True, drop_last=True))
        out[1].append(loader_cls(sets[1], batch_size=batch_size, shuffle=True, drop_last=False))
        out[2].append(loader_cls(sets[2], batch_size=batch_size, shuffle=True, drop_last=False))
        out[3].append(kind)
        out[4].append([0] * len(y))
        i += 1
    if i == 0:
        raise SystemExit(f"fedrc_wrapper: no {pattern.format(0)} in {folder}")
    return out


def shim_agglomerative() -> None:
    """``AgglomerativeClustering(affinity=X)`` as ``metric=X``, for the modules that import it next."""
    import sklearn.cluster

    agglomerative = sklearn.cluster.AgglomerativeClustering

    def with_affinity(*args, affinity=None, **kwargs):
        if affinity is not None:
            kwargs.setdefault("metric", affinity)
        return agglomerative(*args, **kwargs)

    sklearn.cluster.AgglomerativeClustering = with_affinity


class _Missing(types.ModuleType):
    """An optional module that is not installed: any use names it."""

    def __getattr__(self, name: str):
        if name.startswith("__"):  # what introspection asks of any module (inspect, pickle)
            raise AttributeError(name)
        raise ImportError(
            f"{self.__name__} is not installed (needed by the reference's decentralised methods)"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", required=True, type=Path)
    p.add_argument("--clients", required=True, type=Path, help="the client_files folder")
    p.add_argument("--result", required=True, type=Path, help="the JSON this writes")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="-- then run_experiment.py's arguments")
    args = p.parse_args(argv)
    script_args = args.script_args[1:] if args.script_args[:1] == ["--"] else args.script_args
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    sys.path.insert(0, str(args.checkout))
    sys.modules["learners.autoencoder"] = types.ModuleType("learners.autoencoder")
    try:
        import cvxpy  # noqa: F401 - only to see whether it is there
    except ImportError:
        sys.modules["cvxpy"] = _Missing("cvxpy")
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    shim_agglomerative()
    import datasets as ref_datasets
    import run_experiment as rx  # noqa: E402 - the reference's module, importable only now
    from torch.utils.data import DataLoader

    run = rx.parse_args(script_args)
    run.device, run.n_gmm = ("cpu" if args.device == "cpu" else 0), 1
    rx.args = run
    random.seed(run.seed)
    folder = args.clients.resolve()

    def loaders(root_path, batch_size, is_validation, test=False):
        return client_loaders(folder, batch_size, test, ref_datasets, DataLoader)

    rx.get_fmnistC_loaders = loaders
    logged: dict[str, dict[int, dict[str, float]]] = {"train": {}, "test": {}}
    stamps: dict[int, float] = {}
    start = time.perf_counter()
    writer_cls = rx.SummaryWriter

    class Recording(writer_cls):  # the global writers' scalars, kept as they are logged
        def __init__(self, log_dir=None, *a, **kw):
            super().__init__(log_dir, *a, **kw)
            parts = Path(str(log_dir)).parts
            self.kind = parts[-2] if parts[-1] == "global" else None

        def add_scalar(self, tag, value, step=None, *a, **kw):
            if self.kind is not None:
                logged[self.kind].setdefault(int(step), {})[tag] = float(value)
                stamps.setdefault(int(step), time.perf_counter() - start)
            return super().add_scalar(tag, value, step, *a, **kw)

    rx.SummaryWriter = Recording
    import aggregator as ref_aggregator

    def record() -> dict:
        rounds = sorted(set(logged["train"]) | set(logged["test"]))
        return {
            "args": script_args,
            "threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
            "total_seconds": time.perf_counter() - start,
            "rounds": [
                {
                    "round": r,
                    "seconds": stamps[r],
                    "train": logged["train"].get(r, {}),
                    "test": logged["test"].get(r, {}),
                    "clusters": clusters.get(r),
                }
                for r in rounds
            ],
        }

    clusters: dict[int, dict] = {}
    partial = args.result.with_suffix(".partial.json")
    partial.parent.mkdir(parents=True, exist_ok=True)
    write_logs = ref_aggregator.Aggregator.write_logs

    def write_logs_and_clusters(self):
        write_logs(self)
        clusters[int(self.c_round)] = {
            "omega": [[float(w) for w in c.learners_ensemble.learners_weights] for c in self.clients],
            "clusters": [[int(i) for i in c] for c in self.clusters_indices]
            if hasattr(self, "clusters_indices")
            else None,
        }
        partial.write_text(json.dumps(record(), indent=1))  # what a run stopped early leaves

    ref_aggregator.Aggregator.write_logs = write_logs_and_clusters
    os.makedirs(os.path.join("logs", run.experiment), exist_ok=True)
    rx.run_experiment(run)
    args.result.write_text(json.dumps(record(), indent=1))
    partial.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
