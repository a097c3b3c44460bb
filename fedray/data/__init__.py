"""Datasets, client partitions, and the per-run federated data (arrays + per-client indices).

May import: `fedray.config`, `fedray.models` and `fedray.params`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from fedray.config import seeding
from fedray.data import arrays as _arrays  # noqa: F401 - registers dataset 'arrays'
from fedray.data import client_files_dataset as _client_files_dataset  # noqa: F401 - registers dataset 'client_files'
from fedray.data import fedprox_synthetic as _fedprox_synthetic  # noqa: F401 - registers dataset 'fedprox_synthetic'
from fedray.data import hf as _hf  # noqa: F401 - registers dataset 'hf'
from fedray.data import leaf as _leaf  # noqa: F401 - registers datasets 'femnist' and 'shakespeare'
from fedray.data.datasets import (
    DATASETS,
    ArrayDataset,
    Dataset,
    DatasetInfo,
    DatasetKind,
    DatasetMissing,
    DataSpec,
    check_available,
    data_seed,
    data_settings,
    dataset_info,
    load_dataset,
    register_dataset,
    train_labels,
)
from fedray.data.federated import (
    ClientIndices,
    ClientSource,
    FederatedData,
    SourcedClients,
    evaluation_clients,
)
from fedray.data.held_out import check_held_out
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
from fedray.data.validation import EVALUATE_ON, held_out, hold_out_validation

if TYPE_CHECKING:
    from fedray.config.sections import DataSection

__all__ = [
    "DATASETS",
    "GROUPED_PARTITIONS",
    "PARTITIONS",
    "ArrayDataset",
    "ClientIndices",
    "ClientSource",
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
    "SourcedClients",
    "build_federated_data",
    "EVALUATE_ON",
    "check_partition",
    "data_seed",
    "train_sizes",
    "check_available",
    "data_settings",
    "dataset_info",
    "load_dataset",
    "partition_for",
    "partition_keys",
    "partition_label",
    "partition_label_keys",
    "recorded_partition",
    "register_dataset",
    "register_partition",
]


def partition_label(config: Mapping[str, Any]) -> str:
    """How reports name a run's partition, from its config mapping: #C=2, dirichlet(0.5), ... (the
    scheme's label); a dataset whose files are the clients names them (``files:FOLDER``)."""
    kind = DATASETS.get(config.get("dataset", ""))
    if kind is not None and kind.partition_label is not None:
        return kind.partition_label(config)
    scheme = PARTITIONS.get(config["partition"])
    return scheme.describe(config) if scheme is not None else str(config["partition"])


def recorded_partition(config: Mapping[str, Any]) -> str:
    """What a run's result rows name as its partition (their ``partition`` column): the config's
    partition key, or where the data set comes with its clients and names them, that name
    (``leaf``, ``hf``, ``files:FOLDER``): no partition key is read then."""
    kind = DATASETS.get(config.get("dataset", ""))
    if kind is not None and kind.own_clients and kind.partition_label is not None:
        return kind.partition_label(config)
    return str(config["partition"])


def partition_for(section: DataSection, labels: np.ndarray, num_classes: int) -> Partition:
    scheme = PARTITIONS[section.partition]
    return scheme.draw(
        labels, scheme.params_for(section, num_classes), seeding.rng(data_seed(section), "partition")
    )


def draw_partition(section: DataSection, labels: np.ndarray, num_classes: int) -> Partition:
    """The run's partition; `PartitionError` (naming the config key) if it cannot be drawn, or if a
    draw (a plug-in's) gives what is not a partition of this training set: another number of clients
    than num_clients, or a client's indices that are not integers in [0, training samples) (a list
    of ints is taken as its int64 array)."""
    part = partition_for(section, labels, num_classes)
    _check_drawn(section, part, len(labels))
    for cid, idx in enumerate(part.clients):
        if len(idx) == 0:
            raise PartitionError(
                f"config key 'partition': client {cid} received no samples ({section.partition}); use fewer clients"
            )
    return part


def _check_drawn(section: DataSection, part: Any, size: int) -> None:
    """``part`` is a `Partition` of a training set of ``size`` samples into num_clients clients:
    each client's indices made an int64 array, or a `PartitionError` naming the client."""
    where = f"config key 'partition': partition {section.partition!r}"
    if not isinstance(part, Partition):
        raise PartitionError(f"{where} returned a {type(part).__name__}, not a fedray.Partition")
    if len(part.clients) != section.num_clients:
        raise PartitionError(
            f"{where} gave {len(part.clients)} clients, and num_clients is {section.num_clients}"
        )
    clients = []
    for cid, idx in enumerate(part.clients):
        arr = np.asarray(idx)
        if arr.size == 0:
            arr = arr.astype(np.int64)
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise PartitionError(
                f"{where} gave client {cid} {arr.ndim}-d indices of dtype {arr.dtype}: a client's "
                "indices are a 1-d array of integers into the training set"
            )
        if arr.size and (arr.min() < 0 or arr.max() >= size):
            raise PartitionError(
                f"{where} gave client {cid} index {int(arr.min() if arr.min() < 0 else arr.max())}, outside "
                f"the training set's {size} samples"
            )
        clients.append(arr.astype(np.int64, copy=False))
    part.clients = clients
    if part.groups is not None and len(part.groups) != section.num_clients:
        raise PartitionError(f"{where} gave {len(part.groups)} groups for {section.num_clients} clients")


def check_partition(section: DataSection) -> dict[int, int]:
    """Each training client's number of training samples. Draw the run's partition now, from the training labels alone where the dataset allows (the
    draw is a pure function of the labels and the seed, so the run draws the same one later): a
    partition that cannot be drawn fails before Ray or any actor starts. Client files are read and
    checked instead (their clients are the partition)."""
    kind = DATASETS[section.dataset]
    if kind.own_clients:
        data = kind.federate(section)
        check_held_out(section, data, kind.checks_held_out)  # the run checks again as it builds its data
        testing = set(data.test_clients)
        return {
            c: len(ix.train) - held_out(len(ix.train), section.validation_fraction)
            for c, ix in data.clients.items()
            if c not in testing
        }
    labels, num_classes = train_labels(section)
    return train_sizes(section, draw_partition(section, labels, num_classes))


def train_sizes(section: DataSection, part: Partition) -> dict[int, int]:
    """Each client's training samples under ``part`` (its test split, client_test_fraction, and its
    validation split, validation_fraction, apart)."""
    sizes = {
        c: len(_split(section, c, idx, section.client_test_fraction).train)
        for c, idx in enumerate(part.clients)
    }
    return {c: n - held_out(n, section.validation_fraction) for c, n in sizes.items()}


def build_federated_data(section: DataSection) -> FederatedData:
    """The run's data and clients, and the clients its evaluation walks (config key eval_clients);
    each client's validation split held out (validation_fraction), and evaluated on in place of the
    test sets where the run evaluates on validation (fedray.data.validation)."""
    data = _federate(section)
    check_held_out(section, data, DATASETS[section.dataset].checks_held_out)
    if data.eval_clients is None and section.eval_clients:
        testing = set(data.test_clients)
        training = [c for c in sorted(data.clients) if c not in testing]
        data.eval_clients = evaluation_clients(section.seed, training, section.eval_clients)
    return hold_out_validation(
        data, section.validation_fraction, data_seed(section), section.evaluate_on == "validation"
    )


def _federate(section: DataSection) -> FederatedData:
    kind = DATASETS[section.dataset]
    if kind.own_clients:  # the data set comes with its clients (client_files, fedprox_synthetic)
        return kind.federate(section)
    ds = load_dataset(section)
    part = draw_partition(section, ds.train.y, ds.spec.num_classes)
    if section.shift != "none":
        return _shifted(section, ds, part.clients)
    scheme = PARTITIONS[section.partition]
    if scheme.rebuild is not None:  # rotation: each group's copies rotated; local test splits with them
        params = scheme.params_for(section, ds.spec.num_classes)
        x, y, ranges = scheme.rebuild(ds.train.x, ds.train.y, part, params)
        clients = {cid: _split(section, cid, r, section.client_test_fraction) for cid, r in enumerate(ranges)}
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
            cid: _split(section, cid, idx, section.client_test_fraction)
            for cid, idx in enumerate(part.clients)
        }
    return FederatedData(ds, clients, part.groups)


def _split(section: DataSection, cid: int, idx: np.ndarray, fraction: float) -> ClientIndices:
    tr, te = split_train_test(idx, fraction, seeding.rng(data_seed(section), "client_test_split", cid))
    return ClientIndices(tr, te)


def _shifted(section: DataSection, ds: Dataset, parts: list[np.ndarray]) -> FederatedData:
    """FedRC's shift benchmark: every client's data copied under its concept and corruption, then the
    three test clients (the whole test set under each concept, split 90/10)."""
    n = len(parts)
    shifts = assign_shifts(n, section.shift, data_seed(section))
    test_idx = np.arange(len(ds.test.y))
    x = np.concatenate([ds.train.x, ds.test.x])
    y = np.concatenate([ds.train.y, ds.test.y])
    all_parts = [*parts, *[test_idx + len(ds.train.y)] * TEST_CLIENTS]
    all_shifts = [*shifts, *(ClientShift(c) for c in range(TEST_CLIENTS))]
    sx, sy, ranges = shifted_arrays(x, y, all_parts, all_shifts, ds.spec.num_classes, data_seed(section))
    clients = {cid: _split(section, cid, r, section.client_test_fraction) for cid, r in enumerate(ranges[:n])}
    test_clients = list(range(n, n + TEST_CLIENTS))
    clients.update({cid: _split(section, cid, ranges[cid], 0.1) for cid in test_clients})
    shifted = replace(ds, train=ArrayDataset(sx, sy))
    groups = np.array([s.concept for s in shifts])
    origin = np.concatenate(all_parts)
    return FederatedData(shifted, clients, groups, test_clients, all_shifts, origin, len(ds.train))
