"""What the wrappers of references that run on borrowed clients share (FedRepo's FedRS, FL-bench's
FedLC): they draw no partition of their own, but train on the clients a NIID-Bench-family harness
drew into the results folder, with fedray's copy of the data set as tensors.

Harness side: `hparams` (the run's, checked) and `script_args` (the wrapper's arguments for a run,
after checking its partition is there). Wrapper side: `client_data` (the
partition file's clients as tensors)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedray.config.keys import Config, partition_file_for


def script_args(cfg: Config, out: Path) -> list[str]:
    """The arguments every borrowed-clients wrapper takes for ``cfg``; the partition a NIID-Bench-family
    reference drew into ``out`` must be there (else a ReferenceError saying how to draw it)."""
    from jobs.reference.harness import ReferenceError, partition_template

    if cfg.client_test_fraction or cfg.shift != "none":
        raise ReferenceError(
            "the clients come from NIID-Bench's partitions: no client_test_fraction or shift"
        )
    path = Path(partition_file_for(partition_template(out, cfg), cfg.seed))
    if not path.is_file():
        raise ReferenceError(
            f"no partition {path}: this reference runs on the clients a NIID-Bench-family reference drew into this "
            "folder; draw them first, e.g. fedray reference niid-bench jobs/configs/fidelity_moon.yaml "
            f"--partitions-only --checkout NIID-Bench --output {out}"
        )
    return [
        "--dataset",
        cfg.dataset,
        "--data-root",
        cfg.resolved_data_root(),
        "--partition-file",
        str(path),
        "--model",
        cfg.model,
        "--rounds",
        str(cfg.rounds),
        "--local-epochs",
        str(cfg.local_epochs),
        "--batch-size",
        str(cfg.batch_size),
        "--lr",
        f"{cfg.lr:g}",
        "--momentum",
        f"{cfg.momentum:g}",
        "--weight-decay",
        f"{cfg.weight_decay:g}",
        "--participation",
        f"{cfg.participation:g}",
        "--seed",
        str(cfg.seed),
    ]


def hparams(cfg: Config, algorithm: str, reference: str) -> dict[str, Any]:
    """``cfg``'s full hparams, for a reference that runs ``algorithm`` only and averages as FedAvg
    does (server learning rate 1); anything else is a ReferenceError."""
    from fedray.algorithms import ALGORITHMS
    from jobs.reference.harness import ReferenceError

    if cfg.algorithm != algorithm:
        raise ReferenceError(f"algorithm {cfg.algorithm!r}: the harness runs {reference}'s {algorithm} only")
    hp = ALGORITHMS[algorithm].full_hparams(cfg.hp)
    if "server_lr" in hp and hp["server_lr"] != 1.0:
        raise ReferenceError(f"{reference} averages with server learning rate 1 (hp.server_lr: 1)")
    return hp


def script_parser(prog: str) -> argparse.ArgumentParser:
    """The parser of `script_args`' arguments; a wrapper adds its algorithm's own."""
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--data-root", default="")
    ap.add_argument("--partition-file", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--local-epochs", type=int, required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--momentum", type=float, required=True)
    ap.add_argument("--weight-decay", type=float, required=True)
    ap.add_argument("--participation", type=float, required=True)
    ap.add_argument("--seed", type=int, required=True)
    return ap


def client_data(a: argparse.Namespace, prog: str) -> tuple[Any, Any, dict[int, Any], Any]:
    """fedray's data set for the partition file: (federated data, the whole training split as
    tensors, {client: (training tensors, labels)}, (test tensors, labels)); an augmented data set is
    refused (the references feed fixed tensors)."""
    import numpy as np

    from fedray.data import build_federated_data, partition_file
    from fedray.experiment.checks import from_dict

    n = len(partition_file.read(a.partition_file).train)
    cfg = from_dict(
        {
            "dataset": a.dataset,
            "data_root": a.data_root,
            "model": a.model,
            "partition": "file",
            "partition_file": a.partition_file,
            "num_clients": n,
            "client_test_fraction": 0.0,
        }
    )
    fd = build_federated_data(cfg.data_section)
    ds, spec = fd.dataset, fd.dataset.spec
    if spec.augment != "none":
        raise SystemExit(
            f"{prog}: {a.dataset} is augmented in fedray ({spec.augment}); the reference feeds fixed tensors"
        )
    x = spec.to_tensor(ds.train.x)
    clients = {
        cid: (x[np.asarray(ix.train)], ds.train.y[np.asarray(ix.train)]) for cid, ix in fd.clients.items()
    }
    return fd, x, clients, (spec.to_tensor(ds.test.x), ds.test.y)


def fraction_right(logits: Callable[[Any], Any], x: Any, y: Any, batch: int = 1000) -> float:
    """The exact fraction of (x, y) that ``logits`` classifies right (fedray's accuracy), in batches."""
    import torch

    with torch.no_grad():
        right = sum(
            int((logits(x[i : i + batch]).argmax(1) == torch.as_tensor(y[i : i + batch])).sum())
            for i in range(0, len(y), batch)
        )
    return right / len(y)
