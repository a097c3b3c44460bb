"""`ClientHost`: some clients' data and persistent state, and the client functions run on them.

`fedray.federation.local.LocalFederation` wraps one host with every client; each Ray client actor (actors/)
wraps one host with its share of the clients: the same client code runs either way.
"""

from __future__ import annotations

import math
import os
import time
import traceback
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from fedray.config.notes import say_once
from fedray.data import ArrayDataset, ClientIndices, SourcedClients
from fedray.engine import choice, drive, step_options
from fedray.engine.client import Client, Task, code_name, share_device_memory
from fedray.federation import TEST_SHARD, ClientError, ClientFn
from fedray.federation.client_states import ClientStates, machine_memory, memory_share
from fedray.params import payload_nbytes
from fedray.storage.blobs import CheckpointError, StateFile, encode

# The replies a worker holds at a time in a folded round (`Federation.map_fold` given
# ``reply_bytes``), and so the widest stack it trains them in: on the CPU `FOLD_BYTES`, whatever
# the machine (the cross-device memory figures in docs/benchmark.md are measured with it); on a GPU
# a `FOLD_SHARE`-th of the device memory the worker may use, so a stack is as wide as the device
# allows (`fold_bytes`).
FOLD_BYTES = 64 << 20
FOLD_SHARE = 32


def device_memory(device: torch.device) -> tuple[int, int]:
    """The device's memory this process could use and its total, in bytes (the CUDA queries
    `fold_bytes` makes): what is free, and what this process's allocator holds unused (an earlier
    run's in a reused actor), so a sweep's runs in one actor get the same budget, and the same
    stacks."""
    free, total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free + cached), int(total)


def fold_bytes(
    device: torch.device, gpu_share: float = 1.0, cpus: float | None = None, hosts: int = 1
) -> int:
    """The bytes of replies a worker takes at a time in a folded round. On the CPU `FOLD_BYTES`. On
    a CUDA device a `FOLD_SHARE`-th of the device memory this worker may use (``gpu_share``: its
    share of the device, a Ray actor's fraction of a GPU; or what is free now, where less), shared
    by the ``hosts`` of a pack; never more than a `FOLD_SHARE`-th of its share of the machine's
    memory (``cpus`` of its cores; the replies come back there), never less than `FOLD_BYTES`. A
    stack of replies this size trains in several times as much (gradients, momentum buffers, and
    each model's activations at the batch size: FedRC's CNN at batch 128 about 6 times its
    parameters in all), so the stack stays well within the worker's share of the device."""
    if device.type != "cuda":
        return FOLD_BYTES
    free, total = device_memory(device)
    on_device = min(free, int(total * gpu_share)) // (FOLD_SHARE * hosts)
    in_memory = int(machine_memory() * memory_share(cpus)) // (FOLD_SHARE * hosts)
    return max(FOLD_BYTES, min(on_device, in_memory))


def clients_a_call(budget: int, reply_bytes: int, chunk: int = 1) -> int:
    """How many clients a worker with ``budget`` bytes for replies (`fold_bytes`) takes a call in a
    folded round whose replies are ``reply_bytes`` each; ``chunk`` where no size is given (0)."""
    if reply_bytes <= 0:
        return max(1, chunk)
    return max(1, budget // reply_bytes)


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
    stacked: bool = False  # the call's training ran in the stacked engine (fedray/engine/batched.py)


def set_torch_threads(num_cpus: float) -> int:
    """Torch intra-op threads = the CPUs reserved for this process (at least 1)."""
    n = max(1, int(math.floor(num_cpus)))
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def cuda_determinism(deterministic: bool, tf32: bool = True) -> None:
    """Deterministic CUDA kernels (or not) for this process, before its first CUDA call: cuBLAS
    needs a fixed workspace (CUBLAS_WORKSPACE_CONFIG) for reproducible sums, cuDNN must not pick
    its algorithms by timing them, and torch then chooses deterministic kernels (warning, not
    failing, for an operation that has none). ``tf32``: cuDNN's convolutions may use TF32 (torch's
    default; matrix products stay float32, torch's default too); false: float32 everywhere."""
    torch.backends.cudnn.allow_tf32 = tf32
    if not tf32:
        torch.backends.cuda.matmul.allow_tf32 = False
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = deterministic
    torch.use_deterministic_algorithms(deterministic, warn_only=True)


def test_shards(num_samples: int, batch_size: int, workers: int) -> list[tuple[int, int]]:
    """Split [0, num_samples) into at most ``workers`` contiguous ranges of whole batches."""
    batches = -(-num_samples // batch_size)
    parts = [p for p in np.array_split(np.arange(batches), min(workers, batches)) if len(p)]
    return [(int(p[0]) * batch_size, min(int(p[-1] + 1) * batch_size, num_samples)) for p in parts]


# Samples of clients made on demand (a ClientSource's) that a host keeps for reuse, least recently
# used dropped first: a client's training call and its evaluation right after use one making.
MADE_BYTES = 128 << 20


class ClientHost:
    """Some clients, their data and their persistent state. ``clients`` maps each hosted client to
    its indices into ``data``; or it is `SourcedClients`, whose samples the host makes when a client
    is used (``data`` then goes unused) and keeps up to `MADE_BYTES` of. ``cpus``: the CPUs of the
    worker it runs in, where workers share the machine (a Ray actor's; None: alone in its process),
    which its share of the machine's memory for client state follows (`default_budget_mb`), and
    ``gpu_share`` its share of its GPU (a Ray actor's fraction), which its folded rounds' stacks
    follow (`fold_bytes`)."""

    def __init__(
        self,
        task: Task,
        data: ArrayDataset,
        clients: Mapping[int, ClientIndices],
        device: torch.device | str = "cpu",
        test: ArrayDataset | None = None,
        cpus: float | None = None,
        gpu_share: float = 1.0,
    ) -> None:
        self.task = task
        self.device = torch.device(device)
        if self.device.type == "cuda":
            cuda_determinism(task.cuda_deterministic, task.cuda_tf32)
        self._data = data
        self._test = test
        self._sourced = isinstance(clients, SourcedClients)
        self._indices = clients if self._sourced else dict(clients)
        self._made: OrderedDict[int, ArrayDataset] = OrderedDict()
        self._made_bytes = 0
        self._state = ClientStates(task.client_state_memory_mb, cpus, task.run_id)
        self._model_cache: dict = {}
        self._engine: choice.Engine | None = None  # the engine it trains with (decided on first use)
        self._checked: set[int] = set()  # clients whose state was checked plain data in this process
        # the pack this host's run trains in (`fedray.sweeps.pack.Packer`): its stacked calls go through it
        self.packer: Any = None
        self.packed_calls = 0  # client calls stacked with another run's clients (in a pack)
        self._cpus, self._gpu_share = cpus, gpu_share
        self._fold_bytes: int | None = None  # `fold_bytes`, asked on first use (no CUDA call before)

    @property
    def client_ids(self) -> Sequence[int]:
        """The hosted clients in order (a range for clients made on demand)."""
        return self._indices.ids if self._sourced else sorted(self._indices)

    def client(self, cid: int) -> Client:
        ix = self._indices[cid]
        data = self._samples(cid) if self._sourced else self._data
        return Client(cid, self.task, data, ix.train, ix.test, self.device, self._model_cache)

    def _samples(self, cid: int) -> ArrayDataset:
        """Client ``cid``'s samples, made by the source (or kept from an earlier call)."""
        made = self._made.get(cid)
        if made is not None:
            self._made.move_to_end(cid)
            return made
        made = self._indices.source.samples(cid)
        size = made.x.nbytes + made.y.nbytes
        self._made[cid] = made
        self._made_bytes += size
        while self._made_bytes > MADE_BYTES and len(self._made) > 1:
            _, old = self._made.popitem(last=False)
            self._made_bytes -= old.x.nbytes + old.y.nbytes
        return made

    def sizes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The hosted clients' ids (sorted, int64), training sizes and test sizes (int64; int32 for
        clients made on demand, as their source gives them)."""
        if self._sourced:
            return self._indices.sizes()
        ids = np.array(self.client_ids, dtype=np.int64)
        train = np.array([len(self._indices[c].train) for c in self.client_ids], dtype=np.int64)
        test = np.array([len(self._indices[c].test) for c in self.client_ids], dtype=np.int64)
        return ids, train, test

    def stateful_ids(self) -> list[int]:
        """The hosted clients that hold persistent state, in order (what a checkpoint saves)."""
        return list(self._state.cids())

    def _check_hosted(self, cid: int) -> None:
        if cid not in self._indices:
            raise ClientError(cid, f"not hosted here (this host has clients {self.client_ids[:10]}...)")

    def run(self, fn: ClientFn, cid: int, msg: Any) -> tuple[Any, CallMeta]:
        return self.run_groups(fn, [([cid], msg)])[0]

    def run_many(self, fn: ClientFn, cids: Sequence[int], msg: Any) -> list[tuple[Any, CallMeta]]:
        return self.run_groups(fn, [(cids, msg)])

    def run_groups(
        self, fn: ClientFn, groups: Sequence[tuple[Sequence[int], Any]]
    ) -> list[tuple[Any, CallMeta]]:
        """``fn`` on each group's clients with the group's message, in the order given.

        A client function that trains yields its `fedray.engine.update.LocalUpdate`s (`fedray.engine.drive`):
        where this host trains batched, every update its clients yield at one point (every client
        of every group: cluster-wise FedAvg's clusters in one stack) trains in the stacked engine;
        else each client runs to its end in turn, each update in the per-client engine."""
        pairs = [(cid, msg) for cids, msg in groups for cid in cids]
        for cid, _ in pairs:
            self._check_hosted(cid)
        batched_here = self.trains_batched()
        if not batched_here:
            return [self._run_one(fn, cid, msg) for cid, msg in pairs]
        prepared = [self._prepared(cid) for cid, _ in pairs]
        t0 = time.perf_counter()
        args = (fn, [c for c, _ in prepared], [s for _, s in prepared], [m for _, m in pairs])
        engine = self.engine()  # whether it must stack, and how its step runs
        if self.packer is None:
            results, stacked = drive.run_stacked(*args, engine.required, engine.options)
        else:
            results, stacked, packed = self.packer.run_stacked(*args, engine.required, engine.options)
            self.packed_calls += sum(stacked) if packed else 0
        seconds = (time.perf_counter() - t0) / max(1, len(pairs))  # the call's time, shared out
        out = []
        for (cid, _), (reply, new_state), on in zip(pairs, results, stacked, strict=True):
            self._set_state(fn, cid, new_state)
            out.append((reply, CallMeta(cid, payload_nbytes(reply), seconds, stacked=on)))
        return out

    def _run_one(self, fn: ClientFn, cid: int, msg: Any) -> tuple[Any, CallMeta]:
        client, cstate = self._prepared(cid)  # made and read outside the timing
        t0 = time.perf_counter()
        reply, new_state = drive.run_one(fn, client, cstate, msg)
        self._set_state(fn, cid, new_state)
        return reply, CallMeta(cid, payload_nbytes(reply), time.perf_counter() - t0)

    def _set_state(self, fn: ClientFn, cid: int, state: Any) -> None:
        """Keep what ``fn`` returned as client ``cid``'s state; the first state a client returns in
        this process is checked to be plain data, as a checkpoint writes it: a mistake is named at
        the round it is made in, not at the first checkpoint many rounds later."""
        if state is not None and cid not in self._checked:
            try:
                encode(state, [], "its state")
            except CheckpointError as e:
                raise ClientError(
                    cid,
                    f"ClientStateError: client function {code_name(fn)} returned for client {cid} a state "
                    f"that is not plain data: {e}",
                    traceback.format_exc(),
                    mistake=True,
                ) from None
            self._checked.add(cid)
        self._state.set(cid, state)

    def _prepared(self, cid: int) -> tuple[Client, Any]:
        """Client ``cid`` (its samples made, where a source makes them) and its state (read back,
        where it was spilled); a failure of either names the client."""
        try:
            return self.client(cid), self._state.get(cid)
        except Exception as e:  # noqa: BLE001 - re-raised with the client id attached
            raise ClientError(
                cid, f"making its data or reading its state: {type(e).__name__}: {e}", traceback.format_exc()
            ) from e

    @property
    def fold_bytes(self) -> int:
        """The replies this host's worker takes at a time in a folded round (`fold_bytes`): decided on
        first use, then fixed for the run (so are its stacks)."""
        if self._fold_bytes is None:
            hosts = 1 if self.packer is None else self.packer.size
            self._fold_bytes = fold_bytes(self.device, self._gpu_share, self._cpus, hosts)
        return self._fold_bytes

    def join_pack(self, packer: Any) -> None:
        """Train in ``packer``'s pack (`fedray.sweeps.pack`): stacked calls go through it, and on CUDA the
        pack's hosts share out the device memory a host keeps clients' splits in and folds replies in."""
        self.packer = packer
        self._fold_bytes = None
        if self.device.type == "cuda":
            share_device_memory(self._model_cache, self.device, packer.size)

    def engine(self) -> choice.Engine:
        """The engine this host trains its clients with (config key batched_clients, on its device,
        with the task's model): decided once."""
        if self._engine is None:
            self._engine = choice.choose(self.task.batched_clients, self.device.type, self.task.build_model)
            if self._engine.model_refusal is not None and not self._engine.required:
                say_once(f"batched_clients auto trains one client at a time here: {self._engine.why}")
        return self._engine

    def trains_batched(self) -> bool:
        """Whether this host runs batched client functions (`engine`)."""
        return self.engine().stacked

    def get_state(self, cid: int) -> Any:
        """Client ``cid``'s persistent state (None if it has none): what a checkpoint saves. A state
        on disk is read and stays there (`ClientStates.peek`)."""
        return self._state.peek(cid)

    def checkpoint_state(self, cid: int, files: bool = False) -> Any:
        """What a checkpoint saves of client ``cid``: its state, or with ``files`` where the state
        is spilled, the file it is in (`fedray.storage.blobs.StateFile`, for the checkpoint to link)."""
        spilled = self._state.file(cid) if files else None
        return StateFile(str(spilled[0]), spilled[1]) if spilled is not None else self._state.peek(cid)

    def set_state(self, cid: int, state: Any) -> None:
        """Restore client ``cid``'s persistent state (from a checkpoint)."""
        self._check_hosted(cid)
        self._state.set(cid, state)

    def relay(
        self, fn: ClientFn, hops: Sequence[tuple[int, Any]], common: Any
    ) -> list[tuple[Any, Any, CallMeta]]:
        """Relay hops (see `Federation.relay`), in the given order: ``fn`` gets ``(carry, common)``
        and returns ``(carry_out, info)``; per hop, the three results travel separately, so a
        caller can leave ``carry_out`` where it is and take only ``info`` and the meta. Hops to
        distinct clients run as one call (trained in one stack where this host trains batched);
        a client's second hop runs after its first."""
        out: list[tuple[Any, Any, CallMeta]] = []
        start = 0
        while start < len(hops):
            seen: set[int] = set()
            stop = start
            while stop < len(hops) and hops[stop][0] not in seen:
                seen.add(hops[stop][0])
                stop += 1
            wave = hops[start:stop]
            got = self.run_groups(fn, [([cid], (carry, common)) for cid, carry in wave])
            for (cid, _), (reply, meta) in zip(wave, got, strict=True):
                if not (isinstance(reply, tuple) and len(reply) == 2):
                    raise ClientError(
                        cid, f"a relay client function returns (carry, info), got {type(reply).__name__}"
                    )
                carry_out, info = reply
                out.append((carry_out, info, replace(meta, carry_bytes=payload_nbytes(carry_out))))
            start = stop
        return out

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
            # the evaluations it yields, in one call (several models stacked, where this host
            # trains batched and its device gains from it)
            stack = self.trains_batched() and step_options.stacks_evaluations(
                self.device, self.engine().options
            )
            return drive.run_one(fn, shard, None, msg, stack)[0]
        except ClientError as e:  # re-raised with the shard's samples named
            raise ClientError(
                TEST_SHARD, f"global test samples [{start}, {stop}): {e.message}", e.remote_traceback
            ) from e

    def label_counts(self, cids: Sequence[int] | None = None) -> dict[int, np.ndarray]:
        """Class counts of the training splits of ``cids`` (every hosted client by default)."""
        return {cid: self.client(cid).label_counts() for cid in (self.client_ids if cids is None else cids)}
