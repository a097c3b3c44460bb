"""Files that are whole or not there: written aside and renamed into place (Parquet with a checksum
on every page, text), made durable (fsync of the file and its folder), a full disk said naming the
path being written, and folders fedray made removed without following a symbolic link planted
there. The results (`results`, `writer`), the checkpoints (`checkpoint`) and the models (`export`)
are all written through these.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


class DamagedResults(OSError):
    """A results file that does not read back as it was written (a checksum or its structure)."""


def open_whole(path: str | Path) -> pa.OSFile:
    """``path`` opened once for reading, to be read through that one handle, footer and pages alike:
    a writer replaces a results file by renaming a new one over it (`write_atomic`), and a reader
    that opened the path again after its footer would read the new file's pages against the old
    footer ("Page was smaller than expected"). An Arrow file, not a Python one: pyarrow reading a
    Python file object made a sweep's process abort as it exited ("terminate called without an
    active exception": 17 of 40 pairs of sweeps run at once, under load). Anything but a regular
    file (a FIFO planted there) is `DamagedResults`, never opened: opening a FIFO would wait for a
    writer."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise DamagedResults(f"results file {str(path)!r} is damaged: not a regular file")
    return pa.OSFile(str(path))


def read_checked(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """A Parquet file of the results, its pages' checksums verified (files written before
    checksums were read as they are); a damaged file is a `DamagedResults` naming it. Read
    through one handle (`open_whole`): a file replaced meanwhile reads as it was when opened."""
    try:
        with open_whole(path) as f:
            return pq.read_table(f, columns=columns, page_checksum_verification=True)
    except DamagedResults:
        raise
    except (OSError, pa.ArrowException) as e:
        raise DamagedResults(f"results file {str(path)!r} is damaged: {e}") from None


def no_space(e: OSError, path: Path) -> OSError:
    """``e`` as said where the disk is full (ENOSPC names no file): the path being written and the
    space left there. Any other error as it is."""
    if e.errno != errno.ENOSPC:
        return e
    try:
        left = f"; {shutil.disk_usage(path.parent).free / 1e6:,.1f} MB free there"
    except OSError:
        left = ""
    return OSError(
        errno.ENOSPC,
        f"no space left on the device writing {path}{left}: free some, then run the same command again "
        "(it goes on from its latest checkpoint)",
    )


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Where ``path`` is being written: a full disk is said naming it (`no_space`)."""
    try:
        yield
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        raise no_space(e, path) from None


def write_atomic(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` via a hidden temporary file, fsync, then rename. Every page
    carries a CRC-32 of its data, which `read_checked` and the analysis readers verify. A write
    that fails (a full disk) leaves no temporary file."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with writing(path), open(tmp, "wb") as f:
            pq.write_table(table, f, write_page_checksum=True)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_synced(text: str, path: Path) -> None:
    """``text`` as ``path``, on the disk when this returns."""
    with writing(path), open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def write_text_atomic(text: str, path: Path) -> None:
    """``path`` holds ``text`` whole or its old contents, never part: written aside, made durable,
    renamed into place, and the rename made durable."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write_text_synced(text, tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    fsync_dir(path.parent)


class UnsafePath(OSError):
    """A path inside the results that fedray did not make as it is (a symbolic link where it makes
    a folder): it is neither followed nor removed; the message names it."""


def refuse_link(path: Path, what: str) -> None:
    """Refuse ``path`` (``what`` says what fedray keeps there) where it is a symbolic link: fedray
    makes none inside its results, and following one would read or remove what it points to."""
    if path.is_symlink():
        raise UnsafePath(
            f"{path}: {what} is a symbolic link (to {os.readlink(path)}), which fedray never makes there; "
            "it neither follows nor removes it: put the folder itself there, or remove the link"
        )


def remove_tree(path: Path, what: str) -> None:
    """Remove a folder fedray made (gone already is fine); a symbolic link is refused, and an error
    names the path."""
    refuse_link(path, what)
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise OSError(f"cannot remove {what} {path}: {e.strerror or e}") from None
