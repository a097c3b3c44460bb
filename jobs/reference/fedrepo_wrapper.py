"""Run lxcnju/FedRepo's FedRS (``algorithms/fedrs.py``, its class unchanged) on fedray's clients, from
outside, and write what it did to a JSON file (the record the harness imports).

    python -m jobs.reference.fedrepo_wrapper --checkout PATH --result OUT.json [--threads T] -- \\
        algorithms/fedrs.py --dataset fmnist --partition-file F --model simple_cnn --rounds R ...

FedRepo's own entry point (``train_lab.py``) builds its data sets from pickles of its own split and
its models from its own nets; this wrapper does what that entry point does, with fedray's pieces:

- the checkout's ``utils.setup_seed(seed)`` first, as ``train_lab.py`` does (Python, NumPy, torch);
- the clients: the partition file's training indices into fedray's copy of the data set, as the
  tensors fedray trains on (``DataSpec.to_tensor``; no augmentation: FedRepo's Fashion-MNIST has
  none). Each client is a data set with FedRepo's ``xs``/``ys`` attributes (``ys`` is what FedRS
  counts the classes from). FedRS requires a local test set per client, for logging only (its
  accuracy before and after local training); these clients have none, so each gets its first
  training sample, and those logged numbers are not imported. Iterating a test loader draws one
  number from torch's generator whatever its size, so the training's random streams are as they
  would be with any local test set;
- the global test set: the data set's test split;
- the model: fedray's ``model`` built right after the seed, with FedRepo's interface
  (``encoder``, ``classifier`` = the bias-free last layer, forward returning (features, logits)),
  in PyTorch's default initialisation, as NIID-Bench and fedray draw the simple CNN. FedRepo's own
  nets get its ``utils.weights_init`` (Kaiming-normal convolutions, N(0, 0.01) linear layers, zero
  biases; its classifier PyTorch's default): not applied, so the cell compares FedRS's training on
  the model FedConcat's table uses, not FedRepo's initialisation;
- ``args``: FedRepo's fields, from the arguments (``c_ratio`` = participation, ``test_round`` = 1,
  ``local_steps`` = None, ``optimizer`` = SGD, ``cuda`` = False);
- ``_BaseDataLoaderIter.next = __next__``: FedRS calls ``loader_iter.next()``, a Python 2 alias
  today's torch no longer has (without it every run fails at its first step).

After every round FedRS evaluates the global model on the test set; the wrapper records that
number as FedRepo computes it (``fedrepo_accuracy``: the mean of per-batch accuracies over batches of
10 x batch_size) and the exact fraction of the test set right (``accuracy``, fedray's definition,
the one imported), with the round's wall time and a SHA-256 of the model's weights.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections import namedtuple
from typing import Any

from jobs.reference import borrowed
from jobs.reference.wrapper_argv import parse_wrapper_argv


def main(argv: list[str] | None = None) -> int:
    parser = borrowed.script_parser("fedrepo_wrapper SCRIPT")
    parser.add_argument("--alpha", type=float, required=True)
    parser.add_argument("--max-grad-norm", type=float, default=100.0)
    parsed = parse_wrapper_argv(sys.argv[1:] if argv is None else argv, "fedrepo_wrapper", parser)
    if parsed is None:
        return 2
    opts, script, script_args, a = parsed
    checkout, result, workdir = opts.checkout, opts.result, opts.workdir

    import numpy as np
    import torch
    from torch.utils.data import Dataset
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    from fedray.models import build_model
    from fedray.storage.files import write_text_atomic
    from jobs.reference.niid_wrapper import model_sha256, weights_finite

    if opts.threads:
        torch.set_num_threads(opts.threads)
    if not hasattr(_BaseDataLoaderIter, "next"):
        _BaseDataLoaderIter.next = _BaseDataLoaderIter.__next__
    os.chdir(workdir)  # the checkout's paths.py makes ./logs where it is imported
    sys.path.insert(0, str(checkout))
    ref_utils = importlib.import_module("utils")
    module = importlib.import_module(script.removesuffix(".py").replace("/", "."))
    algorithm = module.FedRS

    class Split(Dataset):
        """A client's (or the test) samples, with FedRepo's ``xs``/``ys`` attributes."""

        def __init__(self, xs: torch.Tensor, ys: np.ndarray) -> None:
            self.xs, self.ys = xs, np.asarray(ys, dtype=np.int64)

        def __len__(self) -> int:
            return len(self.ys)

        def __getitem__(self, i: int):
            return self.xs[i], torch.tensor(self.ys[i], dtype=torch.long)

    class Net(torch.nn.Module):
        """fedray's model with FedRepo's interface: ``encoder``, ``classifier``, (features, logits)."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.encoder, self.classifier = model.encoder, model.head

        def forward(self, xs):
            hs = self.encoder(xs)
            return hs, self.classifier(hs)

    ref_utils.setup_seed(a.seed)
    fd, _, clients, (test_x, test_y) = borrowed.client_data(a, "fedrepo_wrapper")
    csets = {cid: (Split(x, y), Split(x[:1], y[:1])) for cid, (x, y) in clients.items()}
    gset = Split(test_x, test_y)
    spec = fd.dataset.spec
    net = Net(build_model(a.model, spec.input_shape, spec.num_classes, head_bias=False))
    fields = dict(
        n_classes=spec.num_classes,
        c_ratio=a.participation,
        max_round=a.rounds,
        test_round=1,
        local_epochs=a.local_epochs,
        local_steps=None,
        batch_size=a.batch_size,
        optimizer="SGD",
        lr=a.lr,
        momentum=a.momentum,
        weight_decay=a.weight_decay,
        max_grad_norm=a.max_grad_norm,
        alpha=a.alpha,
        cuda=False,
    )
    args = namedtuple("Args", fields)(**fields)
    algo = algorithm(csets=csets, gset=gset, model=net, args=args)

    evals: list[dict[str, Any]] = []
    t0 = last = time.perf_counter()
    original_test = algo.test

    def test(model, loader):
        nonlocal last
        out = original_test(model=model, loader=loader)
        if loader is algo.glo_test_loader:
            model.eval()
            accuracy = borrowed.fraction_right(lambda x: model(x)[1], test_x, test_y)
            now = time.perf_counter()
            evals.append(
                {
                    "accuracy": accuracy,
                    "fedrepo_accuracy": float(out[0]),
                    "seconds": now - last,
                    "elapsed": now - t0,
                    "model_sha256": model_sha256(model),
                    "finite": weights_finite(model),
                }
            )
            last = now
        return out

    algo.test = test
    algo.train()
    total = time.perf_counter() - t0
    doc = {
        "script": script,
        "args": script_args,
        "total_seconds": total,
        "train_size": len(fd.dataset.train),
        "partition": {str(c): [int(i) for i in ix.train] for c, ix in sorted(fd.clients.items())},
        "evals": evals,
        "threads": opts.threads,
        "max_grad_norm": a.max_grad_norm,
        "local_test": "each client's first training sample (FedRepo's local logging only)",
    }
    write_text_atomic(json.dumps(doc), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
