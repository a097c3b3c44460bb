"""What data a run read, named by its content, so that results stay tied to their data.

A dataset read from files (LEAF's JSON, a saved `hf` dataset, client files, Fashion-MNIST's IDX
files, torchvision's folders, `from_arrays`' file) names those files (`DatasetKind.files`); a run
records their SHA-256s (`identity`) in its row in ``runs/`` and in every checkpoint. A run then goes
on from a checkpoint, or counts as finished, only on the same bytes: `changes` names what differs,
and the run is refused before anything of it starts (`DataChanged`).

Its limits: the content of the files a dataset names, nothing else. A dataset made from the config
(digits, synthetic, the generated ones) names none: its recipe is the config, already in the run id
(so are a partition file's and an init model's digests). A plug-in dataset that reads files and
gives no ``files`` is not checked. Hashing reads every byte once a process (about 1 s a GB; a file
unchanged since, by its inode, size and times, is not read again).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedray.config.coercion import ConfigError
from fedray.config.keys import file_digest
from fedray.data.datasets import DATASETS, DatasetMissing

if TYPE_CHECKING:
    from fedray.config.sections import DataSection

# Up to this many files, each one's SHA-256 is recorded too, so a change names the file; beyond it
# (client files of a large federation) only the count and the digest over all of them.
LISTED_FILES = 256


class DataChanged(ConfigError):
    """A run would go on from a checkpoint, or count as finished, on data other than it read."""


def identity(section: DataSection) -> dict[str, Any] | None:
    """The run's data as it stands: ``{"root", "files", "sha256"}`` (the folder, how many files,
    the SHA-256 over their names and contents) and ``"digests"`` (name -> SHA-256, up to
    `LISTED_FILES` files); None where the dataset names no files, or they are not there now."""
    kind = DATASETS.get(section.dataset)
    if kind is None or kind.files is None:
        return None
    try:
        root, files = kind.files(section)
    except (DatasetMissing, OSError):
        return None
    digests = {_name(p, root): file_digest(p) for p in files}
    h = hashlib.sha256()
    for name in sorted(digests):
        h.update(f"{name}\0{digests[name]}\0".encode())
    found: dict[str, Any] = {"root": str(root), "files": len(digests), "sha256": h.hexdigest()}
    if len(digests) <= LISTED_FILES:
        found["digests"] = dict(sorted(digests.items()))
    return found


def _name(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def changes(recorded: Any, now: dict[str, Any] | None) -> str | None:
    """What differs between the data a run recorded and ``now`` (`identity`), in words; None where
    they are the same, or where there is nothing to compare: recorded before fedray recorded data,
    by a dataset that names no files, or files not there now (reading them fails, naming them)."""
    if not isinstance(recorded, dict) or "sha256" not in recorded or now is None:
        return None
    if recorded["sha256"] == now["sha256"]:
        return None
    was, got = recorded.get("digests"), now.get("digests")
    if isinstance(was, dict) and isinstance(got, dict):
        said = [f"{n} changed" for n in sorted(was.keys() & got.keys()) if was[n] != got[n]]
        said += [f"{n} is gone" for n in sorted(was.keys() - got.keys())]
        said += [f"{n} is new" for n in sorted(got.keys() - was.keys())]
        more = f" (and {len(said) - 3} more)" if len(said) > 3 else ""
        return f"under {now['root']}: {', '.join(said[:3])}{more}"
    return (
        f"the {now['files']} data files under {now['root']} are not the {recorded.get('files', '?')} it read "
        f"(SHA-256 {now['sha256'][:12]}..., it read {recorded['sha256'][:12]}...)"
    )
