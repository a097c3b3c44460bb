"""Test samples that are training samples, for every data set.

A sample is the same as another where its input, as the model reads it, and its label are the same
(`row_keys`: a 16-byte BLAKE2b digest of the input's bytes and the label). A run's test samples are
its data set's test set and the clients' own test splits (a test client's too); its training
samples are the training clients' training splits. A test set made only of training samples is
refused before any round (its accuracy would be training accuracy): by the command's checks, before
Ray, for a data set that comes with its clients (client_files, hf, LEAF: they are read there
anyway); as the run builds its data, for one whose test set is read only then. Some shared are
said once, with how many: the accuracy is then partly training accuracy.

A data set whose own loader checks its test set against its training set, naming its own keys
(hf's ``data.test_split``, LEAF's ``test/`` folder), says ``DatasetKind.checks_held_out``: its test
set is then not checked twice, its clients' own test splits still are.

May import: `fedray.config` and the modules of `fedray.data` below `fedray.data.__init__`.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

from fedray.config.coercion import ConfigError
from fedray.config.notes import say_once

if TYPE_CHECKING:
    from fedray.config.sections import DataSection
    from fedray.data.federated import FederatedData


def row_keys(x: np.ndarray, y: np.ndarray) -> list[bytes]:
    """Each row's key: a 16-byte BLAKE2b digest of its input as the model reads it (its bytes, of
    one dtype and shape over both splits) and its label. About 2 microseconds a 28 x 28 row (70,000
    of them in 0.15 s)."""
    flat = np.ascontiguousarray(x).reshape(len(x), -1)
    labels = np.ascontiguousarray(y, dtype="<i8")
    return [
        hashlib.blake2b(row.tobytes() + label.tobytes(), digest_size=16).digest()
        for row, label in zip(flat, labels, strict=True)
    ]


def count_seen(seen: set[bytes], x: np.ndarray, y: np.ndarray) -> int:
    """How many rows of ``x``, ``y`` have a key (`row_keys`) in ``seen``."""
    return sum(k in seen for k in row_keys(x, y))


def check_held_out(section: DataSection, data: FederatedData, own_test_checked: bool = False) -> None:
    """Refuse a run whose every test sample is a training sample; say once how many are where some
    are. ``data`` before its validation splits are held out (those are checked by what they are
    drawn from: the training splits). Clients made on demand (a `ClientSource`) are not read here."""
    if data.sourced:
        return
    ds = data.dataset
    testing = set(data.test_clients)
    train_rows = [c.train for cid, c in data.clients.items() if cid not in testing and len(c.train)]
    test_rows = [c.test for c in data.clients.values() if len(c.test)]
    local = int(sum(len(r) for r in test_rows))
    whole = 0 if own_test_checked or ds.test is None else len(ds.test)
    if not train_rows or not local + whole:
        return
    used = np.unique(np.concatenate(train_rows))
    seen = set(row_keys(ds.train.x[used], ds.train.y[used]))
    same = 0
    if local:
        rows = np.concatenate(test_rows)
        same += count_seen(seen, ds.train.x[rows], ds.train.y[rows])
    if whole:
        same += count_seen(seen, ds.test.x, ds.test.y)
    n = local + whole
    where = f"dataset {section.dataset}"
    if same == n:
        raise ConfigError(
            f"{where}: all {n} of its test samples are training samples (the same input and label): a test "
            "set that is the training set measures nothing; give it held-out samples"
        )
    if same:
        say_once(
            f"{where}: {same} of its {n} test samples are training samples too (the same input and label): "
            "its test accuracy is partly training accuracy"
        )


__all__ = ["check_held_out", "count_seen", "row_keys"]
