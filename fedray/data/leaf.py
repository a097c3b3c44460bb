"""LEAF's natural federated data sets, whose clients are their users: FEMNIST (handwritten
characters by writer, 62 classes) and Shakespeare (lines of the plays by speaking role, the next
character to predict), read from the JSON LEAF's scripts write (Caldas et al., "LEAF: A Benchmark
for Federated Settings", 2018; github.com/TalwalkarLab/leaf).

``data_root`` is the data set's folder as LEAF's ``preprocess.sh`` leaves it (``leaf/data/femnist/data``):

- ``train/*.json`` and ``test/*.json``, after LEAF's own split (``-t sample``): each user's
  training and test samples as LEAF drew them, read as they are, and as LEAF's training code
  (models/utils/model_utils.py) reads them: a user's samples are those written. Where LEAF's
  split_data.py records other counts, it is its own gap: it writes a Shakespeare role's test
  windows from ``n_train + 79`` on while its ``num_samples`` says ``n - n_train``, so each role of
  its test/ holds 79 fewer than it counts, which is read as LEAF's (any other count that is not the
  samples written is refused). A test/ file that is byte for byte a train/ file holding a user is
  refused naming both, before anything is parsed; a test set whose every sample is a training
  sample of its user is refused, and where only some are, how many is said once;
- or ``all_data/*.json`` (every user's samples), which fedray makes into clients exactly as
  ``preprocess.sh -s niid --sf F -k K -t sample --tf T --smplseed S --spltseed P`` does (LEAF's
  data/utils/sample.py, remove_users.py and split_data.py, `make_clients`):

  1. ``data.sample_fraction`` F (``-s niid --sf``; null: no sampling, as without ``-s``): each
     file's users are shuffled and taken whole until F of the file's samples is reached, the last
     user cut short to the first samples it needs, which sample.py stores in a shuffled order (the
     order the split then takes them in);
  2. ``data.min_samples`` K (``-k``): users with fewer samples (after the cut) are dropped;
  3. ``data.train_fraction`` T (``--tf``): a user with two samples or more trains on
     ``max(1, int(T n))`` of them (one of two). FEMNIST's are drawn at random, the rest its test
     samples. Shakespeare's are its first ones, in its stored order, and its test samples start
     79 samples later; a role with no test sample left is dropped. A sample is 80 characters and
     the one after, the next sample's window moved on by one: in a role stored in its text's order
     (every role but a cut one) the gap keeps each test window's 80 characters clear of every
     training window's (the last training sample's next character is the first test window's
     first). The role step 1 cuts short (one a file at most, and only where F is set) is split in
     sample.py's shuffled order: its training and its test windows are both drawn from its first
     samples at random, so its test windows lie among its training ones and share text with them
     (at LEAF's T 0.9, all but by a vanishing chance). fedray says once which role, and how many of
     its test windows have a training window within 79 samples (`shared_windows`); from a folder
     LEAF split, where the windows' places are not written, it finds such roles by their text
     (windows not following one another in the stored order) and counts what their text shows (at
     least that many, `text_places`).

  The sampling draws from Python's ``random.Random(data seed)`` and the split from
  ``random.Random(data.split_seed, else the data seed)``, one generator over the files in order,
  as LEAF's scripts draw theirs: the same seeds give LEAF's users and samples exactly. LEAF visits
  the files in the order ``os.listdir`` gives, fedray in sorted order; where the two differ (several
  files on most file systems) the users drawn differ, their rules not. The data seed is
  ``data_seed``, 0 where it is left out (whatever the run's seed): LEAF's paper data is
  ``data_seed: 1549786595`` and ``data.split_seed: 1549786796`` (its paper_experiments/femnist.sh).

Each JSON file holds ``users`` (names), ``num_samples`` and ``user_data`` (``{user: {"x": [...],
"y": [...]}}``). A FEMNIST sample is 784 grey levels in [0, 1] (a 28x28 image) and its class; a
Shakespeare sample is 80 characters and the character that follows, from LEAF's 80 symbols
(`SHAKESPEARE_VOCAB`), stored as their indices. The clients are the users kept, in LEAF's order;
the global test set is every client's test samples. A Shakespeare character outside LEAF's 80
(ALL_LETTERS in its models/utils/language_utils.py) is refused naming every user that holds one.
What is read is kept beside the JSON (``.fedray-leaf-KIND-HASH.npz``, named by the SHA-256 of the
JSON files' names and content, which every process reads once), so a later run reads arrays; an
older one is removed when a new one is kept, and a folder that cannot be written is read from its
JSON each time (said once). The arrays record the names and SHA-256s of the JSON files they were
made from, and are used only where those are the folder's JSON now, the ones a run records: arrays
of other JSON (another folder's, under this one's name) or damaged ones are said once and made
anew from the JSON. They are read without pickles (``allow_pickle=False``), so no kept file can run
code, and checked to fit together (shapes, offsets, labels) before they are used.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedray.config.coercion import ConfigError
from fedray.config.hparams import bound
from fedray.config.keys import file_digest
from fedray.config.notes import say_once
from fedray.data.datasets import (
    ArrayDataset,
    Dataset,
    DatasetInfo,
    DatasetMissing,
    DataSpec,
    data_seed,
    data_settings,
)
from fedray.data.federated import FederatedData, own_splits

if TYPE_CHECKING:
    from fedray.config.sections import DataSection

# LEAF's symbols of the plays (its models/utils/language_utils.py): a character is its index here
SHAKESPEARE_VOCAB = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
SEQ_LEN = 80  # characters a Shakespeare sample gives the model
SYMBOL_INDEX = np.full(256, -1, dtype=np.int16)  # a character code (all are ASCII) -> its index, -1: none
for _i, _c in enumerate(SHAKESPEARE_VOCAB):
    SYMBOL_INDEX[ord(_c)] = _i


@dataclass(frozen=True)
class LeafSettings:
    """femnist's and shakespeare's own keys (data.NAME): how LEAF's preprocess.sh -s niid --sf F -k K
    -t sample --tf T makes the clients of all_data/ (--smplseed is data_seed; --spltseed split_seed).
    A folder LEAF split already (train/, test/) leaves them all to LEAF: they stay at their defaults."""

    # LEAF's niid sampling (--sf): each file's users shuffled and taken whole until this fraction of
    # the file's samples is reached, the last one cut short; null = no sampling (LEAF without -s)
    sample_fraction: float | None = field(default=None, metadata=bound(gt=0, le=1, note="null = all"))
    min_samples: int = field(default=0, metadata=bound(ge=0))  # LEAF's -k: a user's fewest samples
    # the share of each user's samples it trains on (LEAF's split by sample, --tf)
    train_fraction: float = field(default=0.9, metadata=bound(gt=0, lt=1))
    # the seed of the split (--spltseed), where it is not the sampling's (null: data_seed)
    split_seed: int | None = field(default=None, metadata=bound(ge=0, note="null = data_seed"))


class LeafError(ConfigError):
    """A LEAF folder or file that is not what LEAF's scripts write; the message names it."""


@dataclass(frozen=True)
class Kind:
    """What tells FEMNIST and Shakespeare apart."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    scale: float  # stored value * scale = the model's input (FEMNIST's grey levels as uint8)
    # LEAF's split of a user's samples: None, at random; a number, in order with this many samples
    # between the last training sample and the first test one (Shakespeare: a window's length - 1)
    gap: int | None = None


FEMNIST = Kind("femnist", (1, 28, 28), 62, 1 / 255)
SHAKESPEARE = Kind("shakespeare", (SEQ_LEN,), len(SHAKESPEARE_VOCAB), 1.0, gap=SEQ_LEN - 1)


@dataclass
class Users:
    """A LEAF folder read: every user's samples one user after another (``train``), the users of
    each JSON file together, and where the folder was split already, each user's test samples too
    (``test``)."""

    names: list[str]
    x: np.ndarray
    y: np.ndarray
    offsets: np.ndarray  # user i's samples are rows offsets[i]:offsets[i + 1]
    file_offsets: np.ndarray  # file f's users are file_offsets[f]:file_offsets[f + 1]
    test_x: np.ndarray | None = None
    test_y: np.ndarray | None = None
    test_offsets: np.ndarray | None = None
    stamp: str = ""  # the JSON's fingerprint (`read_users`): what the clients made of it are kept by

    @property
    def split(self) -> bool:
        return self.test_offsets is not None

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def files(self) -> list[np.ndarray]:
        """Each file's users, as indices."""
        return [np.arange(a, b) for a, b in zip(self.file_offsets[:-1], self.file_offsets[1:], strict=True)]


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
        except (TypeError, ValueError, OverflowError):  # OverflowError: a whole number past a float
            raise LeafError(f"{where}: a FEMNIST sample is 784 grey levels in [0, 1]") from None
        if not np.isfinite(pixels).all():  # null reads as NaN
            i = int(np.flatnonzero(~np.isfinite(pixels).reshape(len(x), -1).all(axis=1))[0])
            raise LeafError(f"{where}: sample {i} has a null or non-finite grey level")
        if pixels.size and (pixels.min() < 0 or pixels.max() > 1):
            raise LeafError(f"{where}: a FEMNIST sample is 784 grey levels in [0, 1]")
        labels = class_ids(where, y)
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
        raise _Unknown(text[int(np.flatnonzero(index < 0)[0])])
    chars = index.astype(np.uint8)
    n = len(x)
    return chars[: n * SEQ_LEN].reshape(n, SEQ_LEN), chars[n * SEQ_LEN :].astype(np.int64)


class _Unknown(Exception):
    """A Shakespeare user's character outside LEAF's symbols (`_read_files` names every such user)."""

    def __init__(self, char: str) -> None:
        super().__init__(char)
        self.char = char


def class_ids(where: str, y: list) -> np.ndarray:
    """Labels that are whole numbers, as int64; anything else (3.7, "3", null, 2**70, 1e20) named."""
    for i, v in enumerate(y):
        if isinstance(v, bool) or not (isinstance(v, int) or isinstance(v, float) and v.is_integer()):
            raise ConfigError(f"{where}: sample {i}'s label is {v!r}, not a class id (a whole number)")
        if not -(2**63) <= v < 2**63:  # what int64 holds; every class id is far inside it
            raise ConfigError(f"{where}: sample {i}'s label is {v!r}, too large for a class id")
    return np.asarray(y, dtype=np.int64)


def _read_files(
    kind: Kind, files: list[Path], side: str = "all_data", unknown: list | None = None
) -> tuple[list[str], list[np.ndarray], list[np.ndarray], list[int]]:
    """Every user's samples, file after file, and how many users each file holds. ``side`` is the
    folder the files are in (all_data, train, test). A Shakespeare user with a character outside
    LEAF's symbols is put in ``unknown`` as (file, user, character) and read on (`_refuse_unknown`
    names them all at once)."""
    names, xs, ys, per_file = [], [], [], []
    seen: dict[str, Path] = {}
    # LEAF's split_data.py records a Shakespeare role's test count as n - n_train while it writes the
    # windows from n_train + 79 on (the gap): each role of a LEAF split's test/ is 79 short of its count
    short = kind.gap if side == "test" and kind.gap else 0
    for path in files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise LeafError(f"{path}: not LEAF JSON ({type(e).__name__}: {e})") from None
        except RecursionError:
            raise LeafError(f"{path}: not LEAF JSON (nested deeper than Python reads)") from None
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("users"), list)
            or not isinstance(data.get("user_data"), dict)
        ):
            raise LeafError(f"{path}: a LEAF file holds 'users' (a list) and 'user_data' (a mapping)")
        counts = data.get("num_samples")
        if counts is not None and (not isinstance(counts, list) or len(counts) != len(data["users"])):
            raise LeafError(f"{path}: 'num_samples' must list one count a user of 'users'")
        for i, user in enumerate(data["users"]):
            if not isinstance(user, str):
                raise LeafError(f"{path}: 'users' holds {user!r}, not a user's name (a string)")
            if user in seen:
                also = "" if seen[user] == path else f" and in {seen[user]}"
                raise LeafError(
                    f"{path}: user {user!r} is listed twice (here{also}): as two clients it would train twice "
                    "and its test samples count twice"
                )
            seen[user] = path
            samples = data["user_data"].get(user)
            if not isinstance(samples, dict):
                raise LeafError(f"{path}: user {user!r} is in 'users' but not in 'user_data'")
            try:
                x, y = _encode(kind, path, str(user), samples.get("x"), samples.get("y"))
            except _Unknown as e:
                if unknown is None:
                    raise LeafError(_unknown_message([(path, user, e.char)])) from None
                unknown.append((path, user, e.char))
                continue  # refused, named with the others, once every file is read
            if counts is not None and counts[i] != len(y) and not (short and counts[i] == len(y) + short):
                # LEAF's sampling and -k read these counts: a file whose counts are not its samples
                # is not one LEAF's scripts wrote, and would be sampled by other numbers than here
                gap = f" (or, LEAF's split's test count, {len(y) + short})" if short else ""
                raise LeafError(
                    f"{path}: user {user!r} has {len(y)} samples, and 'num_samples' says {counts[i]}{gap}"
                )
            names.append(str(user))
            xs.append(x)
            ys.append(y)
        per_file.append(len(data["users"]))
    return names, xs, ys, per_file


def _unknown_message(unknown: list[tuple[Path, str, str]], shown: int = 6) -> str:
    """One line naming the users whose text holds a character outside LEAF's symbols (the first
    ``shown`` of them, by file, each with its first such character), and how many there are."""
    vocab = f"LEAF's {len(SHAKESPEARE_VOCAB)} symbols"
    if len(unknown) == 1:
        path, user, char = unknown[0]
        return f"{path}: user {user!r}: character {char!r} is not one of {vocab}"
    by_file: dict[Path, list[str]] = {}
    for path, user, char in unknown[:shown]:
        by_file.setdefault(path, []).append(f"{user!r} ({char!r})")
    listed = "; ".join(f"{path}: {', '.join(named)}" for path, named in by_file.items())
    more = f"; and {len(unknown) - shown} more" if len(unknown) > shown else ""
    count = len({user for _, user, _ in unknown})  # a split folder's user can be in train/ and test/
    whose = "1 user's" if count == 1 else f"{count} users'"
    return (
        f"{whose} text holds characters that are not among {vocab} (ALL_LETTERS in its "
        f"models/utils/language_utils.py, which its models read): {listed}{more}"
    )


def _stacked(
    kind: Kind, xs: list[np.ndarray], ys: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum([len(y) for y in ys])]).astype(np.int64)
    dtype = np.uint8
    x = np.concatenate(xs) if xs else np.zeros((0, *kind.input_shape), dtype)
    y = np.concatenate(ys) if ys else np.zeros(0, np.int64)
    return x, y, offsets


def _names(files: Sequence[Path]) -> list[str]:
    """The JSON files as their folder and name (all_data/x.json): what the kept arrays record."""
    return [f"{p.parent.name}/{p.name}" for p in files]


def fingerprint(files: Sequence[Path]) -> str:
    """What names the JSON files by their content: the SHA-256 of each file's folder, name and
    content's SHA-256, in order."""
    h = hashlib.sha256()
    for name, p in zip(_names(files), files, strict=True):
        h.update(f"{name}\0{file_digest(p)}\0".encode())
    return h.hexdigest()


_READ: dict[tuple[str, str], Users] = {}  # in this process: (folder, fingerprint) -> its users


def read_users(kind: Kind, root: str | Path) -> Users:
    """A LEAF folder's users (`layout`), from its arrays kept beside the JSON where they were made
    from this JSON (its files' SHA-256s, recorded in them), else read from the JSON and kept (where
    the folder can be written). A folder LEAF split is checked as a test set (`_check_split`)."""
    root = Path(root)
    train_files, test_files = layout(root, kind.name)
    files = [*train_files, *test_files]
    stamp = fingerprint(files)
    key = (str(root.resolve()), stamp)
    if key in _READ:
        return _READ[key]
    if test_files:
        _refuse_test_is_train(train_files, test_files)
    made_from = dict(zip(_names(files), (file_digest(p) for p in files), strict=True))
    kept = root / f"{_CACHE_PREFIX}{kind.name}-{stamp[:32]}.npz"
    users = _read_kept(kept, kind, made_from) if kept.is_file() else None
    if users is None:
        users = _read_json(kind, root, train_files, test_files)
        _keep(users, kept, kind, made_from)
    users.stamp = stamp
    if users.split:
        _check_split(kind, root, users)
    _READ[key] = users
    return users


_CACHE_PREFIX = ".fedray-leaf-"
_ARRAYS = ("names", "x", "y", "offsets", "file_offsets")
_TEST_ARRAYS = ("test_x", "test_y", "test_offsets")
# what the kept arrays were made of: the JSON files (folder/name) and their SHA-256s, in order
_MADE_FROM = ("json_files", "json_sha256")


class _Stale(Exception):
    """Kept arrays that are whole, but made from other JSON than the folder's (the message says which)."""


def _read_kept(path: Path, kind: Kind, made_from: dict[str, str]) -> Users | None:
    """The arrays kept at ``path`` where they were made from the JSON files ``made_from`` names
    (folder/name -> SHA-256), else None, said once: damaged or other arrays (they hold no code:
    read without pickles), or arrays of other JSON, are read from the JSON again and kept anew."""
    why = "reading the JSON again and keeping them anew"
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        if not all(k in arrays for k in _MADE_FROM):
            raise _Stale("they do not record the JSON they were made from (kept by an older fedray)")
        was = dict(zip(arrays["json_files"].tolist(), arrays["json_sha256"].tolist(), strict=True))
        if was != made_from:
            differ = sorted(n for n in was.keys() | made_from.keys() if was.get(n) != made_from.get(n))
            raise _Stale(f"they were made from other JSON than this folder's ({differ[0]} differs)")
        users = _kept_users(arrays, kind)
    except _Stale as e:
        say_once(f"{path}: {e}: {why}")
        return None
    except Exception:  # noqa: BLE001 - any damage: the JSON is the data, read it again
        say_once(
            f"{path} is not arrays fedray kept of this folder's LEAF JSON (damaged, or another file): {why}"
        )
        return None
    return users


def _kept_users(arrays: dict[str, np.ndarray], kind: Kind) -> Users:
    """`Users` of kept arrays, checked to be what `_keep` writes (shapes, types, offsets and labels
    in range), so that damage is found here and not as an index error in a run; ValueError if not."""
    if missing := sorted(set(_ARRAYS) - set(arrays)):
        raise ValueError(f"it lacks {missing}")
    names = arrays["names"]
    if names.dtype.kind != "U" or names.ndim != 1:
        raise ValueError("its names are not strings")
    sides = [("x", "y", "offsets")] + ([_TEST_ARRAYS] if "test_x" in arrays else [])
    for xk, yk, ok in sides:
        x, y, offsets = arrays[xk], arrays[yk], arrays[ok]
        if (
            x.dtype != np.uint8
            or x.shape[1:] != kind.input_shape
            or y.dtype != np.int64
            or y.shape != x.shape[:1]
        ):
            raise ValueError(f"{xk} and {yk} are not {kind.name}'s samples")
        if y.size and (y.min() < 0 or y.max() >= kind.num_classes):
            raise ValueError(f"{yk} holds labels outside 0..{kind.num_classes - 1}")
        _check_offsets(offsets, len(names), len(y), ok)
    _check_offsets(arrays["file_offsets"], None, len(names), "file_offsets")
    tests = [arrays[k] for k in _TEST_ARRAYS] if "test_x" in arrays else []
    return Users([str(n) for n in names], *(arrays[k] for k in _ARRAYS[1:]), *tests)


def _check_offsets(offsets: np.ndarray, parts: int | None, total: int, name: str) -> None:
    if (
        offsets.dtype != np.int64
        or offsets.ndim != 1
        or (parts is not None and len(offsets) != parts + 1)
        or not len(offsets)
        or offsets[0] != 0
        or offsets[-1] != total
        or (np.diff(offsets) < 0).any()
    ):
        raise ValueError(f"{name} are not offsets into its rows")


def _read_json(kind: Kind, root: Path, train_files: list[Path], test_files: list[Path]) -> Users:
    unknown: list[tuple[Path, str, str]] = []
    side = "train" if test_files else "all_data"
    names, xs, ys, per_file = _read_files(kind, train_files, side, unknown)
    if test_files:
        test_names, txs, tys, _ = _read_files(kind, test_files, "test", unknown)
    if unknown:
        raise LeafError(_unknown_message(unknown))
    x, y, offsets = _stacked(kind, xs, ys)
    file_offsets = np.concatenate([[0], np.cumsum(per_file)]).astype(np.int64)
    users = Users(names, x, y, offsets, file_offsets)
    if test_files:
        if set(test_names) != set(names):
            missing = sorted(set(names) ^ set(test_names))[:5]
            raise LeafError(
                f"{root}: train/ and test/ name other users (e.g. {missing}): not LEAF's split by sample"
            )
        at = {n: i for i, n in enumerate(test_names)}  # test/ in train/'s order, as LEAF writes it
        users.test_x, users.test_y, users.test_offsets = _stacked(
            kind, [txs[at[n]] for n in names], [tys[at[n]] for n in names]
        )
        if empty := [n for n, k in zip(names, np.diff(users.offsets), strict=True) if k == 0]:
            raise LeafError(f"{root}: train/'s user {empty[0]!r} has no training sample ({len(empty)} such)")
    return users


def _keep(users: Users, path: Path, kind: Kind, made_from: dict[str, str]) -> None:
    """Write the arrays read beside the JSON, with the JSON files' names and SHA-256s they were made
    from (aside, then renamed; with the permissions the user's umask gives a new file) and remove the
    ones kept of an older JSON; a folder that cannot be written is read from its JSON every time,
    which is said once."""
    arrays = {k: getattr(users, k) for k in _ARRAYS[1:]} | {"names": np.asarray(users.names, dtype=str)}
    if users.split:
        arrays |= {k: getattr(users, k) for k in _TEST_ARRAYS}
    arrays |= {
        "json_files": np.asarray(list(made_from), dtype=str),
        "json_sha256": np.asarray(list(made_from.values()), dtype=str),
    }
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=_CACHE_PREFIX, suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        say_once(
            f"{path.parent} cannot keep the arrays read from its LEAF JSON ({e.strerror or e}): every run "
            "reads the JSON again (slow at FEMNIST's size); a folder you can write keeps them"
        )
        return
    for old in path.parent.glob(f"{_CACHE_PREFIX}{kind.name}-*.npz"):
        if old != path:
            try:
                old.unlink()
            except OSError:
                pass


# --- a folder LEAF split: its test set against its training set ------------------------------------


def _refuse_test_is_train(train_files: list[Path], test_files: list[Path]) -> None:
    """A test/ file that is byte for byte a train/ file holding a user, refused naming both, before
    anything is parsed (LEAF's split writes a file without users, ``{"users": [], ...}``, to both
    sides where no user of an all_data/ file is kept: those are left alone)."""
    train_by_digest = {file_digest(p): p for p in train_files}
    for test in test_files:
        train = train_by_digest.get(file_digest(test))
        if train is None:
            continue
        try:
            holds = bool(json.loads(train.read_text()).get("users"))
        except (OSError, ValueError, AttributeError, RecursionError):
            continue  # not LEAF JSON: the reading names it
        if holds:
            raise LeafError(
                f"{test} is byte for byte {train}: a test set that is the training set measures nothing; "
                "test/ holds each user's other samples (LEAF's preprocess.sh -t sample writes both)"
            )


def _row_keys(x: np.ndarray, y: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """A 64-bit key of each sample (its input, label and user), equal for equal samples (two keys
    equal by chance are told apart by `_same_as_training`, which compares the samples)."""
    flat = np.ascontiguousarray(x.reshape(len(x), int(np.prod(x.shape[1:]))))
    width = -(-flat.shape[1] // 8) * 8  # bytes a row, as whole 64-bit words
    weights = np.random.default_rng(0x1EAF).integers(1, 2**63, width // 8, dtype=np.uint64) | np.uint64(1)
    keys = np.empty(len(x), np.uint64)
    with np.errstate(over="ignore"):
        for a in range(0, len(x), _CHUNK):
            rows = flat[a : a + _CHUNK]
            if width != flat.shape[1]:
                rows = np.pad(rows, ((0, 0), (0, width - flat.shape[1])))
            keys[a : a + len(rows)] = (rows.view(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
        keys = keys * np.uint64(0x9E3779B97F4A7C15) + y.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
        return keys + owner.astype(np.uint64) * np.uint64(0x165667B19E3779F9)


_CHUNK = 1 << 16  # rows a step of the checks below


def _among(keys: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """Each key: whether ``pool`` holds it (np.isin's answer, several times faster on millions of
    64-bit keys: a table of their top 24 bits passes the few that may be there to a binary search)."""
    out = np.zeros(len(keys), dtype=bool)
    if not len(pool) or not len(keys):
        return out
    top = np.uint64(64 - 24)
    table = np.zeros(1 << 24, dtype=bool)
    table[pool >> top] = True
    maybe = np.flatnonzero(table[keys >> top])
    ordered, wanted = np.sort(pool), keys[maybe]
    out[maybe] = ordered[np.minimum(np.searchsorted(ordered, wanted), len(ordered) - 1)] == wanted
    return out


def _same_as_training(users: Users) -> np.ndarray:
    """Each test sample: whether a training sample of its user is the same (input and label)."""
    assert users.test_offsets is not None and users.test_x is not None and users.test_y is not None
    owner = np.repeat(np.arange(len(users.names)), np.diff(users.offsets))
    test_owner = np.repeat(np.arange(len(users.names)), np.diff(users.test_offsets))
    train_keys = _row_keys(users.x, users.y, owner)
    test_keys = _row_keys(users.test_x, users.test_y, test_owner)
    hit = np.flatnonzero(_among(train_keys, test_keys))  # by the test keys' sort: they are fewer
    same = _among(test_keys, train_keys[hit])
    if same.any():  # the keys say maybe: compare the samples
        rows: dict[int, list[int]] = {}
        for i in hit:
            rows.setdefault(int(train_keys[i]), []).append(int(i))
        for t in np.flatnonzero(same):
            same[t] = any(
                owner[i] == test_owner[t]
                and users.y[i] == users.test_y[t]
                and np.array_equal(users.x[i], users.test_x[t])
                for i in rows.get(int(test_keys[t]), [])
            )
    return same


def _check_split(kind: Kind, root: Path, users: Users) -> None:
    """A folder LEAF split, as a test set: refused where every test sample is a training sample of
    its user; said once how many are, where some are; and for Shakespeare, said once which roles'
    test windows share text with their training ones (`_out_of_order`)."""
    assert users.test_offsets is not None
    same = _same_as_training(users)
    total = len(same)
    if total and same.all():
        raise LeafError(
            f"{root}: every one of test/'s {total} samples is a training sample of its user (the same input "
            "and label): a test set inside the training set measures nothing; split all_data/ again (LEAF's "
            "preprocess.sh -t sample), or point data_root at a folder with all_data/ alone"
        )
    if same.any():
        test_owner = np.repeat(np.arange(len(users.names)), np.diff(users.test_offsets))
        owners = np.unique(test_owner[same])
        say_once(
            f"{root}: {int(same.sum())} of test/'s {total} samples are also training samples of their user "
            f"(the same input and label; {len(owners)} user{'s' if len(owners) > 1 else ''}, e.g. "
            f"{users.names[owners[0]]!r}): LEAF's data "
            "holds them twice, and they count as test samples, as LEAF counts them"
        )
    if kind.gap is not None:
        _out_of_order(kind, root, users)


def _follows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each window: whether it is the one before it moved on by one character (its first 79 are
    the last 79 of the one before, its last that one's next), as a role's windows of LEAF's text are."""
    out = np.zeros(len(x), dtype=bool)
    for a in range(1, len(x), _CHUNK):
        b = min(len(x), a + _CHUNK)
        out[a:b] = (x[a:b, :-1] == x[a - 1 : b - 1, 1:]).all(axis=1) & (x[a:b, -1] == y[a - 1 : b - 1])
    return out


def _in_order(x: np.ndarray, y: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each user: whether its windows follow one another (`_follows`) in the order they are stored."""
    broken = np.concatenate([[0], np.cumsum(~_follows(x, y))])  # rows before i that do not follow
    end = offsets[1:]
    return broken[end] - broken[np.minimum(offsets[:-1] + 1, end)] == 0


def text_places(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Where each of a role's windows lies in its text, as far as the windows tell: a window that
    is another's moved on by one (`_follows`, each link one to one) is placed one after it; windows
    no link joins are placed more than a window's length apart. Two windows placed less than 80
    apart share text; two placed further apart may still (what lay between them is not there)."""
    n = len(x)
    at: dict[bytes, int] = {}
    for i in range(n):
        k = x[i].tobytes()
        at[k] = -1 if k in at else i  # a window seen twice: no link through it
    moved = np.concatenate([x[:, 1:], y[:, None].astype(np.uint8)], axis=1)
    nxt = np.array([at.get(moved[i].tobytes(), -1) for i in range(n)], dtype=np.int64)
    nxt[nxt == np.arange(n)] = -1
    linked = nxt >= 0
    claims = np.bincount(nxt[linked], minlength=n)
    nxt[linked & (claims[np.maximum(nxt, 0)] > 1)] = -1  # two windows before one: neither linked
    has_before = np.zeros(n, dtype=bool)
    has_before[nxt[nxt >= 0]] = True
    places = np.full(n, -1, dtype=np.int64)
    place = 0
    for start in [*np.flatnonzero(~has_before), *range(n)]:  # chains from their heads, then any loop
        i = int(start)
        if places[i] >= 0:
            continue
        while i >= 0 and places[i] < 0:
            places[i] = place
            place += 1
            i = int(nxt[i])
        place += 2 * SEQ_LEN
    return places


def shared_windows(train: np.ndarray, test: np.ndarray, reach: int) -> int:
    """How many of the ``test`` places have a ``train`` place within ``reach`` (windows of a text
    sliding by one, placed by their positions: a test window within 79 of a training one shares
    text with it)."""
    if not len(train) or not len(test):
        return 0
    t = np.sort(train)
    i = np.searchsorted(t, test)
    near = np.minimum(np.abs(test - t[np.maximum(i - 1, 0)]), np.abs(t[np.minimum(i, len(t) - 1)] - test))
    return int((near <= reach).sum())


def _roles(k: int) -> str:
    return "1 role's" if k == 1 else f"{k} roles'"


def _shared_note(where: str, cause: str, roles: list[tuple[str, int, int]], least: bool = False) -> str:
    """One line: the roles whose test windows share text with their training ones, and how many."""
    shared, total = sum(s for _, s, _ in roles), sum(t for _, _, t in roles)
    listed = ", ".join(f"{name!r} {s} of {t}" for name, s, t in roles[:3])
    more = f", and {len(roles) - 3} more roles" if len(roles) > 3 else ""
    found = "at least " if least else ""
    return (
        f"{where}: {cause}: {found}{shared} of {total} test windows share text with a training window of "
        f"their role (one starts fewer than {SEQ_LEN} characters from them): {listed}{more}; every other "
        f"role's test windows start {SEQ_LEN - 1} windows after its last training one (LEAF's gap)"
    )


def _out_of_order(kind: Kind, root: Path, users: Users) -> None:
    """A split Shakespeare folder's roles whose training or test windows are not in their text's
    order: LEAF's split_data.py keeps a role's order (its first windows train, its test windows 79
    later), so such a role is one LEAF's sample.py cut short, which it stores shuffled. Said once,
    with how many of their test windows share text with training ones (at least: `text_places`)."""
    assert users.test_x is not None and users.test_y is not None and users.test_offsets is not None
    ordered = _in_order(users.x, users.y, users.offsets) & _in_order(
        users.test_x, users.test_y, users.test_offsets
    )
    roles = []
    for u in np.flatnonzero(~ordered):
        tr, te = slice(*users.offsets[u : u + 2]), slice(*users.test_offsets[u : u + 2])
        places = text_places(
            np.concatenate([users.x[tr], users.test_x[te]]), np.concatenate([users.y[tr], users.test_y[te]])
        )
        n = tr.stop - tr.start
        roles.append(
            (users.names[u], shared_windows(places[:n], places[n:], SEQ_LEN - 1), te.stop - te.start)
        )
    if roles:
        cause = (
            f"{_roles(len(roles))} windows are not in their text's order (LEAF's sample.py stores the role it "
            "cuts short shuffled, and its split_data.py splits that order; found by their text)"
        )
        say_once(_shared_note(str(root), cause, roles, least=True))


@dataclass(frozen=True)
class Recipe:
    """How LEAF's preprocess.sh makes clients of its users' samples (``-s niid --sf -k -t sample
    --tf --smplseed --spltseed``): the config keys, and the split's kind (in order or at random)."""

    sample_fraction: float | None  # --sf; None: no sampling
    min_samples: int  # -k
    train_fraction: float  # --tf
    sample_seed: int  # --smplseed
    split_seed: int  # --spltseed
    gap: int | None  # None: each user's training samples drawn at random; else in order, then this gap

    @classmethod
    def of(cls, section: DataSection, gap: int | None, train_fraction: float | None = None) -> Recipe:
        """The recipe of ``section``'s dataset settings (LEAF's, or hf's that read LEAF's sampling: a
        setting it does not have is LEAF's default)."""
        s, seed = data_settings(section), data_seed(section)
        split_seed = getattr(s, "split_seed", None)
        return cls(
            s.sample_fraction,
            s.min_samples,
            s.train_fraction if train_fraction is None else train_fraction,  # hf gives its own
            seed,
            seed if split_seed is None else split_seed,
            gap,
        )


def niid_sample(users: np.ndarray, sizes: np.ndarray, fraction: float, rng: random.Random) -> list:
    """LEAF's sample.py --niid on one file: its users shuffled, taken whole until ``int(fraction *
    the file's samples)`` are taken; the last one cut to the samples still needed, its first ones in
    an order ``rng`` draws. Each taken user as (index, its samples: positions among its own)."""
    order = [int(u) for u in users]
    rng.shuffle(order)
    target = int(fraction * int(sizes[users].sum()))
    taken, total = [], 0
    for u in order:
        if total >= target:
            break
        n = int(sizes[u])
        samples = np.arange(n)
        if total + n > target:
            n = target - total
            samples = np.asarray(rng.sample(list(range(n)), n), dtype=np.int64)
        taken.append((u, samples))
        total += n
    return taken


def split_by_sample(
    n: int, train_fraction: float, gap: int | None, rng: random.Random
) -> tuple[np.ndarray, np.ndarray] | None:
    """LEAF's split_data.py --by_sample of one user's ``n`` samples: positions of its training and
    test samples, or None where LEAF drops the user (fewer than two samples, or no test sample)."""
    if n < 2:
        return None
    n_train = 1 if n == 2 else max(1, int(train_fraction * n))
    if gap is not None:
        train, test = np.arange(n_train), np.arange(n_train + gap, n)
    else:
        chosen = np.zeros(n, dtype=bool)
        chosen[rng.sample(list(range(n)), n_train)] = True
        train, test = np.flatnonzero(chosen), np.flatnonzero(~chosen)
    return (train, test) if len(test) else None


def make_clients(
    files: Sequence[np.ndarray], sizes: np.ndarray, recipe: Recipe
) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """LEAF's preprocess.sh on users grouped by file (``files``: each file's user indices, in order;
    ``sizes``: every user's samples): sampling (where ``recipe.sample_fraction`` is set), users under
    ``min_samples`` dropped, then each one's split. The clients in LEAF's order, each as (user, its
    training samples, its test samples), samples as positions among the user's own. Each step draws
    from its own generator across the files, as LEAF's scripts do (one process a step)."""
    sampler, splitter = random.Random(recipe.sample_seed), random.Random(recipe.split_seed)
    clients = []
    for users in files:
        if recipe.sample_fraction is None:
            picked = [(int(u), np.arange(int(sizes[u]))) for u in users]
        else:
            picked = niid_sample(users, sizes, recipe.sample_fraction, sampler)
        for u, samples in picked:
            if len(samples) < recipe.min_samples:
                continue
            split = split_by_sample(len(samples), recipe.train_fraction, recipe.gap, splitter)
            if split is not None:
                clients.append((u, samples[split[0]], samples[split[1]]))
    return clients


def leaf_clients(kind: Kind, section: DataSection, users: Users) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """The run's clients: (user, its training rows, its test rows), rows into ``users``' arrays
    (a folder LEAF split already: its test rows into the test arrays)."""
    if users.split:
        return [
            (i, np.arange(users.offsets[i], users.offsets[i + 1]), np.arange(*users.test_offsets[i : i + 2]))
            for i in range(len(users.names))
        ]
    recipe = Recipe.of(section, kind.gap)
    made = _MADE.get((users.stamp, recipe)) if users.stamp else None
    if made is None:  # counted, checked and loaded for one run, and again for each run of a sweep
        made = make_clients(users.files(), users.sizes(), recipe)
        if users.stamp:
            _MADE[users.stamp, recipe] = made
        if kind.gap is not None:
            _say_cut_roles(kind, section, users, made)
    return [(u, users.offsets[u] + tr, users.offsets[u] + te) for u, tr, te in made]


def _say_cut_roles(
    kind: Kind, section: DataSection, users: Users, made: list[tuple[int, np.ndarray, np.ndarray]]
) -> None:
    """Said once: the roles whose test windows share text with their training ones, and how many
    (by the windows' positions in the role's text: a test window within 79 of a training one). In
    order, LEAF's split leaves none; the role LEAF's sample.py cuts short (its first samples in a
    shuffled order, one a file at most) is split in that order."""
    assert kind.gap is not None
    roles = [
        (users.names[u], shared, len(te))
        for u, tr, te in made
        if (shared := shared_windows(tr, te, kind.gap))
    ]
    if roles:
        fraction, cut = (
            data_settings(section).sample_fraction,
            "1 role" if len(roles) == 1 else f"{len(roles)} roles",
        )
        cause = (
            f"data.sample_fraction {fraction} cuts {cut} short as LEAF's sample.py does, storing the first "
            "samples it keeps shuffled, and its split_data.py splits that order"
        )
        say_once(_shared_note(str(section.resolved_data_root()), cause, roles))


# in this process: (the JSON's fingerprint, a recipe) -> the clients LEAF's steps make of it
_MADE: dict[tuple[str, Recipe], list[tuple[int, np.ndarray, np.ndarray]]] = {}


def leaf_data(kind: Kind, section: DataSection) -> FederatedData:
    """The run's clients: the users kept, each its training and test samples."""
    users = read_users(kind, section.resolved_data_root())
    test_x, test_y = (users.test_x, users.test_y) if users.split else (users.x, users.y)
    parts = [
        (ArrayDataset(users.x[tr], users.y[tr]), ArrayDataset(test_x[te], test_y[te]))
        for _, tr, te in leaf_clients(kind, section, users)
    ]
    train, test, clients = own_splits(parts)
    spec = DataSpec(kind.input_shape, kind.num_classes, kind.scale)
    return FederatedData(Dataset(kind.name, train, test, spec), clients, None)


def leaf_info(kind: Kind, section: DataSection) -> DatasetInfo:
    return DatasetInfo(kind.input_shape, kind.num_classes, None)


def _users(kind: Kind, section: DataSection) -> Users:
    try:
        return read_users(kind, section.resolved_data_root())
    except DatasetMissing as e:
        raise ConfigError(f"config key 'data_root': {e}") from None


def count_leaf(kind: Kind, section: DataSection) -> int:
    """The clients a LEAF folder gives this config: its users kept."""
    return len(leaf_clients(kind, section, _users(kind, section)))


def check_leaf(kind: Kind, section: DataSection, info: DatasetInfo) -> None:
    """Before anything runs: the folder is LEAF's, its users kept are the run's clients (num_clients
    is their number), and on a folder LEAF split already the sampling and split keys are LEAF's own."""
    root = Path(section.resolved_data_root())
    users, s = _users(kind, section), data_settings(section)
    if users.split:
        for f in fields(LeafSettings):
            if getattr(s, f.name) != f.default:
                raise ConfigError(
                    f"config key 'data.{f.name}': {root} is split by LEAF already (train/ and test/): its users "
                    "and their split are LEAF's (its preprocess.sh --sf, -k, --tf, --spltseed); leave it at its "
                    "default, or point data_root at a folder with all_data/"
                )
    n = len(leaf_clients(kind, section, users))
    kept = f"data.sample_fraction {s.sample_fraction}, data.min_samples {s.min_samples} and LEAF's split"
    if n == 0:
        raise ConfigError(
            f"config key 'data.min_samples': no {kind.name} user of {root} is left by {kept} (a user needs "
            "two samples, and a test sample after the split)"
        )
    if n != section.num_clients:
        raise ConfigError(
            f"config key 'num_clients': the {kind.name} users of {root} kept by {kept} are {n}; "
            f"set num_clients: {n}, or leave it out (fedray counts them)"
        )
    if section.shift != "none":
        raise ConfigError(
            f"config key 'shift': {kind.name}'s users are its clients; a shift preset does not apply"
        )


def leaf_available(section: DataSection) -> None:
    layout(Path(section.resolved_data_root()), section.dataset)


def leaf_files(section: DataSection) -> tuple[Path, list[Path]]:
    """The JSON files it reads (`layout`)."""
    root = Path(section.resolved_data_root())
    train, test = layout(root, section.dataset)
    return root, [*train, *test]


def _register() -> None:
    from fedray.data.datasets import DatasetKind, register_dataset

    for kind in (FEMNIST, SHAKESPEARE):
        register_dataset(
            DatasetKind(
                kind.name,
                lambda section, kind=kind: leaf_data(kind, section).dataset,
                lambda section, kind=kind: leaf_info(kind, section),
                settings=LeafSettings,
                available=leaf_available,
                check_info=lambda section, info, kind=kind: check_leaf(kind, section, info),
                federate=lambda section, kind=kind: leaf_data(kind, section),
                checks_held_out=True,
                clients_why="its users are the clients",
                partition_label=lambda config: "leaf",
                count_clients=lambda section, kind=kind: count_leaf(kind, section),
                data_seed=0,
                files=leaf_files,
            )
        )


_register()
