"""Dataset ``client_files`` (one file per client, read by `fedray.data.client_files`) registered as a
data set with its own clients: its files are the clients, so no partition is drawn."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedray.config import seeding
from fedray.config.coercion import ConfigError
from fedray.data.client_files import (
    META,
    ClientFilesError,
    client_paths,
    read_client,
    read_global_test,
    read_meta,
)
from fedray.data.datasets import (
    ArrayDataset,
    Dataset,
    DatasetInfo,
    DatasetKind,
    DatasetMissing,
    DataSpec,
    data_seed,
    register_dataset,
)
from fedray.data.federated import ClientIndices, FederatedData
from fedray.data.partitions import split_train_test

if TYPE_CHECKING:
    from fedray.config.sections import DataSection


def client_files_data(section: DataSection) -> FederatedData:
    """A dataset given as one file per client (`fedray.data.client_files`): every client's arrays
    laid out one after another (training split, then its test split), test clients last."""
    root = Path(section.resolved_data_root())
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
        if n_te == 0 and section.client_test_fraction > 0 and cid < len(train_paths):
            train, test = split_train_test(
                train, section.client_test_fraction, seeding.rng(data_seed(section), "client_test_split", cid)
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


def _client_files_info(section: DataSection) -> DatasetInfo:
    meta = read_meta(section.resolved_data_root())
    return DatasetInfo(meta.input_shape, meta.num_classes, None, meta.mean is not None)


def _check_files(section: DataSection, info: DatasetInfo) -> None:
    """The clients are the files: their count is num_clients; nothing else draws or splits them."""
    try:
        train, _ = client_paths(section.resolved_data_root())
    except (ClientFilesError, OSError) as e:
        raise ConfigError(f"config key 'data_root': {e}") from None
    if section.num_clients != len(train):
        raise ConfigError(
            f"config key 'num_clients': data_root {section.resolved_data_root()!r} holds {len(train)} client files; "
            f"set num_clients: {len(train)}"
        )
    if section.partition == "file":
        raise ConfigError(
            "config key 'partition': client_files are their own partition; partition: file cannot apply"
        )
    if section.shift != "none":
        raise ConfigError(
            "config key 'shift': a shift preset builds its own clients; it does not apply to client_files"
        )


def _client_files_available(section: DataSection) -> None:
    try:
        client_paths(Path(section.resolved_data_root()))
    except (ClientFilesError, OSError) as e:
        raise DatasetMissing(str(e)) from None


def _client_files_files(section: DataSection) -> tuple[Path, list[Path]]:
    """What it reads: meta.json, every client's file, and global_test.npz where there is one."""
    _client_files_available(section)
    root = Path(section.resolved_data_root())
    train, test = client_paths(root)
    extra = [root / "global_test.npz"] if (root / "global_test.npz").is_file() else []
    return root, [root / META, *train, *test, *extra]


def _client_files_label(config: Mapping[str, Any]) -> str:
    return f"files:{Path(config.get('data_root') or 'client_files').name}"


register_dataset(
    DatasetKind(
        "client_files",
        lambda section: client_files_data(section).dataset,
        _client_files_info,
        available=_client_files_available,
        check_info=_check_files,
        federate=client_files_data,
        clients_why="its files are the clients",
        partition_label=_client_files_label,
        count_clients=lambda section: len(client_paths(section.resolved_data_root())[0]),
        data_seed=0,
        files=_client_files_files,
    )
)
