"""Each client's validation split (config key ``validation_fraction``), and a run that evaluates on it
instead of the test sets (``evaluate_on: validation``): how tuning picks settings without a test sample.

A client of ``n`` training samples holds out ``held_out(n, f) = min(round(f n), n - 1)`` of them,
drawn from the data seed and the client alone (``(data seed, "validation_split", client)``), so every
run on the same data holds out the same samples whatever its training seed, algorithm or engine;
the rest stay its training samples, in their order. A client of one sample holds out none.

Evaluating on validation swaps what the evaluations read, not how: a client's own test split is its
validation split, and the global test set is every training client's validation split pooled (the
clients' samples weighted as they are). Every algorithm then evaluates as it does on test (global
model, cluster models, each client's own model), and nothing the run holds indexes a test sample:
the data set's test set is dropped, and each client's test rows are no longer any client's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from fedray.config import seeding
from fedray.data.federated import ClientIndices, ClientSource, FederatedData, SourcedClients

if TYPE_CHECKING:
    from fedray.data.datasets import ArrayDataset

EVALUATE_ON = ("test", "validation")


def held_out(n: int, fraction: float) -> int:
    """How many of ``n`` training samples a client holds out: round(fraction n), at most n - 1."""
    return max(0, min(int(round(fraction * n)), n - 1))


def validation_positions(n: int, fraction: float, seed: int, cid: int) -> np.ndarray:
    """A boolean mask over a client's ``n`` training samples: True for those held out."""
    mask = np.zeros(n, dtype=bool)
    k = held_out(n, fraction)
    if k:
        mask[seeding.rng(seed, "validation_split", cid).permutation(n)[:k]] = True
    return mask


def split_validation(
    train: np.ndarray, fraction: float, seed: int, cid: int
) -> tuple[np.ndarray, np.ndarray]:
    """A client's training indices as (the rest, its validation split), each in their order."""
    held = validation_positions(len(train), fraction, seed, cid)
    return train[~held], train[held]


@dataclass(frozen=True)
class HeldOutSource(ClientSource):
    """A `ClientSource`'s clients with their validation splits held out: a client's samples are its
    training samples less the held-out ones, then its test split, or (``on_validation``) its
    validation split in the test split's place."""

    source: ClientSource
    fraction: float
    seed: int
    on_validation: bool

    @property
    def num_clients(self) -> int:  # type: ignore[override]
        return self.source.num_clients

    def split(self, cid: int) -> tuple[int, int]:
        n_train, n_test = self.source.split(cid)
        n_val = held_out(n_train, self.fraction)
        return n_train - n_val, n_val if self.on_validation else n_test

    def samples(self, cid: int) -> ArrayDataset:
        from fedray.data.datasets import ArrayDataset

        made = self.source.samples(cid)
        n_train, _ = self.source.split(cid)
        held = validation_positions(n_train, self.fraction, self.seed, cid)
        rows = np.arange(len(made))
        train, val = rows[:n_train][~held], rows[:n_train][held]
        order = np.concatenate([train, val if self.on_validation else rows[n_train:]])
        return ArrayDataset(made.x[order], made.y[order])


def hold_out_validation(
    data: FederatedData, fraction: float, seed: int, on_validation: bool
) -> FederatedData:
    """``data`` with each training client's validation split held out of its training samples;
    with ``on_validation``, evaluating on them in place of every test sample (module docstring)."""
    from fedray.data.datasets import ArrayDataset

    if fraction <= 0:
        return data
    if data.sourced:
        source = HeldOutSource(data.clients.source, fraction, seed, on_validation)
        clients = SourcedClients(source, data.clients.ids)
        held = replace(data, clients=clients)
        if on_validation:  # the global set: the evaluated clients' validation splits, pooled
            cids = data.eval_clients if data.eval_clients is not None else list(clients.ids)
            parts = [(source.samples(c), source.split(c)[0]) for c in cids]
            x = np.concatenate([data.dataset.test.x[:0], *(p.x[n:] for p, n in parts)])
            y = np.concatenate([data.dataset.test.y[:0], *(p.y[n:] for p, n in parts)])
            held.dataset = replace(data.dataset, test=ArrayDataset(x, y))
        return held
    testing = set(data.test_clients)
    clients, pooled = {}, []
    for cid, ix in data.clients.items():
        if cid in testing:
            clients[cid] = ix
            continue
        train, val = split_validation(ix.train, fraction, seed, cid)
        clients[cid] = ClientIndices(train, val if on_validation else ix.test, val)
        pooled.append(val)
    held = replace(data, clients=clients, partition_clients=dict(data.clients))
    if on_validation:
        rows = np.concatenate(pooled) if pooled else np.zeros(0, dtype=np.int64)
        held.dataset = replace(
            data.dataset, test=ArrayDataset(data.dataset.train.x[rows], data.dataset.train.y[rows])
        )
    return held
