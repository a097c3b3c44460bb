"""The Federation protocol, the `ClientHost` that runs client functions, and `LocalFederation`.

A `ClientHost` holds some clients' data and persistent state and runs client functions on them.
`LocalFederation` wraps one host with every client (in-process, sequential); each Ray client actor
(actors/) wraps one host with its share of the clients. Both federations therefore run exactly the
same client code, which is why they give bit-identical numbers for a seed.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from fedray.client import Client, Task
from fedray.data import ArrayDataset, ClientIndices
from fedray.params import payload_nbytes

ClientFn = Callable[[Client, Any, Any], tuple[Any, Any]]
FoldFn = Callable[[Any, int, Any], Any]  # (acc, cid, reply) -> acc
TEST_SHARD = -1  # the client id a shard of the global test set poses as in test_map


class ClientError(RuntimeError):
    """A client function raised; carries the client id and the original traceback text."""

    def __init__(self, cid: int, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"client {cid}: {message}")
        self.cid = cid
        self.message = message
        self.remote_traceback = remote_traceback

    def __reduce__(self):  # keep the fields when Ray pickles the exception
        return (ClientError, (self.cid, self.message, self.remote_traceback))


class WorkerLost(RuntimeError):
    """A worker hosting clients died (its node was lost, it ran out of memory, it was killed). The
    run can go on from its last checkpoint on new workers (``max_failures``)."""


@dataclass(frozen=True)
class CallMeta:
    """Accounting for one client call: serialized size of the reply it sent, and wall time.

    Sizes are measured by the sender (the federation for what it broadcasts, the client for its
    reply), so they do not depend on how the receiver holds the object (Ray hands actors
    read-only arrays, which pickle one byte longer).
    """

    cid: int
    bytes_out: int
    seconds: float
    carry_bytes: int = 0  # relay calls: the size of the carry the client left behind (part of bytes_out)


@dataclass(frozen=True)
class Baton:
    """A value a client left in the federation instead of sending it back (FedCat's model copies
    between the rounds of a cycle). Plain data, so it can sit in an algorithm's State; the value
    stays where it was made (under Ray: in the object store of the client actor's node) until a
    later `relay` hop or `fetch` uses it, once."""

    key: int


class Traffic(NamedTuple):
    down: int  # bytes sent to clients (the algorithm's protocol: what a real deployment would send)
    up: int  # bytes sent by clients
    received: int  # bytes of the objects the caller (the coordinator) actually got back


def set_torch_threads(num_cpus: float) -> int:
    """Torch intra-op threads = the CPUs reserved for this process (at least 1)."""
    n = max(1, int(math.floor(num_cpus)))
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


class ClientHost:
    def __init__(
        self,
        task: Task,
        data: ArrayDataset,
        clients: Mapping[int, ClientIndices],
        device: torch.device | str = "cpu",
        test: ArrayDataset | None = None,
    ) -> None:
        self.task = task
        self.device = torch.device(device)
        self._data = data
        self._test = test
        self._indices = dict(clients)
        self._state: dict[int, Any] = {}
        self._model_cache: dict = {}

    @property
    def client_ids(self) -> list[int]:
        return sorted(self._indices)

    def client(self, cid: int) -> Client:
        ix = self._indices[cid]
        return Client(cid, self.task, self._data, ix.train, ix.test, self.device, self._model_cache)

    def run(self, fn: ClientFn, cid: int, msg: Any) -> tuple[Any, CallMeta]:
        if cid not in self._indices:
            raise ClientError(cid, f"not hosted here (this host has clients {self.client_ids[:10]}...)")
        t0 = time.perf_counter()
        try:
            reply, new_state = fn(self.client(cid), self._state.get(cid), msg)
        except Exception as e:  # noqa: BLE001 - re-raised with the client id attached
            raise ClientError(cid, f"{type(e).__name__}: {e}", traceback.format_exc()) from e
        self._state[cid] = new_state
        meta = CallMeta(cid, payload_nbytes(reply), time.perf_counter() - t0)
        return reply, meta

    def run_many(self, fn: ClientFn, cids: Sequence[int], msg: Any) -> list[tuple[Any, CallMeta]]:
        return [self.run(fn, cid, msg) for cid in cids]

    def get_state(self, cid: int) -> Any:
        """Client ``cid``'s persistent state (None if it has none): what a checkpoint saves."""
        return self._state.get(cid)

    def set_state(self, cid: int, state: Any) -> None:
        """Restore client ``cid``'s persistent state (from a checkpoint)."""
        if cid not in self._indices:
            raise ClientError(cid, f"not hosted here (this host has clients {self.client_ids[:10]}...)")
        self._state[cid] = state

    def relay(self, fn: ClientFn, cid: int, carry: Any, common: Any) -> tuple[Any, Any, CallMeta]:
        """One relay hop (see `Federation.relay`): ``fn`` gets ``(carry, common)`` and returns
        ``(carry_out, info)``; the three results travel separately, so a caller can leave
        ``carry_out`` where it is and take only ``info`` and the meta."""
        reply, meta = self.run(fn, cid, (carry, common))
        if not (isinstance(reply, tuple) and len(reply) == 2):
            raise ClientError(
                cid, f"a relay client function returns (carry, info), got {type(reply).__name__}"
            )
        out, info = reply
        return out, info, replace(meta, carry_bytes=payload_nbytes(out))

    def run_test(self, fn: ClientFn, start: int, stop: int, msg: Any) -> Any:
        """Run ``fn`` on test-set samples [start, stop) posing as client TEST_SHARD's own test split."""
        if self._test is None:
            raise RuntimeError("this host holds no global test set")
        shard = Client(
            TEST_SHARD,
            self.task,
            self._test,
            np.zeros(0, np.int64),
            np.arange(start, stop),
            self.device,
            self._model_cache,
        )
        try:
            return fn(shard, None, msg)[0]
        except Exception as e:  # noqa: BLE001 - re-raised with the shard named
            raise ClientError(
                TEST_SHARD,
                f"global test samples [{start}, {stop}): {type(e).__name__}: {e}",
                traceback.format_exc(),
            ) from e

    def num_examples(self) -> dict[int, int]:
        return {cid: len(ix.train) for cid, ix in self._indices.items()}

    def num_test_examples(self) -> dict[int, int]:
        return {cid: len(ix.test) for cid, ix in self._indices.items()}

    def label_counts(self) -> dict[int, np.ndarray]:
        return {cid: self.client(cid).label_counts() for cid in self._indices}


class Federation(Protocol):
    """What an algorithm may do with the clients (DESIGN §2)."""

    task: Task
    client_ids: list[int]

    groups: dict[int, int] | None
    """Ground-truth client groups of the partition (``dominant``), else None. Only an oracle may read it."""

    test_client_ids: list[int]
    """Clients that never train and are never sampled (FedRC's test clients, `shift`); hosted like
    the others, so client functions run on them (evaluation). Not in ``client_ids``."""

    def map(self, fn: ClientFn, cids: Sequence[int], msg: Any) -> dict[int, Any]:
        """Run ``fn`` on each client with the same ``msg`` (sent once), in parallel; replies by client id."""

    def map_groups(self, fn: ClientFn, groups: Sequence[tuple[Sequence[int], Any]]) -> dict[int, Any]:
        """Several messages at once: group ``(cids, msg)`` sends ``msg`` to its clients, all groups in one
        parallel dispatch (cluster-wise FedAvg trains every cluster in the same round). A client
        appears in one group at most. Replies by client id."""

    def map_fold(self, fn: ClientFn, cids: Sequence[int], msg: Any, fold: FoldFn, acc: Any) -> Any:
        """`map` whose replies are folded into ``acc`` one at a time, in sorted client order
        (``acc = fold(acc, cid, reply)``), each dropped once folded; returns the final ``acc``. The
        caller holds one reply at a time, not all of them (FedRC: 300 clients x 3 models of 8.7 MB
        each would be 7.8 GB), and the fold order, hence every float, is the same in-process and
        under Ray with any number of actors. Under Ray a reply's arrays are zero-copy views of its
        object: what ``fold`` keeps of a reply must be copied, or the whole reply stays in memory."""

    def chain(self, fn: ClientFn, chains: Sequence[Sequence[int]], first_msg: Any) -> list[Any]:
        """Sequential hand-off inside each chain (client j's reply is client j+1's msg), chains in parallel.

        Returns the last reply of each chain.
        """

    def relay(self, fn: ClientFn, hops: Sequence[tuple[int, Any]], common: Any) -> list[tuple[Baton, Any]]:
        """One hop per ``(cid, carry)``, all hops in parallel: ``fn(client, cstate, (carry, common))``
        returns ``((carry_out, info), cstate)``. ``carry_out`` stays in the federation as a `Baton`
        and only the small ``info`` comes back; a ``carry`` may be a Baton from an earlier relay,
        whose value goes straight to the client (under Ray, actor to actor: the caller never holds
        it). This is `chain` spread over rounds: FedCat's copies travel device to device through a
        cycle and the coordinator receives them only when it aggregates (`fetch`). Hops to one
        client run in the given order. Returns ``(baton, info)`` per hop, in hop order."""

    def fetch(self, batons: Sequence[Baton]) -> list[Any]:
        """The values behind ``batons``, brought to the caller; each Baton is used up."""

    def test_map(self, fn: ClientFn, msg: Any) -> list[Any]:
        """Run ``fn`` over the global test set, split into whole eval batches across the workers.

        ``fn`` sees a client (id TEST_SHARD) whose ``test_batches()`` are its shard; it returns a
        list with one entry per batch. The lists come back concatenated in batch order, so the
        result does not depend on how many workers there are.
        """

    def num_examples(self, cids: Sequence[int] | None = None) -> dict[int, int]: ...

    def num_test_examples(self, cids: Sequence[int] | None = None) -> dict[int, int]: ...

    def label_counts(self, cids: Sequence[int] | None = None) -> dict[int, np.ndarray]:
        """Per-client class counts. Only algorithms whose paper lets the server see them may call this."""

    def sample(self, fraction: float, rng: np.random.Generator) -> list[int]: ...

    def take_traffic(self) -> Traffic:
        """Bytes down, up and received by the caller since the last call, then reset."""

    # --- for the round loop's checkpoints (fedray/checkpoint.py), not for algorithms -------------
    def client_states(self) -> Iterator[tuple[int, Any]]:
        """Every hosted client's persistent state (test clients too), in client order, one at a time."""

    def restore_client_states(self, states: Iterable[tuple[int, Any]]) -> None:
        """Give clients back the states `client_states` produced (in a new federation: a resumed run)."""

    def peek_baton(self, baton: Baton) -> Any:
        """The value behind ``baton``, which stays usable (a checkpoint of a State holding Batons)."""

    def restore_baton(self, key: int, value: Any) -> Baton:
        """Put ``value`` back behind a Baton with ``key`` (the State being restored names it)."""

    def close(self) -> None:
        """Release workers (actors, placement group); the federation is unusable afterwards."""


def test_shards(num_samples: int, batch_size: int, workers: int) -> list[tuple[int, int]]:
    """Split [0, num_samples) into at most ``workers`` contiguous ranges of whole batches."""
    batches = -(-num_samples // batch_size)
    parts = [p for p in np.array_split(np.arange(batches), min(workers, batches)) if len(p)]
    return [(int(p[0]) * batch_size, min(int(p[-1] + 1) * batch_size, num_samples)) for p in parts]


def participants(num_clients: int, fraction: float) -> int:
    """Clients per round: max(1, floor(N * fraction)) (the epsilon: 0.1 * 10 is 0.999... in floating point)."""
    return max(1, int(math.floor(num_clients * fraction + 1e-9)))


def sample_clients(client_ids: Sequence[int], fraction: float, rng: np.random.Generator) -> list[int]:
    """NIID-Bench sampling: the first `participants` ids of a random permutation, sorted."""
    ids = np.asarray(sorted(client_ids))
    k = participants(len(ids), fraction)
    return sorted(int(c) for c in rng.permutation(ids)[:k])


class TrafficMeter:
    """Bytes sent to clients (down) and by clients (up), from the sender's measurements, and the
    bytes of the objects the caller received (replies and metas it fetched; a relay's carries stay
    out until fetched). Every count is of the objects themselves, so it is the same in-process and
    under Ray with any number of actors."""

    def __init__(self) -> None:
        self.down = 0
        self.up = 0
        self.received = 0

    def broadcast(self, msg: Any, receivers: int) -> None:
        self.down += payload_nbytes(msg) * receivers

    def replies(self, metas: Sequence[CallMeta]) -> None:
        self.up += sum(m.bytes_out for m in metas)
        self.received += sum(m.bytes_out + payload_nbytes(m) for m in metas)

    def relay_hops(
        self, carry_sizes: Sequence[int], common: Any, infos: Sequence[Any], metas: Sequence[CallMeta]
    ) -> None:
        """Each hop's client received its carry and the common message and sent carry + info; the
        caller received only the infos and metas."""
        self.down += sum(carry_sizes) + payload_nbytes(common) * len(carry_sizes)
        self.up += sum(m.bytes_out for m in metas)
        self.received += sum(payload_nbytes(i) + payload_nbytes(m) for i, m in zip(infos, metas, strict=True))

    def fetched(self, sizes: Sequence[int]) -> None:
        self.received += sum(sizes)

    def chains(self, first_msg: Any, chains: Sequence[Sequence[int]], metas: Sequence[CallMeta]) -> None:
        """Each chain's first client receives first_msg; every later client receives its predecessor's reply."""
        self.broadcast(first_msg, sum(1 for c in chains if c))
        pos = 0
        for chain in chains:
            hops = metas[pos : pos + len(chain)]
            self.down += sum(m.bytes_out for m in hops[:-1])
            self.up += sum(m.bytes_out for m in hops)
            self.received += sum(payload_nbytes(m) for m in hops) + (hops[-1].bytes_out if hops else 0)
            pos += len(chain)

    def take(self) -> Traffic:
        out = Traffic(self.down, self.up, self.received)
        self.down = self.up = self.received = 0
        return out


class BatonStore:
    """What a federation keeps behind its Batons: the value (or, under Ray, its ObjectRef) and its size."""

    def __init__(self) -> None:
        self._items: dict[int, tuple[Any, int]] = {}
        self._next = 0

    def park(self, value: Any, nbytes: int) -> Baton:
        self._next += 1
        self._items[self._next] = (value, nbytes)
        return Baton(self._next)

    def take(self, baton: Baton) -> tuple[Any, int]:
        try:
            return self._items.pop(baton.key)
        except KeyError:
            raise ValueError(
                f"{baton} was already used (a Baton is used once) or is not from this federation"
            ) from None

    def peek(self, baton: Baton) -> tuple[Any, int]:
        try:
            return self._items[baton.key]
        except KeyError:
            raise ValueError(f"{baton} was already used or is not from this federation") from None

    def restore(self, key: int, value: Any, nbytes: int) -> Baton:
        self._items[key] = (value, nbytes)
        self._next = max(self._next, key)
        return Baton(key)

    def __len__(self) -> int:
        return len(self._items)


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
    ):
        set_torch_threads(num_threads)  # same thread count as one actor: same floating-point path
        self.task = task
        self.host = ClientHost(task, train, clients, test=test)
        self._test_size = len(test)
        super().__init__(self.host, groups, test_clients)

    def map(self, fn: ClientFn, cids: Sequence[int], msg: Any) -> dict[int, Any]:
        return self.map_groups(fn, [(cids, msg)])

    def map_groups(self, fn: ClientFn, groups: Sequence[tuple[Sequence[int], Any]]) -> dict[int, Any]:
        check_groups(groups)
        out: dict[int, Any] = {}
        for cids, msg in groups:
            results = self.host.run_many(fn, sorted(cids), msg)
            self._traffic.broadcast(msg, len(results))
            self._traffic.replies([m for _, m in results])
            out.update({m.cid: r for r, m in results})
        return dict(sorted(out.items()))

    def map_fold(self, fn: ClientFn, cids: Sequence[int], msg: Any, fold: FoldFn, acc: Any) -> Any:
        cids = sorted(cids)
        self._traffic.broadcast(msg, len(cids))
        for cid in cids:
            reply, meta = self.host.run(fn, cid, msg)
            self._traffic.replies([meta])
            acc = fold(acc, cid, reply)
        return acc

    def chain(self, fn: ClientFn, chains: Sequence[Sequence[int]], first_msg: Any) -> list[Any]:
        finals, metas = [], []
        for chain in chains:
            msg = first_msg
            for cid in chain:
                msg, meta = self.host.run(fn, cid, msg)
                metas.append(meta)
            finals.append(msg)
        self._traffic.chains(first_msg, chains, metas)
        return finals

    def relay(self, fn: ClientFn, hops: Sequence[tuple[int, Any]], common: Any) -> list[tuple[Baton, Any]]:
        out, sizes, infos, metas = [], [], [], []
        for cid, carry in hops:
            carry, size = (
                self._batons.take(carry) if isinstance(carry, Baton) else (carry, payload_nbytes(carry))
            )
            value, info, meta = self.host.relay(fn, cid, carry, common)
            out.append((self._batons.park(value, meta.carry_bytes), info))
            sizes.append(size)
            infos.append(info)
            metas.append(meta)
        self._traffic.relay_hops(sizes, common, infos, metas)
        return out

    def fetch(self, batons: Sequence[Baton]) -> list[Any]:
        taken = [self._batons.take(b) for b in batons]
        self._traffic.fetched([n for _, n in taken])
        return [v for v, _ in taken]

    def test_map(self, fn: ClientFn, msg: Any) -> list[Any]:
        return self.host.run_test(fn, 0, self._test_size, msg)

    def client_states(self) -> Iterator[tuple[int, Any]]:
        for cid in self.host.client_ids:
            yield cid, self.host.get_state(cid)

    def restore_client_states(self, states: Iterable[tuple[int, Any]]) -> None:
        for cid, state in states:
            self.host.set_state(cid, state)

    def peek_baton(self, baton: Baton) -> Any:
        return self._batons.peek(baton)[0]

    def restore_baton(self, key: int, value: Any) -> Baton:
        return self._batons.restore(key, value, payload_nbytes(value))

    def close(self) -> None:
        """Nothing to release in-process."""


def make_local_federation(cfg: Any, data: Any) -> tuple[LocalFederation, dict[str, Any]]:
    """The `execute` factory for ``--local``: every client in this process, one at a time."""
    task = Task.from_config(cfg, data.dataset.spec)
    fed = LocalFederation(
        task,
        data.dataset.train,
        data.dataset.test,
        data.clients,
        num_threads=cfg.num_cpus_per_actor,
        groups=data.groups,
        test_clients=data.test_clients,
    )
    return fed, {"mode": "local", "actors": 0, "torch_threads": torch.get_num_threads()}
