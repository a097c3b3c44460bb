"""Run a NIID-Bench-family experiment script (sjtudyq/FedConcat's or Xtra-Computing/NIID-Bench's
``experiments.py``) unchanged, from outside, and write what it did to a JSON file.

    python -m jobs.reference.niid_wrapper --checkout PATH --result OUT.json [options] -- SCRIPT ARGS...

Nothing in the checkout is edited or copied. The script runs in this process (``runpy``) after
these patches to the modules it imports from its checkout:

- ``utils.partition_data`` is wrapped: the clients' training indices it draws are recorded, so
  fedray can run on exactly these clients (``partition: file``).
- ``utils.compute_accuracy`` is wrapped. The script's own per-round evaluation of the global model
  on the test set (called from the script's main block) is computed as before and recorded, with
  the round's wall time and a SHA-256 of the evaluated model's weights. Every other call is
  logging only (each client's train and test accuracy before and after its local training, the
  global model's training accuracy): by default it is skipped, but the random draws it would have
  made are made (the loader's seeds, and the data transform's per-sample noise), so the run's random
  streams, hence its trained weights, are those of the unpatched script. ``--keep-logging-evals``
  runs them all (then the recorded weight hashes show the skipping changed nothing).
- ``datasets.FashionMNIST`` (and MNIST) is loaded from disk once and reused: the script builds a
  new one for every client in every round; the arrays are the same.
- ``FashionMNIST_truncated.__getitem__`` (and MNIST's) skips the round trip through a PIL image:
  ToTensor of an 8-bit grey image is the uint8 array as float32 divided by 255, computed here the
  same way; the transforms after ToTensor (the noise) run unchanged (``--slow-data`` turns this off).
- ``nn.Module.state_dict`` returns copies (``--state-dict copies``, the default). The script
  initialises every FedConcat cluster from ``encoder_list[0].state_dict()``, whose tensors, on the
  CPU, ARE client 0's weights: once client 0 trains, the clusters not yet trained that round start
  from client 0's trained model instead of the shared random init. On a GPU (the paper's runs) the
  script's ``.to(device)`` moves client 0 to new memory and every cluster starts from the random
  init. Copies give the GPU behaviour on the CPU; ``--state-dict views`` keeps the CPU one.
- ``sklearn.cluster.KMeans`` gets ``n_init=10`` unless ``--kmeans-n-init`` says otherwise: the
  scikit-learn the script pins (0.22.1) restarts k-means++ 10 times; today's runs it once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from jobs.reference.wrapper_argv import parse_wrapper_argv


class PartitionDrawn(Exception):
    """Raised once the partition is drawn, to stop a ``--partition-only`` run there."""


class Recorder:
    """What the wrapped script did: its partition, its per-round evaluations, what was skipped."""

    def __init__(self, keep_logging_evals: bool, partition_only: bool = False) -> None:
        self.keep = keep_logging_evals
        self.partition_only = partition_only
        self.partition: dict[str, list[int]] | None = None
        self.train_size = 0
        self.evals: list[dict[str, Any]] = []
        self.skipped = 0
        self.t0 = time.perf_counter()
        self.last = self.t0


def weights_finite(model: Any) -> bool:
    """Whether every floating-point entry of the model's state is finite (a run that diverged is not)."""
    return all(bool(v.isfinite().all()) for v in model.state_dict().values() if v.is_floating_point())


def model_sha256(model: Any) -> str:
    h = hashlib.sha256()
    for key, value in model.state_dict().items():
        h.update(key.encode())
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def replay_draws(loader: Any) -> None:
    """Make the random draws iterating ``loader`` once would make, without the model.

    Creating the iterator draws the loader's base seed; the first batch draws a shuffling sampler's
    seed and runs the transform of its samples. For the remaining samples, a transform that is
    ToTensor followed by NIID-Bench's AddGaussianNoise draws one ``randn`` of the sample's shape each
    (it does so even at noise level 0), so that draw is made; any other transform is run in full.
    """
    import torch

    it = iter(loader)
    try:
        first = next(it)
    except StopIteration:
        return
    n, done = len(loader.dataset), len(first[0])
    names = [type(t).__name__ for t in getattr(getattr(loader.dataset, "transform", None), "transforms", [])]
    if names == ["ToTensor", "AddGaussianNoise"]:
        # k draws of randn(shape) consume the generator exactly as one randn(k, *shape) does
        # (checked by the harness's `check` and by tests/reference/test_reference.py).
        shape, left = tuple(first[0].shape[1:]), n - done
        while left > 0:
            k = min(left, 4096)
            torch.randn((k, *shape))
            left -= k
    else:
        for i in range(done, n):
            loader.dataset[i]
    del it


def _loaders(dataloader: Any) -> list[Any]:
    return dataloader if isinstance(dataloader, list) else [dataloader]


def fast_getitem(original: Any) -> Any:
    """``__getitem__`` of the checkout's (Fashion)MNIST_truncated without the PIL image: the same
    tensor ToTensor makes of an 8-bit grey image, then the remaining transforms as they are."""
    import torch

    def getitem(self, index):
        transforms = getattr(self.transform, "transforms", None)
        if not transforms or type(transforms[0]).__name__ != "ToTensor" or self.data.dtype != torch.uint8:
            return original(self, index)
        x = self.data[index].to(torch.float32).div(255).unsqueeze(0)
        for t in transforms[1:]:
            x = t(x)
        target = self.target[index]
        if self.target_transform is not None:
            target = self.target_transform(target)
        return x, target

    return getitem


def patch(checkout: Path, rec: Recorder, state_dict: str, kmeans_n_init: int, fast_data: bool = True) -> None:
    sys.path.insert(0, str(checkout))
    import datasets as ref_datasets  # the checkout's modules, as the script will import them
    import sklearn.cluster
    import torch
    import utils as ref_utils

    original_partition = ref_utils.partition_data

    def partition_data(dataset, datadir, logdir, partition, n_parties, beta=0.4):
        out = original_partition(dataset, datadir, logdir, partition, n_parties, beta=beta)
        net_dataidx_map = out[4]
        rec.partition = {str(int(c)): [int(i) for i in idx] for c, idx in sorted(net_dataidx_map.items())}
        rec.train_size = len(out[1])
        if rec.partition_only:
            raise PartitionDrawn
        return out

    ref_utils.partition_data = partition_data

    original_accuracy = ref_utils.compute_accuracy

    def compute_accuracy(model, dataloader, get_confusion_matrix=False, device="cpu", **kwargs):
        # kwargs: NIID-Bench's moon_model=True (the model returns (h, z, logits))
        caller = sys._getframe(1).f_code.co_name
        loaders = _loaders(dataloader)
        is_test = all(getattr(d.dataset, "train", True) is False for d in loaders)
        if caller == "<module>" and is_test:  # the script's own per-round evaluation: kept, recorded
            out = original_accuracy(model, dataloader, get_confusion_matrix, device=device, **kwargs)
            now = time.perf_counter()
            acc = out[0] if get_confusion_matrix else out
            rec.evals.append(
                {
                    "accuracy": float(acc),
                    "seconds": now - rec.last,
                    "elapsed": now - rec.t0,
                    "model_sha256": model_sha256(model),
                    "finite": weights_finite(model),
                }
            )
            rec.last = now
            return out
        if rec.keep:
            return original_accuracy(model, dataloader, get_confusion_matrix, device=device, **kwargs)
        rec.skipped += 1
        for d in loaders:
            replay_draws(d)
        return (float("nan"), None) if get_confusion_matrix else float("nan")

    ref_utils.compute_accuracy = compute_accuracy

    cache: dict[tuple, Any] = {}

    def cached(cls: type) -> type:
        class Cached:
            """The dataset read once per (root, split); the script only reads .data and .targets."""

            def __init__(self, root, train=True, transform=None, target_transform=None, download=False):
                key = (cls.__name__, str(root), bool(train))
                if key not in cache:
                    cache[key] = cls(root, train, transform, target_transform, download)
                self.data, self.targets = cache[key].data, cache[key].targets

        return Cached

    for name in ("FashionMNIST", "MNIST"):
        if hasattr(ref_datasets, name):
            setattr(ref_datasets, name, cached(getattr(ref_datasets, name)))
    if fast_data:
        for name in ("FashionMNIST_truncated", "MNIST_truncated"):
            cls = getattr(ref_datasets, name, None)
            if cls is not None:
                cls.__getitem__ = fast_getitem(cls.__getitem__)

    if state_dict == "copies":
        original_state_dict = torch.nn.Module.state_dict

        def state_dict_copies(self, *args, **kwargs):
            sd = original_state_dict(self, *args, **kwargs)
            for k in list(sd):
                sd[k] = sd[k].clone()
            return sd

        torch.nn.Module.state_dict = state_dict_copies

    original_kmeans = sklearn.cluster.KMeans

    class KMeans(original_kmeans):
        def __init__(self, n_clusters=8, **kwargs):
            kwargs.setdefault("n_init", kmeans_n_init)
            super().__init__(n_clusters=n_clusters, **kwargs)

    KMeans.__name__ = KMeans.__qualname__ = "KMeans"
    sklearn.cluster.KMeans = KMeans


def main(argv: list[str] | None = None) -> int:
    def options(ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--keep-logging-evals", action="store_true")
        ap.add_argument("--state-dict", choices=("copies", "views"), default="copies")
        ap.add_argument("--kmeans-n-init", type=int, default=10)
        ap.add_argument(
            "--slow-data", action="store_true", help="load samples through PIL, as the script does"
        )
        ap.add_argument("--partition-only", action="store_true", help="stop once the partition is drawn")

    parsed = parse_wrapper_argv(sys.argv[1:] if argv is None else argv, "niid_wrapper", options=options)
    if parsed is None:
        return 2
    opts, script, script_args, _ = parsed
    checkout, result, workdir = opts.checkout, opts.result, opts.workdir
    rec = Recorder(opts.keep_logging_evals, opts.partition_only)
    patch(checkout, rec, opts.state_dict, opts.kmeans_n_init, fast_data=not opts.slow_data)
    if opts.threads:
        import torch

        torch.set_num_threads(opts.threads)
    os.chdir(workdir)
    sys.argv = [str(checkout / script), *script_args]
    rec.t0 = rec.last = time.perf_counter()
    try:
        runpy.run_path(str(checkout / script), run_name="__main__")
    except PartitionDrawn:
        pass
    total = time.perf_counter() - rec.t0
    doc = {
        "script": script,
        "args": script_args,
        "total_seconds": total,
        "train_size": rec.train_size,
        "partition": rec.partition,
        "evals": rec.evals,
        "skipped_logging_evals": rec.skipped,
        "keep_logging_evals": opts.keep_logging_evals,
        "state_dict": opts.state_dict,
        "kmeans_n_init": opts.kmeans_n_init,
        "fast_data": not opts.slow_data,
        "threads": opts.threads,
    }
    tmp = result.with_name(f".{result.name}.tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
