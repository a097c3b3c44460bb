"""Datasets, client partitions, and the per-run federated data (arrays + per-client indices)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from fedray import seeding
from fedray.data.datasets import (
    DATASETS,
    ArrayDataset,
    Dataset,
    DatasetInfo,
    DatasetMissing,
    DataSpec,
    check_available,
    dataset_info,
    load_dataset,
)
from fedray.data.partitions import (
    GROUPED_PARTITIONS,
    PARTITIONS,
    Partition,
    PartitionError,
    PartitionParams,
    split_train_test,
)
from fedray.data.rotation import rotated_arrays
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
    "DatasetMissing",
    "FederatedData",
    "Partition",
    "PartitionError",
    "PartitionParams",
    "build_federated_data",
    "check_available",
    "dataset_info",
    "load_dataset",
    "partition_for",
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


def partition_for(cfg: Config, labels: np.ndarray, num_classes: int) -> Partition:
    params = PartitionParams(
        num_clients=cfg.num_clients,
        num_classes=num_classes,
        k=cfg.partition_k,
        beta=cfg.partition_beta,
        clusters=cfg.partition_clusters,
        size=cfg.partition_size,
        min_size=cfg.partition_min_size,
    )
    return PARTITIONS[cfg.partition](labels, params, seeding.rng(cfg.seed, "partition"))


def build_federated_data(cfg: Config) -> FederatedData:
    ds = load_dataset(cfg)
    part = partition_for(cfg, ds.train.y, ds.spec.num_classes)
    for cid, idx in enumerate(part.clients):
        if len(idx) == 0:
            raise PartitionError(
                f"config key 'partition': client {cid} received no samples ({cfg.partition}); use fewer clients"
            )
    if cfg.shift != "none":
        return _shifted(cfg, ds, part.clients)
    if cfg.partition == "rotation":  # each group's copies rotated; local test splits rotated with them
        x, y, ranges = rotated_arrays(
            ds.train.x, ds.train.y, part.clients, part.groups, cfg.partition_clusters
        )
        clients = {cid: _split(cfg, cid, r, cfg.client_test_fraction) for cid, r in enumerate(ranges)}
        return FederatedData(replace(ds, train=ArrayDataset(x, y)), clients, part.groups)
    clients = {cid: _split(cfg, cid, idx, cfg.client_test_fraction) for cid, idx in enumerate(part.clients)}
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
    return FederatedData(shifted, clients, np.array([s.concept for s in shifts]), test_clients, all_shifts)
