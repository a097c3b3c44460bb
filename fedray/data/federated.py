"""A run's federated data: the data set and every client's samples in it (`FederatedData`), built by
`fedray.data.build_federated_data` or by a data set that comes with its own clients.

Clients come in two forms. Most data sets hold every sample in two arrays, and a client is a list
of indices into them (`ClientIndices`). A data set of very many clients (a million) cannot: a
`ClientSource` makes one client's samples when that client is used, from something small (a seed),
and `SourcedClients` lists its clients without holding anything per client.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fedray.config import seeding

if TYPE_CHECKING:
    from fedray.data.datasets import ArrayDataset, Dataset
    from fedray.data.shift import ClientShift


@dataclass
class ClientIndices:
    train: np.ndarray  # indices into the global training arrays
    test: np.ndarray  # the client's own test split (also into the training arrays); may be empty
    # its validation split, held out of its training samples (validation_fraction; fedray.data.
    # validation): where the run evaluates on validation, ``test`` is this split too
    val: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


class ClientSource(ABC):
    """Clients whose samples are made on demand, each from the source alone (so any host can make
    any client, in any order, and gets the same samples). Small and picklable: it travels to every
    worker instead of the samples. A client's samples are its training split, then its test split."""

    num_clients: int

    @abstractmethod
    def split(self, cid: int) -> tuple[int, int]:
        """Client ``cid``'s training and test sizes, without making its samples."""

    @abstractmethod
    def samples(self, cid: int) -> ArrayDataset:
        """Client ``cid``'s samples: the training split first, then the test split."""

    def sizes(self, cids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Training and test sizes of ``cids``, as two int32 arrays (4 bytes a client each)."""
        got = np.array([self.split(int(c)) for c in cids], dtype=np.int32).reshape(-1, 2)
        return got[:, 0].copy(), got[:, 1].copy()


class SourcedClients(Mapping[int, ClientIndices]):
    """The clients ``ids`` of a `ClientSource` as a run's client mapping, holding nothing per client:
    a client's indices are positions in its own samples (training split first), made when asked."""

    def __init__(self, source: ClientSource, ids: range | None = None) -> None:
        self.source = source
        self.ids = range(source.num_clients) if ids is None else ids
        self._sizes: tuple[np.ndarray, np.ndarray] | None = None

    def sizes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The clients' ids (int64), training sizes and test sizes (int32), asked of the source once."""
        ids = np.arange(self.ids.start, self.ids.stop, self.ids.step, dtype=np.int64)
        if self._sizes is None:
            self._sizes = self.source.sizes(ids)
        return (ids, *self._sizes)

    def __getitem__(self, cid: int) -> ClientIndices:
        if cid not in self.ids:
            raise KeyError(cid)
        n_train, n_test = self.source.split(cid)
        return ClientIndices(np.arange(n_train), np.arange(n_train, n_train + n_test))

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, cid: object) -> bool:
        return cid in self.ids

    def part(self, ids: range) -> SourcedClients:
        """The same source's clients ``ids`` (a worker's share)."""
        return SourcedClients(self.source, ids)

    def __reduce__(self):  # pickles as the source and a range, whatever the client count
        return (SourcedClients, (self.source, self.ids))


def evaluation_clients(seed: int, ids: Sequence[int], count: int) -> list[int] | None:
    """The clients a run evaluates on (config key ``eval_clients``): ``count`` of ``ids`` drawn once
    from the run's seed, sorted; None (every client) for a count of 0 or of all of them."""
    if count <= 0 or count >= len(ids):
        return None
    picked = seeding.rng(seed, "eval_clients").choice(len(ids), count, replace=False)
    return sorted(int(ids[i]) for i in picked)


@dataclass
class FederatedData:
    dataset: Dataset
    # every client, the test clients too: a dict of indices into the data set's arrays, or
    # SourcedClients (a ClientSource's clients, each made on demand; the data set's training arrays
    # are then empty)
    clients: Mapping[int, ClientIndices]
    groups: np.ndarray | None  # ground-truth client groups, when the partition (or the shift) has them
    test_clients: list[int] = field(default_factory=list)  # non-participating test clients (FedRC's shift)
    shifts: list[ClientShift] | None = None  # each client's concept and corruption, test clients last
    # Where the rows of rebuilt arrays (rotation, shift: each client's samples copied and changed)
    # come from: origin[row] indexes the dataset's training set, or, from `origin_train_size` on,
    # its test set (FedRC's test clients). None: the rows are the dataset's training set itself.
    origin: np.ndarray | None = None
    origin_train_size: int = 0
    # the training clients the evaluation walks (their local test splits, their training splits):
    # a fixed sample (config key eval_clients); None: every client
    eval_clients: list[int] | None = None
    # the clients as the partition made them, before their validation splits were held out (what
    # DIR/partitions/ records, so `partition: file` reads the same clients back); None: ``clients``
    partition_clients: Mapping[int, ClientIndices] | None = None

    @property
    def sourced(self) -> bool:
        """Whether the clients are made on demand (`SourcedClients`) rather than indices into arrays."""
        return isinstance(self.clients, SourcedClients)

    def partition_rows(self) -> dict[str, np.ndarray]:
        """Every client's samples as the dataset indexes them, one row per (client, split, index):
        what ``DIR/partitions/`` holds, and what ``partition: file`` reads back. ``source`` says
        which of the dataset's sets the index is into (train, or test for FedRC's test clients).
        Clients made on demand have none (their samples are in no data set's arrays)."""
        if self.sourced:
            raise ValueError("clients made on demand (a ClientSource) index no data set: no partition rows")
        client, split, index = [], [], []
        made = self.clients if self.partition_clients is None else self.partition_clients
        for cid, ix in sorted(made.items()):
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


def own_splits(
    parts: Sequence[tuple[ArrayDataset, ArrayDataset]],
) -> tuple[ArrayDataset, ArrayDataset, dict[int, ClientIndices]]:
    """Clients that come with their own training and test samples (LEAF's users, a hub dataset's
    clients), client i's as ``parts[i]``: one array of every client's training then test samples,
    each client's `ClientIndices` into it, and every client's test samples pooled as the global
    test set."""
    from fedray.data.datasets import ArrayDataset

    rows_x, rows_y, pooled_x, pooled_y, clients, start = [], [], [], [], {}, 0
    for cid, (train, test) in enumerate(parts):
        rows_x += [train.x, test.x]
        rows_y += [train.y, test.y]
        pooled_x.append(test.x)
        pooled_y.append(test.y)
        n_train, n_test = len(train), len(test)
        clients[cid] = ClientIndices(
            np.arange(start, start + n_train, dtype=np.int64),
            np.arange(start + n_train, start + n_train + n_test, dtype=np.int64),
        )
        start += n_train + n_test
    return (
        ArrayDataset(np.concatenate(rows_x), np.concatenate(rows_y)),
        ArrayDataset(np.concatenate(pooled_x), np.concatenate(pooled_y)),
        clients,
    )
