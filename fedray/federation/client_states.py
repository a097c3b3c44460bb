"""Clients' persistent state on a host: in memory up to a budget, beyond it on the local disk.

An algorithm's per-client state (SCAFFOLD's c_i, kept SGD buffers, FedEM's and FedRC's weights,
FedCat's copies' counts, ...) lives with the host that runs the client. Across hundreds of
thousands of clients it outgrows memory, while a round touches only its participants: so the
states beyond ``client_state_memory_mb`` (config key), least recently used first, go to files in
a folder of the host's own, in the checkpoints' format (`fedray.storage.blobs.write_blob`: arrays and
plain JSON, nothing pickled), and come back, exactly as they were, when their client is next used.

The folder is this process's under the system's temporary directory, holding a lock its owner
keeps for the folder's life; it is removed when the host goes away, and a host that starts
removes the folders whose lock nobody holds (a killed actor's): a lock, not a pid, so a process in
another PID namespace sharing the temporary directory (another container) keeps its folder.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedray.params import payload_nbytes
from fedray.storage.blobs import owner, read_blob, write_blob
from fedray.storage.checkpoint import SPILL_PREFIX

PREFIX = SPILL_PREFIX


def machine_memory() -> int:
    """Bytes of physical memory of this machine (8 GiB where the system does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def memory_share(cpus: float | None = None) -> float:
    """A worker's share of this machine's memory: ``cpus`` of its cores over all of them (workers
    filling every core share it all, as Ray places no more CPUs than a node has); a worker alone in
    its process (an in-process run, ``cpus`` None) all of it."""
    cores = max(1, os.cpu_count() or 1)
    return 1.0 if cpus is None else min(1.0, max(cpus, 0.0) / cores)


def default_budget_mb(cpus: float | None = None) -> float:
    """What ``client_state_memory_mb: 0`` means: a quarter of the worker's share of this machine's
    memory (`memory_share`)."""
    return machine_memory() / 4 * memory_share(cpus) / (1 << 20)


LOCK = ".owner.lock"  # in each spill folder: held (flock) by the process that spills there


def remove_stale(root: Path) -> None:
    """Remove the spill folders whose owner is gone (killed actors leave theirs). A folder is live
    while its owner holds the lock in it: a lock, not a process id, which another PID namespace
    (two containers sharing /tmp) would read as a dead process. A folder without a lock (being made
    now, or an earlier fedray's) is left alone."""
    for d in root.glob(PREFIX + "*"):
        lock = d / LOCK
        if d.is_symlink() or not lock.is_file() or lock.is_symlink():
            continue
        try:
            fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its owner is alive
            os.close(fd)
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
        finally:
            os.close(fd)


def _remove_own(folder: str, fd: int) -> None:
    """A spill folder's end, with its owner: removed, then its lock let go."""
    shutil.rmtree(folder, ignore_errors=True)
    os.close(fd)


class ClientStates:
    """cid -> state, in memory up to ``budget_mb``, the least recently used beyond it on disk."""

    def __init__(self, budget_mb: float = 0.0, cpus: float | None = None, run_id: str = "") -> None:
        """``budget_mb`` 0: `default_budget_mb` for a worker of ``cpus`` CPUs (None: alone).
        ``run_id``: the run the states are of, written into every spilled file."""
        self.run_id = run_id
        self._digests: dict[int, str] = {}  # cid -> the SHA-256 of its spilled file, as written
        self.budget = int((budget_mb if budget_mb > 0 else default_budget_mb(cpus)) * (1 << 20))
        self._memory: OrderedDict[int, tuple[Any, int]] = OrderedDict()  # cid -> (state, bytes), LRU first
        self._bytes = 0
        self._disk: set[int] = set()
        self._dir: Path | None = None
        self.spilled = 0  # states written to disk so far
        self.loaded = 0  # states read back

    # --- the mapping ---------------------------------------------------------------------------
    def get(self, cid: int) -> Any:
        if cid in self._memory:
            self._memory.move_to_end(cid)
            return self._memory[cid][0]
        if cid in self._disk:
            path = self._path(cid)
            state = self._read(cid)
            self._disk.discard(cid)
            path.unlink(missing_ok=True)
            self.loaded += 1
            self._keep(cid, state)
            return state
        return None

    def peek(self, cid: int) -> Any:
        """``cid``'s state, left where it is: a spilled one is read from its file and stays on disk,
        and nothing in memory moves (a checkpoint reads every state once, and must not turn the
        whole spill over)."""
        if cid in self._memory:
            return self._memory[cid][0]
        return self._read(cid) if cid in self._disk else None

    def file(self, cid: int) -> tuple[Path, str] | None:
        """The file ``cid``'s state is spilled to and its SHA-256 as written, None where the state
        is in memory (or there is none). The file is never written again: a later spill of that
        client writes a new one."""
        return (self._path(cid), self._digests[cid]) if cid in self._disk else None

    def _read(self, cid: int) -> Any:
        """A spilled state, checked to be the file as written and to be this client's."""
        return read_blob(self._path(cid), owned_by=owner(self.run_id, cid), digest=self._digests[cid])

    def set(self, cid: int, state: Any) -> None:
        self._drop(cid)
        if state is not None:
            self._keep(cid, state)

    def __contains__(self, cid: int) -> bool:
        return cid in self._memory or cid in self._disk

    def cids(self) -> Iterator[int]:
        yield from sorted([*self._memory, *self._disk])

    @property
    def memory_bytes(self) -> int:
        return self._bytes

    @property
    def on_disk(self) -> int:
        return len(self._disk)

    # --- inside ---------------------------------------------------------------------------------
    def _keep(self, cid: int, state: Any) -> None:
        size = payload_nbytes(state)
        self._memory[cid] = (state, size)
        self._bytes += size
        while self._bytes > self.budget and len(self._memory) > 1:
            old, (value, n) = self._memory.popitem(last=False)
            self._bytes -= n
            path = self._path(old)
            path.unlink(missing_ok=True)  # a new file, never the old one rewritten: a checkpoint may link it
            self._digests[old] = write_blob(
                path, value, f"client {old}'s state", sync=False, owned_by=owner(self.run_id, old)
            )
            self._disk.add(old)
            self.spilled += 1

    def _drop(self, cid: int) -> None:
        if cid in self._memory:
            self._bytes -= self._memory.pop(cid)[1]
        if cid in self._disk:
            self._disk.discard(cid)
            self._path(cid).unlink(missing_ok=True)

    def _path(self, cid: int) -> Path:
        if self._dir is None:
            root = Path(tempfile.gettempdir())
            remove_stale(root)
            folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root))
            fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for the folder's life: how others know it is live
            self._dir = folder
            weakref.finalize(self, _remove_own, str(folder), fd)
        return self._dir / f"{cid:08d}.npz"
