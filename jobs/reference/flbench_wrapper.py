"""Run KarhouTam/FL-bench's FedLC (``src/server/fedlc.py``, ``src/client/fedlc.py``: its server and
client classes unchanged) on fedray's clients, from outside, and write what it did to a JSON file
(the record the harness imports).

    python -m jobs.reference.flbench_wrapper --checkout PATH --result OUT.json [--threads T] -- \\
        src/server/fedlc.py --dataset fmnist --partition-file F --model simple_cnn --rounds R ... --tau 1

FL-bench's entry point (``main.py``) is a Hydra app that reads ``config/defaults.yaml`` plus the
command line, merges it over ``src/utils/constants.py``'s DEFAULTS (``parse_args``) and builds the
method's server, which reads ``data/DATASET/args.json`` and ``partition.pkl`` under the checkout
(``FLBENCH_ROOT``) and writes into Hydra's run folder. This wrapper does what ``main.py`` does:

- the config: the checkout's ``config/defaults.yaml`` with the run's settings (method fedlc, the
  dataset's name, seed, join_ratio = participation, global_epoch = rounds, local_epoch, batch_size,
  SGD lr / momentum / weight_decay, ``fedlc.tau``; serial mode, CPU; no client-side evaluation, a
  centralized test after every round; no logs, plots or metric files), through the checkout's own
  ``parse_args`` as ``main.py`` calls it;
- its files: ``args.json`` and ``partition.pkl`` written in FL-bench's format into the run's working
  folder, which the server module reads as its ``FLBENCH_ROOT``; ``HydraConfig.get()`` answers that
  folder as the run's output folder (no Hydra app is started);
- the clients: the partition file's training indices, into one data set of fedray's tensors (the
  training split, then the test split, as FL-bench's own FashionMNIST class concatenates them),
  with no normalisation (FL-bench's transforms normalise by the data set's mean and std; here both
  sides train on fedray's x / 255, NIID-Bench's scaling, so the two see the same inputs). The test
  split's indices are client 0's ``test`` list, which only the centralized test reads (client-side
  evaluation is off);
- the model: fedray's ``model`` with FL-bench's DecoupledModel interface (``base`` = the encoder,
  ``classifier`` = the last layer), drawn where FL-bench draws its own (``init_model``, right after
  ``fix_random_seed``), in PyTorch's default initialisation, as NIID-Bench and fedray draw the simple
  CNN.

After every round the server tests the global model on the test split (``test_global_model``); the
wrapper records FL-bench's accuracy (``flbench_accuracy``, percent) and the exact fraction right
(``accuracy``, the one imported), with the round's wall time and a SHA-256 of the weights.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from jobs.reference import borrowed
from jobs.reference.wrapper_argv import parse_wrapper_argv

NEEDS = ("hydra", "omegaconf", "rich", "pynvml")  # FL-bench's imports beyond fedray's own


def missing_modules() -> list[str]:
    """The modules FL-bench imports that this environment lacks (`pip install -e ".[flbench]"`)."""
    return [m for m in NEEDS if importlib.util.find_spec(m) is None]


def flbench_config(checkout: Path, a: Any, dataset: str) -> Any:
    """The run's config as FL-bench's ``main.py`` would build it from ``config/defaults.yaml`` and
    the run's settings (the checkout's ``parse_args`` does the merge)."""
    from omegaconf import OmegaConf

    config = OmegaConf.load(checkout / "config" / "defaults.yaml")
    OmegaConf.update(config, "method", "fedlc")
    OmegaConf.update(config, "dataset.name", dataset)
    settings = {
        "seed": a.seed,
        "join_ratio": a.participation,
        "global_epoch": a.rounds,
        "local_epoch": a.local_epochs,
        "batch_size": a.batch_size,
        "reset_optimizer_on_global_epoch": True,
        "buffers": "global",
        "client_side_evaluation": False,
        "use_cuda": False,
        "monitor": None,
        "save_log": False,
        "save_model": False,
        "save_learning_curve_plot": False,
        "save_metrics": False,
        "verbose_gap": 10**9,
        "test": {
            "client": {"interval": -1, "finetune_epoch": 0, "train": False, "val": False, "test": False},
            "server": {
                "interval": 1,
                "train": False,
                "val": False,
                "test": True,
                "model_in_train_mode": False,
            },
        },
    }
    for key, value in settings.items():
        OmegaConf.update(config, f"common.{key}", value, merge=True)
    OmegaConf.update(config, "mode", "serial")
    for key, value in {
        "name": "sgd",
        "lr": a.lr,
        "momentum": a.momentum,
        "weight_decay": a.weight_decay,
        "dampening": 0,
        "nesterov": False,
    }.items():
        OmegaConf.update(config, f"optimizer.{key}", value)
    OmegaConf.update(config, "lr_scheduler.name", None)
    OmegaConf.update(config, "fedlc", {"tau": a.tau}, merge=False)
    functional = importlib.import_module("src.utils.functional")
    server = importlib.import_module("src.server.fedlc").FedLCServer
    return functional.parse_args(config, "fedlc", server.get_hyperparams)


def write_flbench_data(
    root: Path, dataset: str, train: dict[int, list[int]], test: list[int], seed: int
) -> None:
    """FL-bench's ``data/DATASET/args.json`` and ``partition.pkl`` for these clients, under ``root``
    (the wrapper's own files, in its working folder: FL-bench's server reads them)."""
    import numpy as np

    folder = root / "data" / dataset
    folder.mkdir(parents=True, exist_ok=True)
    n = len(train)
    args = {
        "client_num": n,
        "test_ratio": 0.0,
        "val_ratio": 0.0,
        "seed": seed,
        "split": "sample",
        "IID_ratio": 0.0,
        "monitor_window_name_suffix": f"{dataset}-{n}clients-fedray-partition",
    }
    (folder / "args.json").write_text(json.dumps(args))

    def ints(ix) -> np.ndarray:  # as FL-bench's generate_data.py writes them (an empty list would be float)
        return np.asarray(ix, dtype=np.int64)

    indices = [
        {"train": ints(train[c]), "val": ints([]), "test": ints(test if c == 0 else [])} for c in range(n)
    ]
    partition = {
        "separation": {"train": list(range(n)), "val": [], "test": [], "total": n},
        "data_indices": indices,
    }
    with open(folder / "partition.pkl", "wb") as f:
        pickle.dump(partition, f)


def main(argv: list[str] | None = None) -> int:
    parser = borrowed.script_parser("flbench_wrapper SCRIPT")
    parser.add_argument("--tau", type=float, required=True)
    parsed = parse_wrapper_argv(sys.argv[1:] if argv is None else argv, "flbench_wrapper", parser)
    if parsed is None:
        return 2
    opts, script, script_args, a = parsed
    missing = missing_modules()
    if missing:
        print(
            f'flbench_wrapper: FL-bench needs {", ".join(missing)}, missing here: pip install -e ".[flbench]"',
            file=sys.stderr,
        )
        return 2

    import numpy as np
    import torch
    from omegaconf import OmegaConf

    from fedray.models import build_model
    from fedray.storage.files import write_text_atomic
    from jobs.reference.niid_wrapper import model_sha256, weights_finite

    if opts.threads:
        torch.set_num_threads(opts.threads)
    os.chdir(opts.workdir)
    sys.path.insert(0, str(opts.checkout))
    fedavg = importlib.import_module("src.server.fedavg")
    fedlc = importlib.import_module(script.removesuffix(".py").replace("/", "."))
    base_dataset = importlib.import_module("data.utils.datasets").BaseDataset
    decoupled = importlib.import_module("src.utils.models").DecoupledModel

    fd, train_x, _, (test_x, test_y) = borrowed.client_data(a, "flbench_wrapper")
    spec, n_train = fd.dataset.spec, len(fd.dataset.train)
    train = {cid: [int(i) for i in ix.train] for cid, ix in fd.clients.items()}
    test = list(range(n_train, n_train + len(test_y)))
    write_flbench_data(opts.workdir, a.dataset, train, test, a.seed)
    fedavg.FLBENCH_ROOT = opts.workdir  # where the server reads data/DATASET/{args.json,partition.pkl}
    runtime = SimpleNamespace(runtime=SimpleNamespace(output_dir=str(opts.workdir / "out")))
    fedavg.HydraConfig = SimpleNamespace(get=lambda: runtime)  # the output folder Hydra would have made
    config = flbench_config(opts.checkout, a, a.dataset)

    class Net(decoupled):
        """fedray's model with FL-bench's interface: ``base`` (the encoder), ``classifier``."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.base, self.classifier = model.encoder, model.head

    data = torch.cat([train_x, test_x])
    targets = torch.as_tensor(np.concatenate([fd.dataset.train.y, test_y]), dtype=torch.long)
    evals: list[dict[str, Any]] = []
    t0 = last = time.perf_counter()

    class Server(fedlc.FedLCServer):
        def init_model(self, model=None, preprocess_func=None, postprocess_func=None):
            # drawn where FL-bench draws MODELS[name](...): right after fix_random_seed
            net = Net(build_model(a.model, spec.input_shape, spec.num_classes))
            super().init_model(net, preprocess_func, postprocess_func)

        def get_dataset(self):
            return base_dataset(
                data=data,
                targets=targets,
                classes=list(range(spec.num_classes)),
                **self.get_dataset_transforms(),
            )

        def get_dataset_transforms(self):
            return dict(
                train_data_transform=None,
                train_target_transform=None,
                test_data_transform=None,
                test_target_transform=None,
            )

        def test_global_model(self):
            nonlocal last
            super().test_global_model()
            metrics = self.test_results[self.current_epoch + 1]["centralized"]["after"]["test"]
            self.model.eval()
            accuracy = borrowed.fraction_right(self.model, test_x, test_y)
            now = time.perf_counter()
            evals.append(
                {
                    "accuracy": accuracy,
                    "flbench_accuracy": float(metrics.accuracy),
                    "seconds": now - last,
                    "elapsed": now - t0,
                    "model_sha256": model_sha256(self.model),
                    "finite": weights_finite(self.model),
                }
            )
            last = now

    server = Server(args=config)
    server.run_experiment()
    doc = {
        "script": script,
        "args": script_args,
        "total_seconds": time.perf_counter() - t0,
        "train_size": n_train,
        "partition": {str(c): ix for c, ix in sorted(train.items())},
        "evals": evals,
        "threads": opts.threads,
        "flbench_config": OmegaConf.to_container(config, resolve=True),
    }
    write_text_atomic(json.dumps(doc), opts.result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
