"""Checkpoints (docs/failures-and-checkpoints.md#failures-checkpoints-and-models): a run's algorithm `State` and every client's persistent state, between rounds.

Layout, under ``DIR/checkpoints/RUN_ID/``::

    round-000020/            one checkpoint: the state after 20 completed rounds
      manifest.json          run id, round, versions, what the round loop needs to go on (plain JSON),
                             and the SHA-256 of every file below
      state.npz              the algorithm's State (and the values behind its Batons)
      clients/000007.npz     client 7's persistent state (clients without state have no file)

A checkpoint is written under a dot-name and renamed into place once every file is on disk, so a
killed job leaves either the whole checkpoint or none of it; the last ``keep`` are kept.

Each ``.npz`` is one object in fedray's file format (`fedray.storage.blobs`: plain JSON and arrays,
never pickled), naming its run, its client and its round.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedray.storage.blobs import (
    CheckpointError,
    StateFile,
    named_owner,
    owner,
    read_blob,
    read_owner,
    sha256,
    whose_text,
    write_blob,
)
from fedray.storage.files import fsync_dir, refuse_link, remove_tree, write_text_synced

# of manifest.json: 3's files all name their owner, and its State names its round and the client
# files it was saved with; 2 has its own digest, its files may name no owner (written before they
# did); 1 (earlier fedray) has no digest. All three are read, each held to what its format promises.
MANIFEST_FORMAT = 3
MANIFEST_FORMATS = (1, 2, 3)  # those read
OWNERS_FROM = 3  # the first format whose every file names its owner


FORMAT_KEY = (
    "checkpoint_format"  # in a run's row's summary: the manifest format its checkpoints are written in
)


def written_format(summary: dict[str, Any]) -> int | None:
    """The checkpoint format a run's row says it writes (None: a row written before rows said it;
    a value that is not a format is read as the newest, the strictest)."""
    if FORMAT_KEY not in summary:
        return None
    found = summary[FORMAT_KEY]
    return (
        found
        if isinstance(found, int) and not isinstance(found, bool) and found in MANIFEST_FORMATS
        else MANIFEST_FORMAT
    )


# ------------------------------------------------------------------------------------------------
# A run's checkpoints
# ------------------------------------------------------------------------------------------------


SPILL_PREFIX = "fedray-client-state-"  # a host's spill folder under the temporary directory (client_states)


def is_spill_file(path: str | Path) -> bool:
    """Whether ``path`` is a spilled client state as `fedray.federation.client_states` writes them: a regular
    file (not a link) NNNNNNNN.npz in a spill folder directly under the system's temporary
    directory. Nothing else is ever taken into a checkpoint."""
    p = Path(path)
    try:
        st = os.lstat(p)
        folder = os.lstat(p.parent)
    except OSError:
        return False
    return (
        stat.S_ISREG(st.st_mode)
        and stat.S_ISDIR(folder.st_mode)
        and re.fullmatch(r"\d{8}\.npz", p.name) is not None
        and p.parent.name.startswith(SPILL_PREFIX)
        and os.path.realpath(p.parent.parent) == os.path.realpath(tempfile.gettempdir())
    )


def _take_file(src: StateFile, dest: Path, where: str) -> str:
    """``src``'s file as ``dest`` (a hard link, else a copy), made durable; its SHA-256. Only a
    spill file (`is_spill_file`) is taken."""
    if not os.path.lexists(src.path):
        raise CheckpointError(f"{where}: its spilled file {src.path} is gone")
    if not is_spill_file(src.path):
        raise CheckpointError(f"{where}: {src.path} is not a spilled client state file; not taken")
    try:
        os.link(src.path, dest)
    except FileNotFoundError:
        raise CheckpointError(f"{where}: its spilled file {src.path} is gone") from None
    except OSError:  # another file system (or links not allowed): copy it
        shutil.copyfile(src.path, dest)
    with open(dest, "rb") as f:
        os.fsync(f.fileno())  # spilled files are written without fsync; the checkpoint's must survive
    got = sha256(dest)
    if src.digest and got != src.digest:
        dest.unlink()
        raise CheckpointError(
            f"{where}: its spilled file {src.path} changed since fedray wrote it (its SHA-256 is not the "
            "one written): not taken into the checkpoint"
        )
    return got


def manifest_digest(manifest: dict[str, Any]) -> str:
    """The SHA-256 of a manifest's contents (every key but ``digest``, as canonical JSON)."""
    body = {k: v for k, v in manifest.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()


def _span(rounds: list[Any]) -> str:
    if not rounds:
        return "none"
    return f"{rounds[0]}..{rounds[-1]} ({len(rounds)} entries)"


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint on disk (its manifest read and its files verified)."""

    path: Path
    round: int
    extra: dict[str, Any]  # what the round loop keeps besides State (history, elapsed seconds, data)
    files: dict[str, str]  # relative path -> SHA-256
    format: int = MANIFEST_FORMAT  # its manifest's: what its files promise (`MANIFEST_FORMAT`)

    @property
    def owners(self) -> bool:
        """Whether every file of it names its owner (its format is `OWNERS_FROM` or later)."""
        return self.format >= OWNERS_FROM


@dataclass(frozen=True)
class SaveStats:
    round: int
    seconds: float
    bytes: int
    files: int


class Checkpoints:
    """The checkpoints of one run: save, find the latest, load, prune."""

    def __init__(self, out_dir: str | Path, run_id: str, keep: int = 1) -> None:
        self.root = Path(out_dir) / "checkpoints" / run_id
        self.run_id = run_id
        self.keep = keep

    def _complete(self) -> list[Path]:
        """The complete checkpoints, oldest first. A symbolic link among them is refused (fedray
        never makes one there, and reading through it would resume from what it points to)."""
        refuse_link(self.root, "the run's checkpoints folder")
        if not self.root.is_dir():
            return []
        for p in self.root.glob("round-*"):
            refuse_link(p, "a checkpoint's folder")
        found = [p for p in self.root.glob("round-*") if (p / "manifest.json").is_file()]
        return sorted(found, key=lambda p: p.name)

    def exist(self) -> bool:
        """Whether the run has a complete checkpoint (none of them read)."""
        return bool(self._complete())

    def save(
        self,
        rnd: int,
        state: Any,
        client_states: Iterable[tuple[int, Any]],
        baton: Callable[[Any], Any] | None,
        extra: dict[str, Any],
        versions: dict[str, str],
    ) -> SaveStats:
        """Write the checkpoint of round ``rnd`` atomically, then keep only the last ``keep``."""
        t0 = time.perf_counter()
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"round-{rnd:06d}"
        tmp = self.root / f".round-{rnd:06d}.{uuid.uuid4().hex[:8]}.tmp"
        (tmp / "clients").mkdir(parents=True)
        try:
            files: dict[str, str] = {}
            for cid, cstate in client_states:
                name = f"clients/{cid:06d}.npz"
                if isinstance(cstate, StateFile):  # spilled: the file itself, linked
                    files[name] = _take_file(cstate, tmp / name, f"client {cid} state")
                elif cstate is not None:
                    files[name] = write_blob(
                        tmp / name, cstate, f"client {cid} state", owned_by=owner(self.run_id, cid, round=rnd)
                    )
            # the State last, naming its round and the client files saved with it (a spilled file was
            # written in an earlier round: its digest here ties it to this checkpoint)
            whose = owner(self.run_id, round=rnd, clients=dict(files))
            files["state.npz"] = write_blob(tmp / "state.npz", state, "state", baton, owned_by=whose)
            manifest = {
                "format": MANIFEST_FORMAT,
                "run_id": self.run_id,
                "round": rnd,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "versions": versions,
                "extra": extra,
                "files": files,
            }
            manifest["digest"] = manifest_digest(manifest)
            write_text_synced(json.dumps(manifest, indent=1, allow_nan=False), tmp / "manifest.json")
            fsync_dir(tmp / "clients")
            fsync_dir(tmp)
            if final.exists():  # the same round again (a resumed run that redid it): replace it
                remove_tree(final, "the checkpoint of the round being written again")
            os.replace(tmp, final)
            fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.prune()
        size = sum((final / name).stat().st_size for name in files)
        return SaveStats(rnd, time.perf_counter() - t0, size, len(files))

    def prune(self) -> None:
        """Keep the last ``keep`` complete checkpoints. Each older one is first renamed aside (one
        atomic step: it is then no checkpoint), then removed: a prune killed halfway leaves a hidden
        folder that `tidy` removes at the next start, never a round folder half gone."""
        self.tidy()
        for old in self._complete()[: -self.keep] if self.keep > 0 else []:
            doomed = self.root / f".{old.name}.{uuid.uuid4().hex[:8]}.pruned"
            os.replace(old, doomed)
            fsync_dir(self.root)
            remove_tree(doomed, "a pruned checkpoint")

    def tidy(self) -> list[Path]:
        """Remove what a killed writer or prune left: unfinished saves (``.round-*.tmp``),
        unfinished prunes (``.round-*.pruned``) and round folders without a manifest (what an
        earlier fedray's prune left when killed halfway; a save renames its folder into place only
        with its manifest in it). Called under the run's lock. Returns what was removed."""
        gone: list[Path] = []
        if not self.root.is_dir() or self.root.is_symlink():
            return gone
        for p in self.root.iterdir():
            if p.is_symlink() or not p.is_dir():
                continue
            hidden = p.name.startswith(".round-") and p.name.endswith((".tmp", ".pruned"))
            if hidden or (p.name.startswith("round-") and not (p / "manifest.json").is_file()):
                remove_tree(p, "a leftover of a killed checkpoint write or prune")
                gone.append(p)
        return gone

    def clear(self) -> None:
        """Remove every checkpoint of the run (``--restart``); a symbolic link is refused."""
        remove_tree(self.root, "the run's checkpoints folder")

    def latest(self, least_format: int | None = None) -> Checkpoint | None:
        """The newest complete checkpoint, its files verified; None if there is none.
        ``least_format``: the manifest format this run wrote (its row in ``runs/`` says so): an
        older one is refused, so no checkpoint of a run that wrote format 3 is read under a format
        whose checks are fewer (None: a run whose records predate that, read as they were).

        Raises `CheckpointError` (naming the file) if it is damaged or edited, or is another run's.
        """
        found = self._complete()
        if not found:
            return None
        path = found[-1]
        where = path / "manifest.json"
        hint = "; delete that folder to use an earlier checkpoint, or start over with --restart"
        try:
            m = json.loads(where.read_text())
            rnd, files, extra = m["round"], m["files"], m["extra"]
            ok = (
                m.get("format") in MANIFEST_FORMATS
                and isinstance(rnd, int)
                and not isinstance(rnd, bool)
                and isinstance(files, dict)
                and isinstance(extra, dict)
                and "state.npz" in files
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{where}: unreadable ({type(e).__name__}: {e}){hint}") from None
        if not ok:
            raise CheckpointError(f"{where}: not a fedray checkpoint of format {MANIFEST_FORMAT}{hint}")
        if least_format is not None and m["format"] < least_format:
            raise CheckpointError(
                f"{where}: says format {m['format']}, but this run writes format {least_format} checkpoints "
                f"(its row in runs/ says so): relabelled to an older format, whose checks are fewer{hint}"
            )
        # the manifest checked against itself: its digest (from format 2 on; format 1 has none), its folder's round, and the rounds its history recorded
        if m["format"] >= 2 and m.get("digest") != manifest_digest(m):
            raise CheckpointError(
                f"{where}: edited or damaged (its digest does not match its contents){hint}"
            )
        if path.name != f"round-{rnd:06d}":
            raise CheckpointError(f"{where}: says round {rnd}, but its folder is {path.name}{hint}")
        history = extra.get("history")
        rounds = [h.get("round") if isinstance(h, dict) else None for h in history or []]
        if not isinstance(history, list) or rounds != list(range(1, rnd + 1)):
            raise CheckpointError(
                f"{where}: its history records rounds {_span(rounds)}, not the {rnd} rounds it says "
                f"were done{hint}"
            )
        if m.get("run_id") != self.run_id:
            raise CheckpointError(
                f"{where}: a checkpoint of run {m.get('run_id')!r}, not {self.run_id}{hint}"
            )
        for name, digest in files.items():
            file = (path / name).resolve()
            if file.parent not in (path.resolve(), (path / "clients").resolve()):
                raise CheckpointError(f"{where}: lists a file outside its folder ({name!r}){hint}")
            if not file.is_file():
                raise CheckpointError(f"{path / name}: missing (the checkpoint is incomplete){hint}")
            if sha256(file) != digest:
                raise CheckpointError(
                    f"{path / name}: its contents do not match the checksum in manifest.json (damaged "
                    f"or edited){hint}"
                )
        if m["format"] >= OWNERS_FROM:
            self._check_state_names(path, rnd, files, hint)
        else:  # files of a format that predates owners name none: one that does was written since
            for name in files:
                if read_owner(path / name) is not None:
                    raise CheckpointError(
                        f"{path / name}: names its owner, as files of format {OWNERS_FROM} and later do, in a "
                        f"checkpoint whose manifest says format {m['format']}: relabelled to an older format, "
                        f"whose checks are fewer{hint}"
                    )
        return Checkpoint(path, rnd, extra, files, m["format"])

    def _check_state_names(self, path: Path, rnd: int, files: dict[str, str], hint: str) -> None:
        """A checkpoint's State names the round it was saved after and the SHA-256 of each client
        file saved with it: a file copied in from another round's checkpoint (the manifest made to
        match) is not one of them."""
        where = path / "state.npz"
        found = read_owner(where)
        if found is None or named_owner(found) != owner(self.run_id):
            raise CheckpointError(
                f"{where}: does not name itself this run's State ({whose_text(found)}){hint}"
            )
        if found.get("round") != rnd:
            raise CheckpointError(
                f"{where}: the State after round {found.get('round')}, not after round {rnd} as its folder "
                f"says (copied in from another checkpoint){hint}"
            )
        listed = found.get("clients") if isinstance(found.get("clients"), dict) else {}
        clients = {n: d for n, d in files.items() if n.startswith("clients/")}
        odd = sorted(n for n in clients.keys() | listed.keys() if clients.get(n) != listed.get(n))
        if odd:
            raise CheckpointError(
                f"{path / odd[0]}: not the client file the State after round {rnd} was saved with (copied "
                f"in from another checkpoint, or edited){hint}"
            )

    def load_state(self, ckpt: Checkpoint, baton: Callable[[int, Any], Any] | None = None) -> Any:
        return read_blob(ckpt.path / "state.npz", baton, owner(self.run_id), named=ckpt.owners)

    def client_states(self, ckpt: Checkpoint) -> Iterator[tuple[int, Any]]:
        """Every client's saved state, in client order, read one file at a time."""
        for name in sorted(n for n in ckpt.files if n.startswith("clients/")):
            stem = name.removeprefix("clients/").removesuffix(".npz")
            if not stem.isdigit():
                raise CheckpointError(f"{ckpt.path / name}: not a client state file")
            yield (
                int(stem),
                read_blob(ckpt.path / name, owned_by=owner(self.run_id, int(stem)), named=ckpt.owners),
            )
