"""A run's federated data: the data set and every client's samples in it (`FederatedData`), built by
`fedray.data.build_federated_data` or by a data set that comes with its own clients."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fedray.data.datasets import Dataset
    from fedray.data.shift import ClientShift


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
