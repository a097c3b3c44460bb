"""The Federation protocol: what an algorithm may do with its clients, and nothing else.

An algorithm's round sends messages to clients and gets their replies back through a `Federation`:
`map` (one message to some clients), `map_groups` (a message per group), `map_fold` (replies folded
one at a time), `relay` and `fetch` (values left with the clients between rounds, FedCat's model
copies), `test_map` (the global test set, split across the workers), and what the server may know
about its clients (sizes, label counts where the paper allows, sampling). A client function
``fn(client, cstate, msg) -> (reply, new cstate)`` runs on the client's data (`fedray.engine.client.Client`)
with its persistent state. Two federations implement the protocol with the same client code, so
they give bit-identical numbers for a seed: `fedray.federation.local.LocalFederation` (in-process, one client
at a time) and `actors.federation.RayFederation` (client actors). The pieces they share live
apart: `fedray.federation.catalog` (what is known of the clients without running them, their common base),
`fedray.federation.host` (runs client functions on hosted clients), `fedray.federation.traffic` (bytes counted from the
objects themselves), `fedray.federation.batons` (values left behind a `Baton`). What the round loop needs
beyond this protocol (checkpoints, shutdown) is `fedray.experiment.loop.HostedFederation`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from fedray.engine.client import Client, Task
from fedray.engine.client import ClientError as ClientError  # raised by the engines: defined with Client
from fedray.storage.blobs import Baton

ClientFn = Callable[[Client, Any, Any], tuple[Any, Any]]
FoldFn = Callable[[Any, int, Any], Any]  # (acc, cid, reply) -> acc
TEST_SHARD = -1  # the client id a shard of the global test set poses as in test_map


class WorkerLost(RuntimeError):
    """A worker hosting clients died (its node was lost, it ran out of memory, it was killed). The
    run can go on from its last checkpoint on new workers (``max_failures``)."""


class Traffic(NamedTuple):
    down: int  # bytes sent to clients (the algorithm's protocol: what a real deployment would send)
    up: int  # bytes sent by clients
    received: int  # bytes of the objects the caller (the coordinator) actually got back


class Federation(Protocol):
    """What an algorithm may do with the clients (docs/architecture.md)."""

    task: Task
    client_ids: Sequence[int]  # a list, or a range for clients made on demand

    @property
    def num_clients(self) -> int:
        """How many training clients there are (``len(client_ids)``: FedDyn's 1/m, SCAFFOLD's N)."""

    groups: dict[int, int] | None
    """Ground-truth client groups of the partition (``dominant``), else None. Only an oracle may read it."""

    eval_client_ids: Sequence[int]
    """The training clients an evaluation walks (local and training-split accuracy): every client,
    or the fixed sample config key ``eval_clients`` draws. Evaluation helpers read it; training never."""

    test_client_ids: list[int]
    """Clients that never train and are never sampled (FedRC's test clients, `shift`); hosted like
    the others, so client functions run on them (evaluation). Not in ``client_ids``."""

    def map(self, fn: ClientFn, cids: Sequence[int], msg: Any) -> dict[int, Any]:
        """Run ``fn`` on each client with the same ``msg`` (sent once), in parallel; replies by client id."""

    def map_groups(self, fn: ClientFn, groups: Sequence[tuple[Sequence[int], Any]]) -> dict[int, Any]:
        """Several messages at once: group ``(cids, msg)`` sends ``msg`` to its clients, all groups in one
        parallel dispatch (cluster-wise FedAvg trains every cluster in the same round). A client
        appears in one group at most. Replies by client id."""

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
        """`map` whose replies are folded into ``acc`` one at a time, in sorted client order
        (``acc = fold(acc, cid, reply)``), each dropped once folded; returns the final ``acc``. The
        caller holds one reply at a time, not all of them (FedRC: 300 clients x 3 models of 8.7 MB
        each would be 7.8 GB; SCAFFOLD over 1,000 clients a round), and the fold order, hence every
        float, is the same in-process and under Ray with any number of actors. ``chunk``: a worker
        gets its clients this many to a call (trained at once where it trains batched), so about
        ``chunk`` replies per worker are in memory at a time. ``reply_bytes``: the size of one
        client's reply, where the caller knows it (0: it does not): a worker then takes as many
        clients a call as fit the replies it holds at a time (``chunk`` unused; 64 MB on the CPU, a
        share of the device's memory on a GPU: `fedray.federation.host.fold_bytes`), and trains
        them in stacks that wide. Under Ray a reply's arrays are zero-copy views of its object:
        what ``fold`` keeps of a reply must be copied, or the whole reply stays in memory."""

    def relay(self, fn: ClientFn, hops: Sequence[tuple[int, Any]], common: Any) -> list[tuple[Baton, Any]]:
        """One hop per ``(cid, carry)``, all hops in parallel: ``fn(client, cstate, (carry, common))``
        returns ``((carry_out, info), cstate)``. ``carry_out`` stays in the federation as a `Baton`
        and only the small ``info`` comes back; a ``carry`` may be a Baton from an earlier relay,
        whose value goes straight to the client (under Ray, actor to actor: the caller never holds
        it). FedCat's copies travel device to device through a
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


def participants(num_clients: int, fraction: float) -> int:
    """Clients per round: max(1, floor(N * fraction)) (the epsilon: 0.1 * 10 is 0.999... in floating point)."""
    return max(1, int(math.floor(num_clients * fraction + 1e-9)))


def sample_clients(client_ids: Sequence[int], fraction: float, rng: np.random.Generator) -> list[int]:
    """NIID-Bench sampling: the first `participants` ids of a random permutation, sorted."""
    return sample_sorted(np.asarray(sorted(client_ids)), fraction, rng)


def sample_sorted(ids: np.ndarray, fraction: float, rng: np.random.Generator) -> list[int]:
    """`sample_clients` of ids given already sorted, as an array (no copy of a million ids)."""
    k = participants(len(ids), fraction)
    return sorted(int(c) for c in rng.permutation(ids)[:k])
