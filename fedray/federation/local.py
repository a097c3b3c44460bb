"""`LocalFederation`, the in-process Federation (``fedray run --local``, tests)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from fedray.data import ArrayDataset, ClientIndices
from fedray.engine.client import Task
from fedray.federation import Baton, ClientFn, FoldFn
from fedray.federation.catalog import ClientCatalog, check_groups
from fedray.federation.host import ClientHost, clients_a_call, set_torch_threads
from fedray.params import payload_nbytes


class LocalFederation(ClientCatalog):
    """In-process, sequential federation for tests and debugging (``fedray run --local``)."""

    def __init__(
        self,
        task: Task,
        train: ArrayDataset,
        test: ArrayDataset,
        clients: Mapping[int, ClientIndices],
        num_threads: float = 1.0,
        groups: np.ndarray | None = None,
        test_clients: Sequence[int] = (),
        eval_clients: Sequence[int] | None = None,
        device: str = "cpu",
    ):
        set_torch_threads(num_threads)  # same thread count as one actor: same floating-point path
        self.task = task
        self.host = ClientHost(task, train, clients, device, test=test)
        self._test_size = len(test)
        super().__init__(self.host, groups, test_clients, eval_clients)

    def map(self, fn: ClientFn, cids: Sequence[int], msg: Any) -> dict[int, Any]:
        return self.map_groups(fn, [(cids, msg)])

    def map_groups(self, fn: ClientFn, groups: Sequence[tuple[Sequence[int], Any]]) -> dict[int, Any]:
        check_groups(groups)
        groups = [(sorted(cids), msg) for cids, msg in groups]
        results = self.host.run_groups(fn, groups)  # every group in one call: batched together
        for cids, msg in groups:
            self._traffic.broadcast(msg, len(cids))
        self._traffic.replies([m for _, m in results])
        return {m.cid: r for r, m in sorted(results, key=lambda rm: rm[1].cid)}

    def map_fold(
        self,
        fn: ClientFn,
        cids: Sequence[int],
        msg: Any,
        fold: FoldFn,
        acc: Any,
        chunk: int = 1,
        reply_bytes: int = 0,
    ) -> Any:
        cids = sorted(cids)
        step = clients_a_call(self.host.fold_bytes if reply_bytes > 0 else 0, reply_bytes, chunk)
        self._traffic.broadcast(msg, len(cids))
        for start in range(0, len(cids), step):
            for reply, meta in self.host.run_groups(fn, [(cids[start : start + step], msg)]):
                self._traffic.replies([meta])
                acc = fold(acc, meta.cid, reply)
        return acc

    def relay(self, fn: ClientFn, hops: Sequence[tuple[int, Any]], common: Any) -> list[tuple[Baton, Any]]:
        carries, sizes = [], []
        for _, carry in hops:
            carry, size = (
                self._batons.take(carry) if isinstance(carry, Baton) else (carry, payload_nbytes(carry))
            )
            carries.append(carry)
            sizes.append(size)
        got = self.host.relay(fn, [(cid, c) for (cid, _), c in zip(hops, carries, strict=True)], common)
        out = [(self._batons.park(value, meta.carry_bytes), info) for value, info, meta in got]
        self._traffic.relay_hops(sizes, common, [i for _, i, _ in got], [m for _, _, m in got])
        return out

    def fetch(self, batons: Sequence[Baton]) -> list[Any]:
        taken = [self._batons.take(b) for b in batons]
        self._traffic.fetched([n for _, n in taken])
        return [v for v, _ in taken]

    def take_packed_calls(self) -> int:
        out, self.host.packed_calls = self.host.packed_calls, 0
        return out

    def test_map(self, fn: ClientFn, msg: Any) -> list[Any]:
        return self.host.run_test(fn, 0, self._test_size, msg)

    def client_states(self, files: bool = False) -> Iterator[tuple[int, Any]]:
        for cid in self.host.stateful_ids():  # a client without state has nothing to save
            yield cid, self.host.checkpoint_state(cid, files)

    def restore_client_states(self, states: Iterable[tuple[int, Any]]) -> None:
        for cid, state in states:
            self.host.set_state(cid, state)

    def peek_baton(self, baton: Baton) -> Any:
        return self._batons.peek(baton)[0]

    def restore_baton(self, key: int, value: Any) -> Baton:
        return self._batons.restore(key, value, payload_nbytes(value))

    def close(self) -> None:
        """Nothing to release in-process."""
