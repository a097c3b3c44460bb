"""Datasets, client partitions, and the per-run federated data (arrays + per-client indices)."""

from __future__ import annotations

from dataclasses import dataclass
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
    clients: dict[int, ClientIndices]
    groups: np.ndarray | None  # ground-truth client groups, when the partition has them


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
    clients = {}
    for cid, idx in enumerate(part.clients):
        if len(idx) == 0:
            raise PartitionError(
                f"config key 'partition': client {cid} received no samples ({cfg.partition}); use fewer clients"
            )
        tr, te = split_train_test(
            idx, cfg.client_test_fraction, seeding.rng(cfg.seed, "client_test_split", cid)
        )
        clients[cid] = ClientIndices(tr, te)
    return FederatedData(ds, clients, part.groups)
