"""Dataset ``hf``: a federated data set in the Hugging Face hub's format, whose rows name their
client (a writer, a speaker, a device): the clients are those ids, no partition is drawn. Read with
the `datasets` library (the hub's own loader; an optional extra: ``pip install 'fedray[hf]'``).

- ``hf_name``: a folder a dataset was saved to (``Dataset.save_to_disk`` / ``DatasetDict``), or a hub
  name (``flwrlabs/femnist``, ``flwrlabs/shakespeare``), read from ``data_root/<owner>__<name>``
  where fedray saved it; ``download: true`` fetches it there once (needs the internet; nothing
  downloads otherwise, and a dataset that is not there is named in one line with what to run).
- ``hf_split`` (default ``train``): the split whose rows are the clients' samples;
  ``hf_client_column``, ``hf_input_column``, ``hf_label_column``: which columns.
- The input is an image (the ``Image`` feature or an array: grey or RGB, all of one size), text (a
  string, its characters as LEAF's 80 symbols: next-character data such as Shakespeare's), or an
  array of numbers. The label is a class id, or one character (its symbol).
- Each client's test split is ``hf_test_split``'s rows of that client where it is set, else
  ``client_test_fraction`` of its own rows (seeded); every client's test rows are the global test set.

The clients are the ids in sorted order (``num_clients`` must be their number: fedray names it).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedray.config import seeding
from fedray.config.coercion import ConfigError
from fedray.data.datasets import (
    ArrayDataset,
    Dataset,
    DatasetInfo,
    DatasetKind,
    DatasetMissing,
    DataSpec,
    register_dataset,
)
from fedray.data.federated import FederatedData, own_splits
from fedray.data.leaf import SHAKESPEARE_VOCAB, SYMBOL_INDEX
from fedray.data.partitions import split_train_test

if TYPE_CHECKING:
    from fedray.config.keys import Config

KEYS = ("hf_name", "hf_split", "hf_test_split", "hf_client_column", "hf_input_column", "hf_label_column")


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "config key 'dataset': hf reads with the datasets library, which is not installed: "
            "pip install 'fedray[hf]' (or pip install datasets)"
        ) from None
    return datasets


def local_copy(cfg: Config) -> Path:
    """Where a dataset is read from: ``hf_name`` itself where it is a folder, else the copy fedray
    keeps in ``data_root`` (``owner__name``)."""
    given = Path(cfg.hf_name).expanduser()
    if given.is_dir():
        return given
    return Path(cfg.resolved_data_root()) / re.sub(r"[^\w.-]", "__", cfg.hf_name)


def hf_available(cfg: Config) -> None:
    if not cfg.hf_name:
        raise DatasetMissing("dataset hf: set hf_name (a hub dataset, or a folder a dataset was saved to)")
    where = local_copy(cfg)
    if where.is_dir() or cfg.download:
        return
    raise DatasetMissing(
        f"dataset hf: {cfg.hf_name} is not in {str(where)!r} (nothing downloads at run time): --set download=true "
        f'fetches it there (needs the internet), or save it there yourself: python -c "import datasets; '
        f"datasets.load_dataset('{cfg.hf_name}').save_to_disk('{where}')\""
    )


def _open(cfg: Config) -> Any:
    """The dataset (a DatasetDict, or one Dataset), downloaded and kept first where asked."""
    ds = _datasets()
    where = local_copy(cfg)
    if not where.is_dir():
        hf_available(cfg)
        try:
            ds.load_dataset(cfg.hf_name).save_to_disk(str(where))
        except Exception as e:  # noqa: BLE001 - the hub's errors, said in one line
            raise DatasetMissing(
                f"dataset hf: cannot download {cfg.hf_name}: {type(e).__name__}: {e}"
            ) from None
    try:
        return ds.load_from_disk(str(where))
    except Exception as e:  # noqa: BLE001 - not a saved dataset
        raise DatasetMissing(
            f"dataset hf: {str(where)!r} is not a saved dataset ({type(e).__name__}: {e})"
        ) from None


def _split(cfg: Config, data: Any, name: str, key: str) -> Any:
    if not hasattr(data, "keys"):  # one Dataset, saved alone: its only split
        if name not in ("train", ""):
            raise ConfigError(f"config key '{key}': {cfg.hf_name} has one split, not {name!r}")
        return data
    if name not in data:
        raise ConfigError(
            f"config key '{key}': {cfg.hf_name} has no split {name!r} (its splits: {', '.join(data)})"
        )
    return data[name]


def _column(cfg: Config, split: Any, key: str) -> str:
    column = getattr(cfg, key)
    if not column or column not in split.column_names:
        raise ConfigError(
            f"config key '{key}': {column!r} is not a column of {cfg.hf_name} (its columns: {', '.join(split.column_names)})"
        )
    return column


def _symbols(texts: list[str], where: str) -> np.ndarray:
    codes = [np.frombuffer(t.encode("utf-32-le"), dtype=np.uint32) for t in texts]
    if len({len(c) for c in codes}) > 1:
        raise ConfigError(f"{where}: text inputs of one length are one model's inputs; they differ here")
    flat = np.concatenate(codes) if codes else np.zeros(0, np.uint32)
    index = np.where(flat < len(SYMBOL_INDEX), SYMBOL_INDEX[np.minimum(flat, len(SYMBOL_INDEX) - 1)], -1)
    if (index < 0).any():
        raise ConfigError(
            f"{where}: {''.join(texts)[int(np.flatnonzero(index < 0)[0])]!r} is not one of LEAF's 80 symbols"
        )
    return index.astype(np.uint8).reshape(len(texts), -1)


def _inputs(values: list[Any], where: str) -> tuple[np.ndarray, float]:
    """A column's values as model inputs and the scale that makes them the model's numbers."""
    first = values[0] if values else None
    if isinstance(first, str):
        return _symbols(values, where), 1.0
    if hasattr(first, "convert"):  # PIL images
        arrays = [
            np.asarray(v.convert("L" if v.mode in ("L", "1", "I", "I;16", "F") else "RGB")) for v in values
        ]
    else:
        arrays = [np.asarray(v) for v in values]
    if len({a.shape for a in arrays}) > 1:
        raise ConfigError(
            f"{where}: the inputs differ in shape ({arrays[0].shape}, ...): one model takes one shape"
        )
    x = np.stack(arrays) if arrays else np.zeros((0, 1))
    if x.ndim == 3 and hasattr(first, "convert"):
        x = x[:, None]  # grey: one channel
    elif x.ndim == 4 and hasattr(first, "convert"):
        x = x.transpose(0, 3, 1, 2)  # H x W x C -> C x H x W
    if x.dtype == np.uint8:
        return x, 1 / 255
    return x.astype(np.float32), 1.0


def _labels(values: list[Any], where: str) -> tuple[np.ndarray, int | None]:
    if values and isinstance(values[0], str):
        if any(len(v) != 1 for v in values):
            raise ConfigError(f"{where}: a text label is one character (the next one)")
        return _symbols(values, where)[:, 0].astype(np.int64), len(SHAKESPEARE_VOCAB)
    y = np.asarray(values, dtype=np.int64)
    if y.size and y.min() < 0:
        raise ConfigError(f"{where}: class ids count from 0, got {y.min()}")
    return y, None


def _classes(split: Any, label: str, y: np.ndarray, known: int | None) -> int:
    feature = split.features[label]
    return known or getattr(feature, "num_classes", None) or int(y.max()) + 1


def hf_data(cfg: Config) -> FederatedData:
    """The clients: the rows of ``hf_split`` grouped by ``hf_client_column``, ids sorted."""
    data = _open(cfg)
    train = _split(cfg, data, cfg.hf_split, "hf_split")
    client_col, input_col, label_col = (
        _column(cfg, train, k) for k in ("hf_client_column", "hf_input_column", "hf_label_column")
    )
    where = f"dataset hf {cfg.hf_name}"
    ids = [str(c) for c in train[client_col]]
    x, scale = _inputs(train[input_col], f"{where}: column {input_col!r}")
    y, known = _labels(train[label_col], f"{where}: column {label_col!r}")
    test_rows: dict[str, np.ndarray] = {}
    tx = ty = None
    if cfg.hf_test_split:
        test = _split(cfg, data, cfg.hf_test_split, "hf_test_split")
        tx, _ = _inputs(test[input_col], f"{where}: split {cfg.hf_test_split!r}, column {input_col!r}")
        ty, _ = _labels(test[label_col], f"{where}: split {cfg.hf_test_split!r}, column {label_col!r}")
        t_ids = np.asarray([str(c) for c in test[client_col]])
        test_rows = {c: np.flatnonzero(t_ids == c) for c in sorted(set(t_ids))}
    id_array = np.asarray(ids)
    parts = []
    for cid, name in enumerate(sorted(set(ids))):
        rows = np.flatnonzero(id_array == name)
        if cfg.hf_test_split:
            t = test_rows.get(name, np.zeros(0, np.int64))
            parts.append((ArrayDataset(x[rows], y[rows]), ArrayDataset(tx[t], ty[t])))
        else:
            keep, held = split_train_test(
                rows, cfg.client_test_fraction, seeding.rng(cfg.seed, "client_test_split", cid)
            )
            parts.append((ArrayDataset(x[keep], y[keep]), ArrayDataset(x[held], y[held])))
    train_set, test_set, clients = own_splits(parts)
    spec = DataSpec(tuple(x.shape[1:]), _classes(train, label_col, y, known), scale)
    return FederatedData(Dataset("hf", train_set, test_set, spec), clients, None)


def hf_info(cfg: Config) -> DatasetInfo:
    """Shape and classes from the dataset's first rows (memory-mapped: nothing else is read)."""
    data = _open(cfg)
    train = _split(cfg, data, cfg.hf_split, "hf_split")
    input_col, label_col = (_column(cfg, train, k) for k in ("hf_input_column", "hf_label_column"))
    x, _ = _inputs(train[:1][input_col], f"dataset hf {cfg.hf_name}: column {input_col!r}")
    y, known = _labels(train[:1][label_col], f"dataset hf {cfg.hf_name}: column {label_col!r}")
    classes = (
        known or getattr(train.features[label_col], "num_classes", None) or int(max(train[label_col])) + 1
    )
    return DatasetInfo(tuple(x.shape[1:]), classes, None)


def check_hf(cfg: Config, info: DatasetInfo) -> None:
    """The columns are there and the clients are the run's: num_clients their number."""
    train = _split(cfg, _open(cfg), cfg.hf_split, "hf_split")
    column = _column(cfg, train, "hf_client_column")
    n = len(set(train[column]))
    if n != cfg.num_clients:
        raise ConfigError(
            f"config key 'num_clients': {cfg.hf_name}'s column {column!r} names {n} clients; set num_clients: {n}"
        )
    if not cfg.hf_test_split and cfg.client_test_fraction <= 0:
        raise ConfigError(
            "config key 'client_test_fraction': dataset hf's test samples are each client's own: set "
            "client_test_fraction (e.g. 0.1), or hf_test_split to a split of the same clients"
        )
    if cfg.shift != "none":
        raise ConfigError(
            "config key 'shift': dataset hf's clients are its own; a shift preset does not apply"
        )


register_dataset(
    DatasetKind(
        "hf",
        lambda cfg: hf_data(cfg).dataset,
        hf_info,
        keys=KEYS,
        available=hf_available,
        check_info=check_hf,
        federate=hf_data,
        clients_why="its rows name their clients",
    )
)
