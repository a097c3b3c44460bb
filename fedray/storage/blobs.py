"""One object as one file, the format of checkpoints and spilled client states: a zip (what
``numpy.load`` reads) of ``tree.json``, the object's structure as plain JSON, and ``0.npy``,
``1.npy``, ... its arrays, written and read with ``allow_pickle=False``. Nothing is unpickled: a
tampered file can only fail to load, with an error naming it. The objects are what
docs/architecture.md#client-functions allows in State: numpy arrays and scalars, Python scalars,
lists, tuples, dicts and dataclasses defined in fedray or a run's plug-ins (the only classes a file
may name: fedray's by a stable tag, `checkpoint_tag`). A file says whose it is (`owner`), checked
when it is read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedray import MOVED_MODULES
from fedray.storage.files import writing


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
        was = TAGS.get(tag, cls)
        if (was.__module__, was.__qualname__) != (cls.__module__, cls.__qualname__):  # not its module again
            raise ValueError(f"checkpoint tag {tag!r} names {was.__module__}.{was.__qualname__} already")
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


def whose_text(found: Any) -> str:
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
            if owned_by is not None and found is not None and named_owner(found) != named_owner(owned_by):
                raise CheckpointError(
                    f"{path}: holds {whose_text(found)}, not {whose_text(owned_by)} (copied in from elsewhere, "
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


def named_owner(found: Any) -> Any:
    return {k: found.get(k) for k in WHOSE} if isinstance(found, dict) else found


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class StateFile:
    """A client's state that is already a file in the checkpoints' format (spilled to disk,
    `fedray.federation.client_states`): a checkpoint takes the file itself, hard-linked where it is on the same
    file system (nothing copied: the spilled file is never written again, a new spill is a new file)
    and copied otherwise, instead of reading the state and writing it again."""

    path: str
    digest: str = ""  # its SHA-256 as written: the file taken into a checkpoint must still have it
