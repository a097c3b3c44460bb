"""Datasets, client partitions, and the per-run federated data (arrays + per-client indices)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from fedray import seeding
from fedray.data import arrays as _arrays  # noqa: F401 - registers dataset 'arrays'
from fedray.data import fedprox_synthetic as _fedprox_synthetic  # noqa: F401 - registers dataset 'fedprox_synthetic'
from fedray.data.datasets import (
    DATASETS,
    ArrayDataset,
    Dataset,
    DatasetInfo,
    DatasetKind,
    DatasetMissing,
    DataSpec,
    check_available,
    dataset_info,
    load_dataset,
    register_dataset,
    train_labels,
)
from fedray.data.partition_file import PartitionFileError
from fedray.data.partitions import (
    GROUPED_PARTITIONS,
    PARTITIONS,
    Partition,
    PartitionError,
    PartitionParams,
    PartitionScheme,
    partition_keys,
    partition_label_keys,
    register_partition,
    split_train_test,
)
from fedray.data.shift import TEST_CLIENTS, ClientShift, assign_shifts, shifted_arrays

if TYPE_CHECKING:
    from fedray.config import Config

__all__ = [
    "DATASETS",
    "GROUPED_PARTITIONS",
    "PARTITIONS",
    "ArrayDataset",
    "ClientIndices",
    "DataSpec",
    "Dataset",
    "DatasetInfo",
    "DatasetKind",
    "DatasetMissing",
    "FederatedData",
    "Partition",
    "PartitionError",
    "PartitionFileError",
    "PartitionParams",
    "PartitionScheme",
    "build_federated_data",
    "check_partition",
    "check_available",
    "dataset_info",
    "load_dataset",
    "partition_for",
    "partition_keys",
    "partition_label",
    "partition_label_keys",
    "register_dataset",
    "register_partition",
]


@dataclass
class ClientIndices:
    train: np.ndarray  # indices into the global training arrays
    test: np.ndarray  # the client's own test split (also into the training arrays); may be empty


@dataclass
class FederatedData:
    dataset: Dataset
    clients: dict[int, ClientIndices]  # every client, the test clients too
    groups: np.ndarray | None  # ground-truth client groups, when the partition (or the shift) has them
    test_clients: list[int] = field(default_factory=list)  # non-participating test clients (FedRC's shift)
    shifts: list[ClientShift] | None = None  # each client's concept and corruption, test clients last
    # Where the rows of rebuilt arrays (rotation, shift: each client's samples copied and changed)
    # come from: origin[row] indexes the dataset's training set, or, from `origin_train_size` on,
    # its test set (FedRC's test clients). None: the rows are the dataset's training set itself.
    origin: np.ndarray | None = None
    origin_train_size: int = 0

    def partition_rows(self) -> dict[str, np.ndarray]:
        """Every client's samples as the dataset indexes them, one row per (client, split, index):
        what ``DIR/partitions/`` holds, and what ``partition: file`` reads back. ``source`` says
        which of the dataset's sets the index is into (train, or test for FedRC's test clients)."""
        client, split, index = [], [], []
        for cid, ix in sorted(self.clients.items()):
            for name, rows in (("train", ix.train), ("test", ix.test)):
                client.append(np.full(len(rows), cid, dtype=np.int64))
                split.append(np.full(len(rows), name, dtype=object))
                index.append(np.asarray(rows, dtype=np.int64))
        out = {
            "client": np.concatenate(client),
            "split": np.concatenate(split),
            "index": np.concatenate(index),
        }
        source = np.full(len(out["index"]), "train", dtype=object)
        if self.origin is not None:
            out["index"] = self.origin[out["index"]]
            from_test = out["index"] >= self.origin_train_size
            source[from_test] = "test"
            out["index"] = np.where(from_test, out["index"] - self.origin_train_size, out["index"])
        out["source"] = source
        if self.groups is not None:
            g = np.asarray(self.groups, dtype=np.int64)
            out["group"] = np.where(out["client"] < len(g), g[np.minimum(out["client"], len(g) - 1)], -1)
        return out


def partition_label(config: Mapping[str, Any]) -> str:
    """How reports name a run's partition, from its config mapping: #C=2, dirichlet(0.5), ... (the
    scheme's label); a dataset whose files are the clients names them (``files:FOLDER``)."""
    kind = DATASETS.get(config.get("dataset", ""))
    if kind is not None and kind.partition_label is not None:
        return kind.partition_label(config)
    scheme = PARTITIONS.get(config["partition"])
    return scheme.describe(config) if scheme is not None else str(config["partition"])


def partition_for(cfg: Config, labels: np.ndarray, num_classes: int) -> Partition:
    scheme = PARTITIONS[cfg.partition]
    return scheme.draw(labels, scheme.params_for(cfg, num_classes), seeding.rng(cfg.seed, "partition"))


def draw_partition(cfg: Config, labels: np.ndarray, num_classes: int) -> Partition:
    """The run's partition; `PartitionError` (naming the config key) if it cannot be drawn."""
    part = partition_for(cfg, labels, num_classes)
    for cid, idx in enumerate(part.clients):
        if len(idx) == 0:
            raise PartitionError(
                f"config key 'partition': client {cid} received no samples ({cfg.partition}); use fewer clients"
            )
    return part


def check_partition(cfg: Config) -> None:
    """Draw the run's partition now, from the training labels alone where the dataset allows (the
    draw is a pure function of the labels and the seed, so the run draws the same one later): a
    partition that cannot be drawn fails before Ray or any actor starts. Client files are read and
    checked instead (their clients are the partition)."""
    kind = DATASETS[cfg.dataset]
    if kind.own_clients:
        kind.federate(cfg)
        return
    labels, num_classes = train_labels(cfg)
    draw_partition(cfg, labels, num_classes)


def build_federated_data(cfg: Config) -> FederatedData:
    kind = DATASETS[cfg.dataset]
    if kind.own_clients:  # the data set comes with its clients (client_files, fedprox_synthetic)
        return kind.federate(cfg)
    ds = load_dataset(cfg)
    part = draw_partition(cfg, ds.train.y, ds.spec.num_classes)
    if cfg.shift != "none":
        return _shifted(cfg, ds, part.clients)
    scheme = PARTITIONS[cfg.partition]
    if scheme.rebuild is not None:  # rotation: each group's copies rotated; local test splits with them
        params = scheme.params_for(cfg, ds.spec.num_classes)
        x, y, ranges = scheme.rebuild(ds.train.x, ds.train.y, part, params)
        clients = {cid: _split(cfg, cid, r, cfg.client_test_fraction) for cid, r in enumerate(ranges)}
        origin = np.concatenate(part.clients)
        return FederatedData(
            replace(ds, train=ArrayDataset(x, y)),
            clients,
            part.groups,
            origin=origin,
            origin_train_size=len(ds.train),
        )
    if part.tests is not None:  # the file gives each client's test split
        clients = {
            cid: ClientIndices(tr, te)
            for cid, (tr, te) in enumerate(zip(part.clients, part.tests, strict=True))
        }
    else:
        clients = {
            cid: _split(cfg, cid, idx, cfg.client_test_fraction) for cid, idx in enumerate(part.clients)
        }
    return FederatedData(ds, clients, part.groups)


def _split(cfg: Config, cid: int, idx: np.ndarray, fraction: float) -> ClientIndices:
    tr, te = split_train_test(idx, fraction, seeding.rng(cfg.seed, "client_test_split", cid))
    return ClientIndices(tr, te)


def _shifted(cfg: Config, ds: Dataset, parts: list[np.ndarray]) -> FederatedData:
    """FedRC's shift benchmark: every client's data copied under its concept and corruption, then the
    three test clients (the whole test set under each concept, split 90/10)."""
    n = len(parts)
    shifts = assign_shifts(n, cfg.shift, cfg.seed)
    test_idx = np.arange(len(ds.test.y))
    x = np.concatenate([ds.train.x, ds.test.x])
    y = np.concatenate([ds.train.y, ds.test.y])
    all_parts = [*parts, *[test_idx + len(ds.train.y)] * TEST_CLIENTS]
    all_shifts = [*shifts, *(ClientShift(c) for c in range(TEST_CLIENTS))]
    sx, sy, ranges = shifted_arrays(x, y, all_parts, all_shifts, ds.spec.num_classes, cfg.seed)
    clients = {cid: _split(cfg, cid, r, cfg.client_test_fraction) for cid, r in enumerate(ranges[:n])}
    test_clients = list(range(n, n + TEST_CLIENTS))
    clients.update({cid: _split(cfg, cid, ranges[cid], 0.1) for cid in test_clients})
    shifted = replace(ds, train=ArrayDataset(sx, sy))
    groups = np.array([s.concept for s in shifts])
    origin = np.concatenate(all_parts)
    return FederatedData(shifted, clients, groups, test_clients, all_shifts, origin, len(ds.train))


def client_files_data(cfg: Config) -> FederatedData:
    """A dataset given as one file per client (`fedray.data.client_files`): every client's arrays
    laid out one after another (training split, then its test split), test clients last."""
    from pathlib import Path

    from fedray.data.client_files import (
        ClientFilesError,
        client_paths,
        read_client,
        read_global_test,
        read_meta,
    )

    root = Path(cfg.resolved_data_root())
    meta = read_meta(root)
    train_paths, test_paths = client_paths(root)
    arrays = [read_client(p, meta, False) for p in train_paths] + [
        read_client(p, meta, True) for p in test_paths
    ]
    dtypes = {a.x_train.dtype for a in arrays}
    if len(dtypes) > 1:
        raise ClientFilesError(
            f"dataset client_files: the clients' images mix dtypes {sorted(map(str, dtypes))} in {str(root)!r}"
        )
    global_test = read_global_test(root, meta)
    if global_test is None and not test_paths:
        raise ClientFilesError(
            f"dataset client_files: {str(root)!r} has neither global_test.npz nor test clients, so nothing measures accuracy"
        )
    xs, ys, clients, start = [], [], {}, 0
    for cid, a in enumerate(arrays):
        n_tr, n_te = len(a.y_train), len(a.y_test)
        xs += [a.x_train, a.x_test]
        ys += [a.y_train, a.y_test]
        train = np.arange(start, start + n_tr, dtype=np.int64)
        test = np.arange(start + n_tr, start + n_tr + n_te, dtype=np.int64)
        if n_te == 0 and cfg.client_test_fraction > 0 and cid < len(train_paths):
            train, test = split_train_test(
                train, cfg.client_test_fraction, seeding.rng(cfg.seed, "client_test_split", cid)
            )
        clients[cid] = ClientIndices(train, test)
        start += n_tr + n_te
    groups = [a.group for a in arrays[: len(train_paths)]]
    if any(g >= 0 for g in groups) and not all(g >= 0 for g in groups):
        raise ClientFilesError(
            f"dataset client_files: 'group' is in some client files of {str(root)!r} but not in all"
        )
    spec = DataSpec(meta.input_shape, meta.num_classes, meta.scale, meta.mean, meta.std)
    dtype = next(iter(dtypes))
    gx, gy = (
        global_test
        if global_test is not None
        else (np.zeros((0, *meta.input_shape), dtype=dtype), np.zeros(0, np.int64))
    )
    ds = Dataset(
        "client_files",
        ArrayDataset(np.concatenate(xs), np.concatenate(ys)),
        ArrayDataset(gx.astype(dtype), gy),
        spec,
    )
    test_clients = list(range(len(train_paths), len(arrays)))
    return FederatedData(ds, clients, np.array(groups) if groups and groups[0] >= 0 else None, test_clients)
