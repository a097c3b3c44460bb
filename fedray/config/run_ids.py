"""A run's id, through one versioned function (`run_id`): the same resolved config gives the same
id, on any machine, wherever its files lie, whatever fedray version computes it.

Version 1, the rule every run so far was named by (`RUN_ID_VERSION`), reads each key's roles
(fedray/config/roles.py) and no list of keys of its own:

1. Every key of the resolved config, but those not in the run id (`Role.in_run_id`: they cannot
   change a number).
2. A key that names a file by its path (`Role.by_content`) is the file's content instead, where it
   names one (`content_file`): a partition file (its ``{seed}`` filled in), the model ``init_model``
   starts from, the arrays of ``fedray.from_arrays``. Each plug-in is its module name and the hash
   of its source.
3. The dataset's own settings (``data``): one that was a flat key before it moved under ``data``
   (`fedray.config.sections.MOVED_TO_DATA`) is hashed under that key where it is not its default, as
   the flat key was; the others under ``data``, left out where there are none.
4. A key added after results existed (`Role.as_before`) is left out at the value that means "as
   before", so every earlier run keeps its id.
5. The id is ``ALGORITHM-DATASET-sSEED-`` and the first 10 hex digits of the SHA-256 of what is
   left, as JSON with sorted keys.

A later rule would be version 2, beside this one, so that the runs version 1 named keep their ids.

Config layer: a leaf below `fedray.config.keys` (it reads the roles a config's class declares, and
the data section's history); it also holds how a file named by a key is read, `file_digest`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedray.config.roles import Role, roles_of
from fedray.config.sections import MOVED_TO_DATA, partition_file_for

__all__ = ["RUN_ID_VERSION", "content_file", "file_digest", "init_model_file", "run_id"]

RUN_ID_VERSION = 1


def run_id(cfg: Any, version: int = RUN_ID_VERSION) -> str:
    """The id of the run ``cfg`` (a `fedray.config.Config`) resolves to, by rule ``version`` (module
    docstring)."""
    if version != 1:
        raise ValueError(f"run id version {version}: fedray knows version 1")
    roles = _roles(type(cfg))
    d = cfg.to_dict()
    for key, role in roles.items():
        if not role.in_run_id:
            d.pop(key)
        elif role.by_content and (file := content_file(d, key)) is not None:
            d[key] = "sha256:" + file_digest(file)
    if cfg.plugins:
        from fedray.config.plugins import describe, digest

        d["plugins"] = [f"{describe(s).name}:sha256:{digest(s)}" for s in cfg.plugins]
    d.update(_hashed_data(d.pop("data")))
    for key, role in roles.items():
        if role.added_later and key in d and d[key] == role.as_before:
            d.pop(key)
    hashed = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]
    return f"{cfg.algorithm}-{cfg.dataset}-s{cfg.seed}-{hashed}"


@functools.cache
def _roles(cls: type) -> dict[str, Role]:
    return roles_of(cls)


def content_file(config: Mapping[str, Any], key: str) -> Path | None:
    """The file a `Role.by_content` key of a config (a mapping of its keys) names, whose content
    stands for it; None where it names none (left empty; ``data_root`` of any dataset but
    ``arrays``, a folder named by its path)."""
    value = config.get(key)
    if not value:
        return None
    if key == "partition_file":
        return Path(partition_file_for(value, config.get("seed", 0)))
    if key == "init_model":
        return init_model_file(value)
    if key == "data_root":
        return Path(value) if config.get("dataset") == "arrays" else None
    raise KeyError(f"config key {key!r} names a file, but run ids version 1 do not say how to read it")


def _hashed_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """A config's data settings as its run id hashes them (rule 3 of the module docstring)."""
    old = {new: (flat, default) for flat, (new, default) in MOVED_TO_DATA.items()}
    out: dict[str, Any] = {}
    rest = {k: v for k, v in data.items() if k not in old}
    for name, value in data.items():
        if name in old and value != old[name][1]:
            out[old[name][0]] = value
    if rest:
        out["data"] = rest
    return out


def init_model_file(path: str | Path) -> Path:
    """The model file ``init_model`` names: the file itself, or a models folder's ``global.npz``."""
    p = Path(path)
    return p / "global.npz" if p.is_dir() else p


_DIGESTS: dict[tuple, str] = {}  # in this process: a file as it stands (inode, size, times) -> its SHA-256


def file_digest(path: str | Path) -> str:
    """The SHA-256 of a file's content (what names a partition file in a run id, so the same clients
    give the same run wherever the file lies; what names the files a run's data was read from),
    computed once a process for the file as it stands: a write changes its ctime, which no tool
    sets back."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]
