"""The run's lock: while a run is being written its writer holds an exclusive lock on
``runs/.RUN_ID.lock`` (flock, released by the kernel when the process dies, however it dies; the
file is removed when the writer releases it). A second writer of the same run id fails at once
instead of deleting the first one's files, and `fedray.storage.results.run_state` tells a run that
is being written now from one that was interrupted. The lock's path is opened without following
links or blocking: a link or FIFO planted there is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path


class RunLocked(RuntimeError):
    """Another live process is writing this run id into this output folder."""


UNSAFE_LOCK = "fedray writes that lock file itself: remove what is there, and see who put it there"


class UnsafeLockFile(RunLocked):
    """Something fedray did not write sits where a run's lock file goes (a symbolic link, a hard
    link to another file, a FIFO): it is refused, never followed, truncated or waited on."""


class RunLock:
    """An exclusive, non-blocking flock on ``DIR/runs/.RUN_ID.lock``; the file holds the owner's pid
    and goes when its owner releases it (a later writer makes a new one).

    The path is opened without following a symbolic link and without blocking, and must be a
    regular file with one link: whatever else is planted there is refused (`UnsafeLockFile`)."""

    def __init__(self, out_dir: str | Path, run_id: str) -> None:
        self.path = Path(out_dir) / "runs" / f".{run_id}.lock"
        self.run_id = run_id
        self._fd: int | None = None

    def held_message(self, owner: str) -> str:
        """What `acquire` says when another process holds the lock (``owner``: its pid)."""
        return (
            f"run {self.run_id} is being written into {self.path.parent.parent}/ by another process "
            f"(pid {owner} on this machine); wait for it to end, or use another output folder"
        )

    def _open(self, flags: int) -> int:
        """The lock file's descriptor, opened without following a link or blocking, checked to be a
        regular file of its own."""
        try:
            fd = os.open(self.path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnsafeLockFile(f"{self.path} is a symbolic link; {UNSAFE_LOCK}") from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            what = "a hard link to another file" if stat.S_ISREG(st.st_mode) else "not a regular file"
            raise UnsafeLockFile(f"{self.path} is {what}; {UNSAFE_LOCK}")
        return fd

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = self._open(os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.read(fd, 64).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise RunLocked(self.held_message(owner)) from None
            # Its last owner removes it on release: if that happened between our open and our lock,
            # we hold a file no longer at the path, so open the one there now.
            try:
                if os.path.samestat(os.fstat(fd), os.lstat(self.path)):
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        os.ftruncate(fd, 0)  # a regular file of its own that we hold: ours
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # while still held: nothing is left behind
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None

    def held_elsewhere(self) -> bool:
        """True if some live process holds the lock now. Read-only: a probe with a shared lock on a
        read-only descriptor, so a report over a results folder it cannot write still works."""
        if self._fd is not None:
            return False
        try:
            fd = self._open(os.O_RDONLY)
        except (FileNotFoundError, UnsafeLockFile):
            return False  # no lock, or none fedray wrote (a writer would refuse it): no live writer
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False


class SearchLock(RunLock):
    """``DIR/tune/.search.lock``: held by the `fedray tune` searching in ``DIR`` (one at a time: its
    trials' runs and ``tuned.yaml`` are written by one search), the same kind of lock as a run's."""

    def __init__(self, out_dir: str | Path) -> None:
        super().__init__(out_dir, "search")
        self.path = Path(out_dir) / "tune" / ".search.lock"

    def held_message(self, owner: str) -> str:
        return f"another fedray tune (pid {owner} on this machine) is searching in {self.path.parent.parent}/"
