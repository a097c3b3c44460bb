"""Checkpoints (docs/failures-and-checkpoints.md#failures-checkpoints-and-models): a run's algorithm `State` and every client's persistent state, between rounds.

Layout, under ``DIR/checkpoints/RUN_ID/``::

    round-000020/            one checkpoint: the state after 20 completed rounds
      manifest.json          run id, round, versions, what the round loop needs to go on (plain JSON),
                             and the SHA-256 of every file below
      state.npz              the algorithm's State (and the values behind its Batons)
      clients/000007.npz     client 7's persistent state (clients without state have no file)

A checkpoint is written under a dot-name and renamed into place once every file is on disk, so a
killed job leaves either the whole checkpoint or none of it; the last ``keep`` are kept.

Format: each ``.npz`` is a zip (what ``numpy.load`` reads) of ``tree.json``, the object's structure
as plain JSON, and ``0.npy``, ``1.npy``, ... its arrays, written and read with
``allow_pickle=False``. Nothing is unpickled: a tampered file can only fail to load, with an error
naming it. The objects are what docs/architecture.md#client-functions allows in State: numpy arrays and scalars, Python scalars,
lists, tuples, dicts and dataclasses defined in fedray (the only classes a file may name).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import os
import re
import shutil
import stat
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedray import MOVED_MODULES
from fedray.storage.files import fsync_dir, refuse_link, remove_tree, write_text_synced, writing


@dataclass(frozen=True)
class Baton:
    """A value a client left in the federation instead of sending it back (FedCat's model copies
    between the rounds of a cycle). Plain data, so it can sit in an algorithm's State; the value
    stays where it was made (under Ray: in the object store of the client actor's node) until a
    later `relay` hop or `fetch` uses it, once.

    Algorithms meet it through the Federation protocol (`fedray.federation.Baton`); it is defined
    here, beside the format that writes a Baton with the value behind it (`encode`)."""

    key: int


FORMAT = 1  # of the .npz files (tree.json)
# of manifest.json: 3's files all name their owner, and its State names its round and the client
# files it was saved with; 2 has its own digest, its files may name no owner (written before they
# did); 1 (earlier fedray) has no digest. All three are read, each held to what its format promises.
MANIFEST_FORMAT = 3
MANIFEST_FORMATS = (1, 2, 3)  # those read
OWNERS_FROM = 3  # the first format whose every file names its owner
_SAFE_MODULES = "fedray."  # a file may only name dataclasses defined under this package (or a run's plug-ins)
_CHUNK = 1 << 22


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read; the message names the file and what is wrong."""


# ------------------------------------------------------------------------------------------------
# Plain data <-> JSON tree + arrays
# ------------------------------------------------------------------------------------------------


def encode(obj: Any, arrays: list[np.ndarray], where: str, baton: Callable[[Any], Any] | None = None) -> Any:
    """``obj`` as a JSON-able tree; its arrays are appended to ``arrays`` and referred to by index.

    ``baton(b)`` gives the value behind a `fedray.federation.Baton` (stored in its place); ``where``
    names the object in errors (``state.models[2]``).
    """

    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int) and not isinstance(obj, np.generic):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    if isinstance(obj, (np.ndarray, np.generic)):
        arr = np.asarray(obj)
        if arr.dtype.hasobject:
            raise CheckpointError(
                f"{where}: an array of Python objects cannot be checkpointed (dtype object)"
            )
        arrays.append(arr)
        return {"__array__" if isinstance(obj, np.ndarray) else "__scalar__": len(arrays) - 1}
    if isinstance(obj, list):
        return [encode(v, arrays, f"{where}[{i}]", baton) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, arrays, f"{where}[{i}]", baton) for i, v in enumerate(obj)]}
    if isinstance(obj, dict):
        return {
            "__dict__": [
                [encode(k, arrays, f"{where} key", baton), encode(v, arrays, f"{where}[{k!r}]", baton)]
                for k, v in obj.items()
            ]
        }
    if isinstance(obj, Baton):
        if baton is None:
            raise CheckpointError(f"{where}: a Baton, but no federation to read its value from")
        return {"__baton__": obj.key, "value": encode(baton(obj), arrays, f"{where} (its value)", baton)}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        if cls is StateFile:
            raise CheckpointError(f"{where}: a reference to a file (StateFile) is not state")
        if not _safe(cls.__module__):
            raise CheckpointError(
                f"{where}: {cls.__module__}.{cls.__qualname__} is not a dataclass of fedray or of the run's plug-ins"
            )
        fields = {
            f.name: encode(getattr(obj, f.name), arrays, f"{where}.{f.name}", baton)
            for f in dataclasses.fields(obj)
        }
        tag = cls.__dict__.get("_checkpoint_tag")  # its own, not a tagged base class's
        name = f"@{tag}" if tag else f"{cls.__module__}:{cls.__qualname__}"
        return {"__dataclass__": name, "fields": fields}
    raise CheckpointError(
        f"{where}: a {type(obj).__module__}.{type(obj).__qualname__} cannot be checkpointed (State and "
        "client state are plain data: numpy arrays, scalars, lists, dicts, dataclasses; docs/architecture.md#client-functions)"
    )


TAGS: dict[str, type] = {}  # a stable tag -> the dataclass checkpoints name by it
_BY_PATH: dict[str, str] = {}  # "module:QualName" a checkpoint written before tags named it by -> its tag


def checkpoint_tag(tag: str, *paths: str) -> Callable[[type], type]:
    """Name a dataclass in checkpoints by ``tag`` rather than by its module path, so that it may move
    between modules and every checkpoint naming it still reads. ``paths``: the ``module:QualName``
    names checkpoints written before it had its tag used (where it was then); its path now is one of
    them too. Moving a tagged class: add the path it leaves to ``paths``. fedray's checkpointed
    classes carry tags; a plug-in's class is named by its module path (its module's name)."""

    def mark(cls: type) -> type:
        if TAGS.get(tag, cls) is not cls:
            raise ValueError(f"checkpoint tag {tag!r} names {TAGS[tag].__qualname__} already")
        TAGS[tag] = cls
        cls._checkpoint_tag = tag  # type: ignore[attr-defined]
        for path in (f"{cls.__module__}:{cls.__qualname__}", *paths):
            _BY_PATH[path] = tag
        return cls

    return mark


def _safe(module: str) -> bool:
    """A module whose dataclasses a checkpoint may name: fedray's, or a plug-in's the run imported."""
    from fedray.config.plugins import is_plugin_module

    return module.startswith(_SAFE_MODULES) or is_plugin_module(module)


def _dataclass(name: Any) -> type:
    """The fedray dataclass a file names by its tag (``@fedavg.State``, `checkpoint_tag`) or as
    ``module:QualName``; anything else is refused."""
    if isinstance(name, str) and name.startswith("@"):
        if name[1:] not in TAGS:
            raise ValueError(f"class tag {name!r} names no dataclass of fedray's")
        return TAGS[name[1:]]
    if isinstance(name, str) and name in _BY_PATH:  # a tagged class, by the path it had when written
        return TAGS[_BY_PATH[name]]
    if not isinstance(name, str) or ":" not in name:
        raise ValueError(f"bad class name {name!r}")
    module, qualname = name.split(":", 1)
    if not _safe(module):
        raise ValueError(f"class {name!r} is not defined in fedray or in the run's plug-ins")
    where = MOVED_MODULES.get(module, module)  # a module that moved since the file was written
    obj: Any = importlib.import_module(where)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    # a dataclass that fedray or a plug-in defines (not one of another package reached through an
    # attribute: a module fedray imports), and not a reference to a file
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj) and _safe(obj.__module__)):
        raise ValueError(f"{name!r} is not a dataclass defined in fedray or the run's plug-ins")
    if obj is StateFile:
        raise ValueError("a reference to a file (StateFile) is never read from a checkpoint")
    return obj


def decode(tree: Any, arrays: list[np.ndarray], baton: Callable[[int, Any], Any] | None = None) -> Any:
    """The inverse of `encode`. ``baton(key, value)`` re-creates a Baton in the federation."""
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return tree
    if isinstance(tree, list):
        return [decode(v, arrays, baton) for v in tree]
    if not isinstance(tree, dict) or len(tree) not in (1, 2):
        raise ValueError(f"unexpected node {str(tree)[:80]!r}")
    if "__array__" in tree:
        return arrays[_index(tree["__array__"], arrays)]
    if "__scalar__" in tree:
        return arrays[_index(tree["__scalar__"], arrays)][()]
    if "__float__" in tree:
        if tree["__float__"] not in ("nan", "inf", "-inf"):
            raise ValueError(f"bad float {tree['__float__']!r}")
        return float(tree["__float__"])
    if "__tuple__" in tree:
        return tuple(decode(v, arrays, baton) for v in tree["__tuple__"])
    if "__dict__" in tree:
        return {_hashable(decode(k, arrays, baton)): decode(v, arrays, baton) for k, v in tree["__dict__"]}
    if "__baton__" in tree:
        if baton is None:
            raise ValueError("a Baton, but no federation to give its value to")
        return baton(int(tree["__baton__"]), decode(tree["value"], arrays, baton))
    if "__dataclass__" in tree:
        cls = _dataclass(tree["__dataclass__"])
        fields = tree.get("fields")
        renames = getattr(cls, "checkpoint_renames", {})  # a field's old name -> its name now
        if isinstance(fields, dict) and renames:
            fields = {renames.get(k, k): v for k, v in fields.items()}
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        # a field added since the file was written takes its default (a file of an older fedray)
        needed = {
            f.name
            for f in dataclasses.fields(cls)
            if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        if not isinstance(fields, dict) or not needed <= set(fields) <= names:
            raise ValueError(
                f"{cls.__qualname__} has fields {sorted(names)}, the file {sorted(fields or {})} "
                "(written by another fedray version?)"
            )
        return cls(**{k: decode(v, arrays, baton) for k, v in fields.items()})
    raise ValueError(f"unexpected node {str(tree)[:80]!r}")


def _index(i: Any, arrays: list[np.ndarray]) -> int:
    if not isinstance(i, int) or not 0 <= i < len(arrays):
        raise ValueError(f"array index {i!r} out of range")
    return i


def _hashable(k: Any) -> Any:
    if isinstance(k, np.ndarray):
        raise ValueError("an array as a dict key")
    return k


# ------------------------------------------------------------------------------------------------
# One object <-> one .npz file
# ------------------------------------------------------------------------------------------------


def owner(run_id: str, client: int | None = None, **more: Any) -> dict[str, Any]:
    """Whose a state file is: a run's State (``client`` None) or one client's state in it. Written
    into the file (`write_blob`) and checked when it is read (`read_blob`), so a file copied in
    from another run or swapped with another client's is refused, whatever the manifest says.
    ``more``: what else the file says of itself (a checkpoint's files: the round they were saved
    after; its State: the client files saved with it, `Checkpoints.save`)."""
    return {"run_id": run_id, "client": client, **more}


WHOSE = ("run_id", "client")  # what names a file's owner; the rest of `owner` says more of it


def _whose(found: Any) -> str:
    if not isinstance(found, dict):
        return repr(found)
    who = "the State" if found.get("client") is None else f"client {found.get('client')}'s state"
    return f"{who} of run {found.get('run_id')}"


def read_owner(path: Path) -> dict[str, Any] | None:
    """What a file `write_blob` wrote says of its owner (`owner`), its arrays not read; None where
    it names none (written before files did)."""
    try:
        with zipfile.ZipFile(path) as zf:
            head = json.loads(zf.read("tree.json"))
    except Exception as e:  # noqa: BLE001 - whatever is wrong with the file, name it
        raise CheckpointError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    found = head.get("owner") if isinstance(head, dict) else None
    return found if isinstance(found, dict) else None


def write_blob(
    path: Path,
    obj: Any,
    where: str,
    baton: Callable[[Any], Any] | None = None,
    sync: bool = True,
    owned_by: dict[str, Any] | None = None,
) -> str:
    """Write ``obj`` to ``path``, saying whose it is (``owned_by``: `owner`); fsynced, returns the
    file's SHA-256. ``sync=False``: a scratch file that need not survive the machine (spilled
    client state), not fsynced (its SHA-256 is still returned: it is checked when read back)."""
    arrays: list[np.ndarray] = []
    tree = encode(obj, arrays, where, baton)
    head = {"format": FORMAT, "tree": tree}
    if owned_by is not None:
        head["owner"] = owned_by
    with writing(path), open(path, "wb") as f:
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            zf.writestr("tree.json", json.dumps(head, allow_nan=False))
            for i, arr in enumerate(arrays):
                with zf.open(f"{i}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(
                        member, arr if arr.flags.c_contiguous else arr.copy(order="C"), allow_pickle=False
                    )
        if sync:
            f.flush()
            os.fsync(f.fileno())
    return sha256(path)


def read_blob(
    path: Path,
    baton: Callable[[int, Any], Any] | None = None,
    owned_by: dict[str, Any] | None = None,
    digest: str | None = None,
    named: bool = False,
) -> Any:
    """What `write_blob` wrote to ``path``. ``owned_by``: whose it must be (`owner`: a file that
    names another is refused; one that names none, written before files named theirs, is read
    unless ``named``); ``digest``: the SHA-256 it must have (a spilled file, checked against what
    was written)."""
    if digest is not None and sha256(path) != digest:
        raise CheckpointError(
            f"{path}: changed since fedray wrote it (its SHA-256 is not the one written): not read"
        )
    try:
        with zipfile.ZipFile(path) as zf:
            head = json.loads(zf.read("tree.json"))
            if not isinstance(head, dict) or head.get("format") != FORMAT:
                raise ValueError(f"unknown format {head.get('format') if isinstance(head, dict) else head!r}")
            found = head.get("owner")
            if owned_by is not None and found is None and named:
                raise CheckpointError(
                    f"{path}: names no owner, which every file of its checkpoint's format does (copied in "
                    "from an earlier fedray's checkpoint, or edited): not read"
                )
            if owned_by is not None and found is not None and _named(found) != _named(owned_by):
                raise CheckpointError(
                    f"{path}: holds {_whose(found)}, not {_whose(owned_by)} (copied in from elsewhere, "
                    "or swapped with another file): not read"
                )
            names = [n for n in zf.namelist() if n != "tree.json"]
            if sorted(names) != sorted(f"{i}.npy" for i in range(len(names))):
                raise ValueError(f"unexpected members {sorted(names)[:5]}")
            arrays = []
            for i in range(len(names)):
                with zf.open(f"{i}.npy") as member:
                    arrays.append(np.lib.format.read_array(member, allow_pickle=False))
        return decode(head["tree"], arrays, baton)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever is wrong with the file, name it
        raise CheckpointError(f"{path}: unreadable ({type(e).__name__}: {e})") from None


def _named(found: Any) -> Any:
    return {k: found.get(k) for k in WHOSE} if isinstance(found, dict) else found


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------
# A run's checkpoints
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StateFile:
    """A client's state that is already a file in the checkpoints' format (spilled to disk,
    `fedray.federation.client_states`): a checkpoint takes the file itself, hard-linked where it is on the same
    file system (nothing copied: the spilled file is never written again, a new spill is a new file)
    and copied otherwise, instead of reading the state and writing it again."""

    path: str
    digest: str = ""  # its SHA-256 as written: the file taken into a checkpoint must still have it


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

    def latest(self) -> Checkpoint | None:
        """The newest complete checkpoint, its files verified; None if there is none.

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
        return Checkpoint(path, rnd, extra, files, m["format"])

    def _check_state_names(self, path: Path, rnd: int, files: dict[str, str], hint: str) -> None:
        """A checkpoint's State names the round it was saved after and the SHA-256 of each client
        file saved with it: a file copied in from another round's checkpoint (the manifest made to
        match) is not one of them."""
        where = path / "state.npz"
        found = read_owner(where)
        if found is None or _named(found) != owner(self.run_id):
            raise CheckpointError(f"{where}: does not name itself this run's State ({_whose(found)}){hint}")
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
