"""Partitions another tool drew (``partition: file``), and every run's own partition written out.

A partition file says which training samples each client holds, and optionally each client's own
test split and ground-truth group. Indices count from 0 into the dataset's training set, in the
order the dataset stores it (for fmnist, the IDX file's order). Two formats, the same content:

JSON::

    {"train_size": 60000,                       # the training set's size (checked against the dataset)
     "dataset": "fmnist",                       # optional, checked when given
     "clients": {"0": {"train": [17, 4, ...],   # client ids 0 .. N-1, every one present
                       "test": [93, ...],       # optional: the client's own test split
                       "group": 2},             # optional: ground-truth group (purity, gap)
                 "1": {...}}}

Parquet: one row per (client, split, index) with integer columns ``client`` and ``index``, a
string column ``split`` (``train`` | ``test``), an optional integer column ``group``, and the
training set's size in the file's metadata under ``fedray.train_size`` (``fedray.dataset``
optional). This is the layout fedray writes to ``DIR/partitions/RUN_ID.parquet`` for every run
(with the run id, and a ``source`` column: ``train`` for indices into the training set, ``test``
for the shift preset's test clients (FedEM, FedRC), which hold the test set and are skipped when
the file is read back).

Rules, each a clear error naming the file and the client: every client 0 .. N-1 present, a
non-empty training split, indices in [0, train_size), no index twice within a client, no index in
two clients (or in a client's training and test split). A client's indices keep the file's order.
``{seed}`` in the path is replaced by the run's seed, so one config names a file per seed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TRAIN_SIZE_KEY = b"fedray.train_size"
DATASET_KEY = b"fedray.dataset"
SPLITS = ("train", "test")


class PartitionFileError(ValueError):
    """A partition file cannot be used; the message names the file (and the client)."""


@dataclass
class FilePartition:
    train: list[np.ndarray]  # client -> int64 indices into the training set, in the file's order
    test: list[np.ndarray] | None  # client -> its own test split, or None if the file has none
    groups: np.ndarray | None  # client -> ground-truth group, when the file gives every client one
    train_size: int
    dataset: str | None = None


def read(path: str | Path, shift: bool = False) -> FilePartition:
    """Read and check a partition file (JSON or Parquet, by its suffix); `PartitionFileError` if it
    is not one. With ``shift`` (a FedRC shift run), clients whose rows index the test set are
    dropped: the shift adds its test clients itself."""
    p = Path(path)
    if not p.is_file():
        raise PartitionFileError(f"partition file {str(p)!r} does not exist")
    if p.suffix.lower() == ".json":
        rows = _read_json(p)
    elif p.suffix.lower() == ".parquet":
        rows = _read_parquet(p, shift)
    else:
        raise PartitionFileError(f"partition file {str(p)!r}: expected a .json or .parquet file")
    return _check(p, *rows)


Raw = tuple[dict[int, dict[str, list[int]]], dict[int, int], int, "str | None"]


def _read_json(p: Path) -> Raw:
    try:
        doc = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PartitionFileError(f"partition file {str(p)!r} is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("clients"), dict):
        raise PartitionFileError(
            f'partition file {str(p)!r}: expected an object with "train_size" and "clients" '
            '({"0": {"train": [...], "test": [...]}, ...})'
        )
    if not isinstance(doc.get("train_size"), int) or isinstance(doc.get("train_size"), bool):
        raise PartitionFileError(f'partition file {str(p)!r}: "train_size" (an integer) is missing')
    clients: dict[int, dict[str, list[int]]] = {}
    groups: dict[int, int] = {}
    for key, entry in doc["clients"].items():
        cid = _client_id(p, key)
        if not isinstance(entry, dict):
            raise PartitionFileError(f"partition file {str(p)!r}: client {key}: expected an object")
        unknown = set(entry) - {*SPLITS, "group"}
        if unknown:
            raise PartitionFileError(
                f"partition file {str(p)!r}: client {cid}: unknown field(s) {', '.join(sorted(unknown))} "
                '(allowed: "train", "test", "group")'
            )
        clients[cid] = {}
        for split in SPLITS:
            values = entry.get(split, [])
            if not isinstance(values, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in values
            ):
                raise PartitionFileError(
                    f"partition file {str(p)!r}: client {cid}: {split!r} must be a list of integer indices"
                )
            clients[cid][split] = values
        if "group" in entry:
            if not isinstance(entry["group"], int):
                raise PartitionFileError(
                    f"partition file {str(p)!r}: client {cid}: 'group' must be an integer"
                )
            groups[cid] = entry["group"]
    dataset = doc.get("dataset")
    return clients, groups, doc["train_size"], dataset if isinstance(dataset, str) else None


def _client_id(p: Path, key: str) -> int:
    try:
        cid = int(key)
    except ValueError:
        raise PartitionFileError(f"partition file {str(p)!r}: client id {key!r} is not an integer") from None
    if cid < 0:
        raise PartitionFileError(f"partition file {str(p)!r}: client id {cid} is negative")
    return cid


def _read_parquet(p: Path, shift: bool) -> Raw:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
        raise PartitionFileError(f"partition file {str(p)!r} is not a readable Parquet file: {e}") from None
    missing = {"client", "split", "index"} - set(table.column_names)
    if missing:
        raise PartitionFileError(
            f"partition file {str(p)!r}: missing column(s) {', '.join(sorted(missing))} "
            "(needs client, split, index)"
        )
    meta = table.schema.metadata or {}
    if TRAIN_SIZE_KEY not in meta:
        raise PartitionFileError(
            f"partition file {str(p)!r}: the training set's size is missing from its metadata "
            f"({TRAIN_SIZE_KEY.decode()})"
        )
    try:
        train_size = int(meta[TRAIN_SIZE_KEY])
    except ValueError:
        raise PartitionFileError(
            f"partition file {str(p)!r}: its metadata's {TRAIN_SIZE_KEY.decode()} is not an integer "
            f"({meta[TRAIN_SIZE_KEY][:40]!r})"
        ) from None
    cols = table.to_pydict()
    if "run_id" in cols and len(set(cols["run_id"])) > 1:
        raise PartitionFileError(
            f"partition file {str(p)!r} holds the partitions of {len(set(cols['run_id']))} runs; "
            "give the file of one run"
        )
    source = cols.get("source") or ["train"] * len(cols["client"])
    test_clients = {c for c, s in zip(cols["client"], source, strict=True) if s == "test"}
    if test_clients and not shift:
        raise PartitionFileError(
            f"partition file {str(p)!r}: client(s) {_few(test_clients)} index the test set (FedRC's test "
            "clients); only a run with a shift, which adds them again, can read this file"
        )
    clients: dict[int, dict[str, list[int]]] = {}
    groups: dict[int, int] = {}
    group_col = cols.get("group")
    for i, (cid, split, index) in enumerate(zip(cols["client"], cols["split"], cols["index"], strict=True)):
        if cid in test_clients:
            continue
        if cid is None or index is None or split not in SPLITS:
            raise PartitionFileError(
                f"partition file {str(p)!r}: row {i} has client={cid}, split={split!r}, index={index} "
                "(split must be train or test; client and index integers)"
            )
        if cid < 0:
            raise PartitionFileError(f"partition file {str(p)!r}: client id {cid} is negative")
        clients.setdefault(cid, {"train": [], "test": []})[split].append(index)
        if group_col is not None and group_col[i] is not None:
            groups[cid] = group_col[i]
    dataset = meta.get(DATASET_KEY)
    return clients, groups, train_size, dataset.decode() if dataset else None


def _few(ids: Iterable[int], n: int = 5) -> str:
    ids = sorted(ids)
    more = f" and {len(ids) - n} more" if len(ids) > n else ""
    return ", ".join(map(str, ids[:n])) + more


def _check(
    p: Path,
    clients: dict[int, dict[str, list[int]]],
    groups: dict[int, int],
    train_size: int,
    dataset: str | None,
) -> FilePartition:
    where = f"partition file {str(p)!r}"
    if train_size < 1:
        raise PartitionFileError(f"{where}: train_size must be >= 1, got {train_size}")
    if not clients:
        raise PartitionFileError(f"{where}: holds no clients")
    n = max(clients) + 1
    absent = sorted(set(range(n)) - set(clients))
    if absent:
        raise PartitionFileError(
            f"{where}: client ids must be 0 .. N-1; client(s) {_few(absent)} missing (the file has {len(clients)} "
            f"clients, up to id {n - 1})"
        )
    # which client holds each index, sized by the indices the file lists (each is checked to be
    # below train_size before it is used), not by train_size: a file claiming 10^10 samples must
    # not allocate for them before the dataset's own size refuses it
    top = max((max(v) for c in clients.values() for v in c.values() if v), default=-1)
    owner = np.full(min(train_size, top + 1), -1, dtype=np.int64)
    train, test = [], []
    for cid in range(n):
        for split in SPLITS:
            idx = np.asarray(clients[cid][split], dtype=np.int64)
            if split == "train" and len(idx) == 0:
                raise PartitionFileError(f"{where}: client {cid} has no training samples")
            bad = idx[(idx < 0) | (idx >= train_size)]
            if len(bad):
                raise PartitionFileError(
                    f"{where}: client {cid}'s {split} split has index {int(bad[0])}, outside the training set "
                    f"(0 .. {train_size - 1}; train_size {train_size})"
                )
            uniq, counts = np.unique(idx, return_counts=True)
            if np.any(counts > 1):
                raise PartitionFileError(
                    f"{where}: client {cid}'s {split} split lists index {int(uniq[counts > 1][0])} more than once"
                )
            taken = owner[idx]
            if np.any(taken >= 0):
                i = int(np.flatnonzero(taken >= 0)[0])
                other = int(taken[i])
                whose = "its own other split" if other == cid else f"client {other}"
                raise PartitionFileError(
                    f"{where}: index {int(idx[i])} is in client {cid}'s {split} split and in {whose} "
                    "(a sample may belong to one client and split only)"
                )
            owner[idx] = cid
            (train if split == "train" else test).append(idx)
    has_test = any(len(t) for t in test)
    if groups and len(groups) != n:
        raise PartitionFileError(
            f"{where}: 'group' is given for {len(groups)} of {n} clients; give it for all or none "
            f"(missing for client(s) {_few(set(range(n)) - set(groups))})"
        )
    g = np.array([groups[c] for c in range(n)], dtype=np.int64) if groups else None
    return FilePartition(train, test if has_test else None, g, train_size, dataset)


def write_json(
    path: str | Path,
    train: list[np.ndarray],
    train_size: int,
    test: list[np.ndarray] | None = None,
    groups: np.ndarray | None = None,
    dataset: str | None = None,
) -> None:
    """Write a partition file in the JSON format (e.g. a partition another tool drew)."""
    clients = {}
    for cid, idx in enumerate(train):
        entry: dict[str, object] = {"train": [int(i) for i in idx]}
        if test is not None and len(test[cid]):
            entry["test"] = [int(i) for i in test[cid]]
        if groups is not None:
            entry["group"] = int(groups[cid])
        clients[str(cid)] = entry
    doc: dict[str, object] = {"train_size": int(train_size)}
    if dataset:
        doc["dataset"] = dataset
    doc["clients"] = clients
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(p)
