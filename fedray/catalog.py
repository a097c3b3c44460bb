"""`ClientCatalog`: what every federation knows of its clients without running them (ids, sizes,
label counts, ground-truth groups, sampling, the traffic meter, the batons), the base both
`fedray.local.LocalFederation` and `actors.federation.RayFederation` build on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedray.batons import BatonStore
from fedray.federation import Traffic, sample_clients
from fedray.host import ClientHost
from fedray.traffic import TrafficMeter


def _select(d: Mapping[int, Any], cids: Sequence[int] | None) -> dict[int, Any]:
    return {c: d[c] for c in (sorted(d) if cids is None else cids)}


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
    `ClientHost`'s indices only."""

    def __init__(
        self, catalog: ClientHost, groups: np.ndarray | None = None, test_clients: Sequence[int] = ()
    ) -> None:
        self._catalog = catalog
        self.test_client_ids = sorted(test_clients)
        testing = set(test_clients)
        self.client_ids = [c for c in catalog.client_ids if c not in testing]
        self.groups = None if groups is None else {c: int(groups[c]) for c in self.client_ids}
        # Sizes of the training clients; the test clients' are apart (they never train or get sampled).
        self._all_examples = catalog.num_examples()
        self._num_examples = {c: self._all_examples[c] for c in self.client_ids}
        self._num_test = {c: n for c, n in catalog.num_test_examples().items() if c not in testing}
        self._traffic = TrafficMeter()
        self._batons = BatonStore()

    def num_examples(self, cids: Sequence[int] | None = None) -> dict[int, int]:
        return _select(self._num_examples, cids)

    def num_test_examples(self, cids: Sequence[int] | None = None) -> dict[int, int]:
        return _select(self._num_test, cids)

    def label_counts(self, cids: Sequence[int] | None = None) -> dict[int, np.ndarray]:
        counts = self._catalog.label_counts()
        return _select({c: counts[c] for c in self.client_ids} if cids is None else counts, cids)

    def sample(self, fraction: float, rng: np.random.Generator) -> list[int]:
        return sample_clients(self.client_ids, fraction, rng)

    def take_traffic(self) -> Traffic:
        return self._traffic.take()
