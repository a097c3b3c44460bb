"""`ClientCatalog`: what every federation knows of its clients without running them (ids, sizes,
label counts, ground-truth groups, sampling, the traffic meter, the batons), the base both
`fedray.federation.local.LocalFederation` and `actors.federation.RayFederation` build on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedray.federation import Traffic, sample_sorted
from fedray.federation.batons import BatonStore
from fedray.federation.host import ClientHost
from fedray.federation.traffic import TrafficMeter


def check_groups(groups: Sequence[tuple[Sequence[int], Any]]) -> None:
    """Each client in one group at most, once (a caller's bug otherwise: it would train twice)."""
    seen: set[int] = set()
    for cids, _ in groups:
        for c in cids:
            if c in seen:
                raise ValueError(f"map_groups: client {c} is sent more than one message")
            seen.add(c)


class ClientCatalog:
    """What a federation knows about its clients without running them, the same in every federation:
    ids, sizes, label counts, ground-truth groups, sampling and the traffic meter. Reads a
    `ClientHost`'s indices only. Per client it holds its id and two sizes in arrays, nothing more: a
    million clients made on demand (`fedray.data.SourcedClients`) cost 16 MB here, and the
    federation's ``client_ids`` are a range."""

    def __init__(
        self,
        catalog: ClientHost,
        groups: np.ndarray | None = None,
        test_clients: Sequence[int] = (),
        eval_clients: Sequence[int] | None = None,
    ) -> None:
        self._catalog = catalog
        self.test_client_ids = sorted(test_clients)
        ids, train, test = catalog.sizes()
        self._hosted_ids, self._hosted_train = ids, train  # every hosted client, the test clients too
        keep = ~np.isin(ids, np.asarray(self.test_client_ids, dtype=np.int64))
        # Sizes of the training clients; the test clients' are apart (they never train or get sampled).
        # Without test clients these are the host's own arrays, not copies (a million clients: 16 MB).
        self._ids, self._train, self._test = (
            (ids, train, test) if keep.all() else (ids[keep], train[keep], test[keep])
        )
        hosted = catalog.client_ids
        self.client_ids: Sequence[int] = (
            hosted if isinstance(hosted, range) and keep.all() else self._ids.tolist()
        )
        self.eval_client_ids: Sequence[int] = self.client_ids if eval_clients is None else list(eval_clients)
        self.groups = None if groups is None else {c: int(groups[c]) for c in self.client_ids}
        self._traffic = TrafficMeter()
        self._batons = BatonStore()

    def _positions(self, cids: Sequence[int] | None) -> tuple[np.ndarray, np.ndarray]:
        """The training clients ``cids`` (all, by default) and their positions in the size arrays;
        KeyError for one that is not a training client."""
        if cids is None:
            return self._ids, np.arange(len(self._ids))
        want = np.asarray(cids, dtype=np.int64).reshape(-1)
        pos = np.searchsorted(self._ids, want)
        bad = (pos >= len(self._ids)) | (self._ids[np.minimum(pos, len(self._ids) - 1)] != want)
        if bad.any():
            raise KeyError(int(want[bad][0]))
        return want, pos

    @property
    def num_clients(self) -> int:
        """The training clients (``len(client_ids)``; FedRC's test clients are not among them)."""
        return len(self.client_ids)

    def num_examples(self, cids: Sequence[int] | None = None) -> dict[int, int]:
        want, pos = self._positions(cids)
        return dict(zip(want.tolist(), self._train[pos].tolist(), strict=True))

    def num_test_examples(self, cids: Sequence[int] | None = None) -> dict[int, int]:
        want, pos = self._positions(cids)
        return dict(zip(want.tolist(), self._test[pos].tolist(), strict=True))

    def label_counts(self, cids: Sequence[int] | None = None) -> dict[int, np.ndarray]:
        want, _ = self._positions(cids)
        return self._catalog.label_counts(want.tolist())

    def sample(self, fraction: float, rng: np.random.Generator) -> list[int]:
        return sample_sorted(self._ids, fraction, rng)

    def take_traffic(self) -> Traffic:
        return self._traffic.take()

    def take_client_seconds(self) -> float:
        return self._traffic.take_client_seconds()

    def take_batched_calls(self) -> int:
        return self._traffic.take_batched_calls()

    def take_packed_calls(self) -> int:
        """Client calls since the last call stacked with another run's clients (a pack,
        fedray/sweeps/pack.py), then reset; none outside a pack."""
        return 0
