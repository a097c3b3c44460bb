"""LEAF's natural federated data sets, whose clients are their users: FEMNIST (handwritten
characters by writer, 62 classes) and Shakespeare (lines of the plays by speaking role, the next
character to predict), read from the JSON LEAF's scripts write (Caldas et al., "LEAF: A Benchmark
for Federated Settings", 2018; github.com/TalwalkarLab/leaf).

``data_root`` is the data set's folder as LEAF's ``preprocess.sh`` leaves it (``leaf/data/femnist/data``):

- ``all_data/*.json`` (every user's samples): fedray keeps the users with at least
  ``leaf_min_samples`` samples (LEAF's ``-k``), then a seeded ``leaf_user_fraction`` of them
  (LEAF's ``--sf``), then splits each user's samples by sample, as LEAF's ``split_data.py`` does:
  a user needs two samples, keeps ``max(1, int(leaf_train_fraction * n))`` for training (one of
  two), the rest for its test split, drawn from the run's seed;
- or ``train/*.json`` and ``test/*.json``, after LEAF's own split (``-t sample``): each user's
  training and test samples as LEAF drew them; the three keys above are then LEAF's, and stay at
  their defaults.

Each JSON file holds ``users`` (names), ``num_samples`` and ``user_data`` (``{user: {"x": [...],
"y": [...]}}``). A FEMNIST sample is 784 grey levels in [0, 1] (a 28x28 image) and its class; a
Shakespeare sample is 80 characters and the character that follows, from LEAF's 80 symbols
(`SHAKESPEARE_VOCAB`), stored as their indices. The users are the run's clients in the files'
order; the global test set is every user's test samples. What is read is kept beside the JSON
(``.fedray-leaf-*.npz``, named by the JSON files' sizes and times), so a later run reads arrays.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedray.config import seeding
from fedray.config.coercion import ConfigError
from fedray.data.datasets import ArrayDataset, Dataset, DatasetInfo, DatasetMissing, DataSpec
from fedray.data.federated import FederatedData, own_splits

if TYPE_CHECKING:
    from fedray.config.keys import Config

# LEAF's symbols of the plays (its models/utils/language_utils.py): a character is its index here
SHAKESPEARE_VOCAB = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
SEQ_LEN = 80  # characters a Shakespeare sample gives the model
SYMBOL_INDEX = np.full(256, -1, dtype=np.int16)  # a character code (all are ASCII) -> its index, -1: none
for _i, _c in enumerate(SHAKESPEARE_VOCAB):
    SYMBOL_INDEX[ord(_c)] = _i

KEYS = ("leaf_user_fraction", "leaf_min_samples", "leaf_train_fraction")


class LeafError(ConfigError):
    """A LEAF folder or file that is not what LEAF's scripts write; the message names it."""


@dataclass(frozen=True)
class Kind:
    """What tells FEMNIST and Shakespeare apart."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    scale: float  # stored value * scale = the model's input (FEMNIST's grey levels as uint8)


FEMNIST = Kind("femnist", (1, 28, 28), 62, 1 / 255)
SHAKESPEARE = Kind("shakespeare", (SEQ_LEN,), len(SHAKESPEARE_VOCAB), 1.0)


@dataclass
class Users:
    """A LEAF folder read: every user's samples one user after another (``train``), and where the
    folder was split already, each user's test samples too (``test``)."""

    names: list[str]
    x: np.ndarray
    y: np.ndarray
    offsets: np.ndarray  # user i's samples are rows offsets[i]:offsets[i + 1]
    test_x: np.ndarray | None = None
    test_y: np.ndarray | None = None
    test_offsets: np.ndarray | None = None

    @property
    def split(self) -> bool:
        return self.test_offsets is not None

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)


def layout(root: Path, name: str = "femnist") -> tuple[list[Path], list[Path]]:
    """The folder's JSON files: (all_data's, []) or (train's, test's); `DatasetMissing` saying what
    to put there (LEAF's data set ``name``) where it holds neither."""
    split = [sorted((root / s).glob("*.json")) for s in ("train", "test")]
    if split[0] and split[1]:
        return split[0], split[1]
    whole = sorted((root / "all_data").glob("*.json"))
    if whole:
        return whole, []
    raise DatasetMissing(
        f"no LEAF data in {str(root)!r}: data_root is the data set's folder as LEAF's preprocess.sh leaves it, "
        "holding all_data/*.json, or train/*.json and test/*.json after LEAF's split (git clone "
        f"https://github.com/TalwalkarLab/leaf; cd leaf/data/{name}; ./preprocess.sh -s niid --sf 1.0 -k 0 "
        f"-t sample; then data_root: leaf/data/{name}/data)"
    )


def _encode(kind: Kind, path: Path, user: str, x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """One user's samples as arrays: FEMNIST's images as uint8 grey levels, Shakespeare's text as
    symbol indices."""
    where = f"{path}: user {user!r}"
    if not isinstance(x, list) or not isinstance(y, list) or len(x) != len(y):
        raise LeafError(f"{where}: 'x' and 'y' must be lists of one length")
    if kind is FEMNIST:
        try:
            pixels = np.asarray(x, dtype=np.float64).reshape(len(x), *kind.input_shape)
        except (TypeError, ValueError):
            raise LeafError(f"{where}: a FEMNIST sample is 784 grey levels in [0, 1]") from None
        if pixels.size and (pixels.min() < 0 or pixels.max() > 1):
            raise LeafError(f"{where}: a FEMNIST sample is 784 grey levels in [0, 1]")
        labels = np.asarray(y, dtype=np.int64)
        if labels.size and (labels.min() < 0 or labels.max() >= kind.num_classes):
            raise LeafError(f"{where}: FEMNIST's classes are 0..61, got {labels.min()}..{labels.max()}")
        return np.rint(pixels * 255).astype(np.uint8), labels
    if not all(isinstance(s, str) and len(s) == SEQ_LEN for s in x) or not all(
        isinstance(c, str) and len(c) == 1 for c in y
    ):
        raise LeafError(f"{where}: a Shakespeare sample is {SEQ_LEN} characters and the one that follows")
    text = "".join(x) + "".join(y)
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    known = codes < len(SYMBOL_INDEX)
    index = np.where(known, SYMBOL_INDEX[np.minimum(codes, len(SYMBOL_INDEX) - 1)], -1)
    if (index < 0).any():
        bad = text[int(np.flatnonzero(index < 0)[0])]
        raise LeafError(f"{where}: character {bad!r} is not one of LEAF's {len(SHAKESPEARE_VOCAB)} symbols")
    chars = index.astype(np.uint8)
    n = len(x)
    return chars[: n * SEQ_LEN].reshape(n, SEQ_LEN), chars[n * SEQ_LEN :].astype(np.int64)


def _read_files(kind: Kind, files: list[Path]) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    names, xs, ys = [], [], []
    for path in files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise LeafError(f"{path}: not LEAF JSON ({type(e).__name__}: {e})") from None
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("users"), list)
            or not isinstance(data.get("user_data"), dict)
        ):
            raise LeafError(f"{path}: a LEAF file holds 'users' (a list) and 'user_data' (a mapping)")
        for user in data["users"]:
            samples = data["user_data"].get(user)
            if not isinstance(samples, dict):
                raise LeafError(f"{path}: user {user!r} is in 'users' but not in 'user_data'")
            x, y = _encode(kind, path, str(user), samples.get("x"), samples.get("y"))
            names.append(str(user))
            xs.append(x)
            ys.append(y)
    return names, xs, ys


def _stacked(
    kind: Kind, xs: list[np.ndarray], ys: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum([len(y) for y in ys])]).astype(np.int64)
    dtype = np.uint8
    x = np.concatenate(xs) if xs else np.zeros((0, *kind.input_shape), dtype)
    y = np.concatenate(ys) if ys else np.zeros(0, np.int64)
    return x, y, offsets


def _stamp(files: list[Path]) -> str:
    """What names the JSON files as they are: their names, sizes and modification times."""
    h = hashlib.sha256()
    for p in files:
        st = p.stat()
        h.update(f"{p.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


_READ: dict[tuple[str, str], Users] = {}  # in this process: (folder, stamp) -> its users


def read_users(kind: Kind, root: str | Path) -> Users:
    """A LEAF folder's users (`layout`), from its arrays kept beside the JSON where they are
    current, else read from the JSON and kept (where the folder can be written)."""
    root = Path(root)
    train_files, test_files = layout(root, kind.name)
    stamp = _stamp([*train_files, *test_files])
    key = (str(root.resolve()), stamp)
    if key in _READ:
        return _READ[key]
    kept = root / f".fedray-leaf-{kind.name}-{stamp}.npz"
    if kept.is_file():
        with np.load(kept, allow_pickle=False) as z:
            users = Users(
                [str(n) for n in z["names"]],
                z["x"],
                z["y"],
                z["offsets"],
                *((z["test_x"], z["test_y"], z["test_offsets"]) if "test_x" in z.files else ()),
            )
    else:
        names, xs, ys = _read_files(kind, train_files)
        x, y, offsets = _stacked(kind, xs, ys)
        users = Users(names, x, y, offsets)
        if test_files:
            test_names, txs, tys = _read_files(kind, test_files)
            if test_names != names:
                missing = sorted(set(names) ^ set(test_names))[:5]
                raise LeafError(
                    f"{root}: train/ and test/ name other users (e.g. {missing}): not LEAF's split by sample"
                )
            users.test_x, users.test_y, users.test_offsets = _stacked(kind, txs, tys)
        _keep(users, kept)
    _READ[key] = users
    return users


def _keep(users: Users, path: Path) -> None:
    """Write the arrays read beside the JSON (aside, then renamed); a folder that cannot be
    written is read from its JSON every time."""
    arrays = {"names": np.asarray(users.names), "x": users.x, "y": users.y, "offsets": users.offsets}
    if users.split:
        arrays |= {"test_x": users.test_x, "test_y": users.test_y, "test_offsets": users.test_offsets}
    try:
        fd, tmp = tempfile.mkstemp(prefix=".fedray-leaf-", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except OSError:
        return


def chosen(cfg: Config, users: Users) -> tuple[np.ndarray, dict[int, tuple[np.ndarray, np.ndarray]]]:
    """The users the run's clients are (indices into ``users``, in order) and, where the folder is
    not split already, each one's training and test rows (LEAF's split by sample, seeded)."""
    sizes = users.sizes() if not users.split else users.sizes() + np.diff(users.test_offsets)
    keep = np.flatnonzero(sizes >= max(cfg.leaf_min_samples, 0 if users.split else 2))
    if cfg.leaf_user_fraction < 1:
        n = max(1, int(cfg.leaf_user_fraction * len(keep)))
        keep = np.sort(seeding.rng(cfg.seed, "leaf_users").choice(keep, size=n, replace=False))
    rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    if not users.split:
        for i in keep:
            lo, n = int(users.offsets[i]), int(sizes[i])
            n_train = 1 if n == 2 else max(1, int(cfg.leaf_train_fraction * n))
            order = seeding.rng(cfg.seed, "leaf_split", int(i)).permutation(n)
            rows[int(i)] = (np.sort(order[:n_train]) + lo, np.sort(order[n_train:]) + lo)
    return keep, rows


def leaf_data(kind: Kind, cfg: Config) -> FederatedData:
    """The run's clients: the chosen users, each its training and test samples."""
    users = read_users(kind, cfg.resolved_data_root())
    keep, rows = chosen(cfg, users)
    parts = []
    for i in keep:
        if users.split:
            tr = slice(users.offsets[i], users.offsets[i + 1])
            te = slice(users.test_offsets[i], users.test_offsets[i + 1])
            parts.append(
                (ArrayDataset(users.x[tr], users.y[tr]), ArrayDataset(users.test_x[te], users.test_y[te]))
            )
        else:
            train_rows, test_rows = rows[int(i)]
            parts.append(
                (
                    ArrayDataset(users.x[train_rows], users.y[train_rows]),
                    ArrayDataset(users.x[test_rows], users.y[test_rows]),
                )
            )
    train, test, clients = own_splits(parts)
    spec = DataSpec(kind.input_shape, kind.num_classes, kind.scale)
    return FederatedData(Dataset(kind.name, train, test, spec), clients, None)


def leaf_info(kind: Kind, cfg: Config) -> DatasetInfo:
    return DatasetInfo(kind.input_shape, kind.num_classes, None)


def check_leaf(kind: Kind, cfg: Config, info: DatasetInfo) -> None:
    """Before anything runs: the folder is LEAF's, its users are the run's clients (num_clients is
    their number), and on a folder LEAF split already the user and split keys are LEAF's own."""
    root = Path(cfg.resolved_data_root())
    try:
        users = read_users(kind, root)
    except DatasetMissing as e:
        raise ConfigError(f"config key 'data_root': {e}") from None
    if users.split:
        for key, default in (
            ("leaf_user_fraction", 1.0),
            ("leaf_min_samples", 0),
            ("leaf_train_fraction", 0.9),
        ):
            if getattr(cfg, key) != default:
                raise ConfigError(
                    f"config key '{key}': {root} is split by LEAF already (train/ and test/): its users and "
                    "their split are LEAF's (its preprocess.sh --sf, -k, --tf); leave it at its default, or "
                    "point data_root at a folder with all_data/"
                )
    keep, _ = chosen(cfg, users)
    if len(keep) != cfg.num_clients:
        raise ConfigError(
            f"config key 'num_clients': the {kind.name} users of {root} kept by leaf_min_samples "
            f"{cfg.leaf_min_samples} and leaf_user_fraction {cfg.leaf_user_fraction:g} are {len(keep)}; "
            f"set num_clients: {len(keep)}"
        )
    if cfg.shift != "none":
        raise ConfigError(
            f"config key 'shift': {kind.name}'s users are its clients; a shift preset does not apply"
        )


def leaf_available(cfg: Config) -> None:
    layout(Path(cfg.resolved_data_root()), cfg.dataset)


def _register() -> None:
    from fedray.data.datasets import DatasetKind, register_dataset

    for kind in (FEMNIST, SHAKESPEARE):
        register_dataset(
            DatasetKind(
                kind.name,
                lambda cfg, kind=kind: leaf_data(kind, cfg).dataset,
                lambda cfg, kind=kind: leaf_info(kind, cfg),
                keys=KEYS,
                available=leaf_available,
                check_info=lambda cfg, info, kind=kind: check_leaf(kind, cfg, info),
                federate=lambda cfg, kind=kind: leaf_data(kind, cfg),
                clients_why="its users are the clients",
            )
        )


_register()
