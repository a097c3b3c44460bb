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
   (`fedray.config.keys.MOVED_TO_DATA`) is hashed under that key where it is not its default, as
   the flat key was; the others under ``data``, left out where there are none.
4. A key added after results existed (`Role.as_before`) is left out at the value that means "as
   before", so every earlier run keeps its id.
5. The id is ``ALGORITHM-DATASET-sSEED-`` and the first 10 hex digits of the SHA-256 of what is
   left, as JSON with sorted keys.

A later rule would be version 2, beside this one, so that the runs version 1 named keep their ids.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedray.config.keys import (
    ADDED_LATER,
    BY_CONTENT,
    MOVED_TO_DATA,
    NOT_IN_RUN_ID,
    file_digest,
    init_model_file,
)
from fedray.config.sections import partition_file_for

if TYPE_CHECKING:
    from fedray.config.keys import Config

__all__ = ["RUN_ID_VERSION", "content_file", "run_id"]

RUN_ID_VERSION = 1


def run_id(cfg: Config, version: int = RUN_ID_VERSION) -> str:
    """The id of the run ``cfg`` resolves to, by rule ``version`` (module docstring)."""
    if version != 1:
        raise ValueError(f"run id version {version}: fedray knows version 1")
    d = cfg.to_dict()
    for key in NOT_IN_RUN_ID:
        d.pop(key)
    for key in BY_CONTENT:
        if (file := content_file(d, key)) is not None:
            d[key] = "sha256:" + file_digest(file)
    if cfg.plugins:
        from fedray.config.plugins import describe, digest

        d["plugins"] = [f"{describe(s).name}:sha256:{digest(s)}" for s in cfg.plugins]
    d.update(_hashed_data(d.pop("data")))
    for key, as_before in ADDED_LATER.items():
        if key in d and d[key] == as_before:
            d.pop(key)
    hashed = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]
    return f"{cfg.algorithm}-{cfg.dataset}-s{cfg.seed}-{hashed}"


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
