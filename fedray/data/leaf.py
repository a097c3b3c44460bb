"""LEAF's natural federated data sets, whose clients are their users: FEMNIST (handwritten
characters by writer, 62 classes) and Shakespeare (lines of the plays by speaking role, the next
character to predict), read from the JSON LEAF's scripts write (Caldas et al., "LEAF: A Benchmark
for Federated Settings", 2018; github.com/TalwalkarLab/leaf).

``data_root`` is the data set's folder as LEAF's ``preprocess.sh`` leaves it (``leaf/data/femnist/data``):

- ``train/*.json`` and ``test/*.json``, after LEAF's own split (``-t sample``): each user's
  training and test samples as LEAF drew them, read as they are;
- or ``all_data/*.json`` (every user's samples), which fedray makes into clients exactly as
  ``preprocess.sh -s niid --sf F -k K -t sample --tf T --smplseed S --spltseed P`` does (LEAF's
  data/utils/sample.py, remove_users.py and split_data.py, `make_clients`):

  1. ``data.sample_fraction`` F (``-s niid --sf``; null: no sampling, as without ``-s``): each
     file's users are shuffled and taken whole until F of the file's samples is reached, the last
     user cut short to the first samples it needs, in a shuffled order;
  2. ``data.min_samples`` K (``-k``): users with fewer samples (after the cut) are dropped;
  3. ``data.train_fraction`` T (``--tf``): a user with two samples or more trains on
     ``max(1, int(T n))`` of them (one of two). FEMNIST's are drawn at random, the rest its test
     samples. Shakespeare's are its first ones, in order, and its test samples start 79 samples
     later (a sample is 80 characters, the next sample's window moves by one: the gap keeps every
     test window clear of the training text); a role with no test sample left is dropped.

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
the global test set is every client's test samples. What is read is kept beside the JSON
(``.fedray-leaf-KIND-HASH.npz``, named by the SHA-256 of the JSON files' names and content, which
every process reads once), so a later run reads arrays; an older one is removed when a new one is
kept, and a folder that cannot be written is read from its JSON each time (said once).
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
        except (TypeError, ValueError):
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
        bad = text[int(np.flatnonzero(index < 0)[0])]
        raise LeafError(f"{where}: character {bad!r} is not one of LEAF's {len(SHAKESPEARE_VOCAB)} symbols")
    chars = index.astype(np.uint8)
    n = len(x)
    return chars[: n * SEQ_LEN].reshape(n, SEQ_LEN), chars[n * SEQ_LEN :].astype(np.int64)


def class_ids(where: str, y: list) -> np.ndarray:
    """Labels that are whole numbers, as int64; anything else (3.7, "3", null) named."""
    for i, v in enumerate(y):
        if isinstance(v, bool) or not (isinstance(v, int) or isinstance(v, float) and v.is_integer()):
            raise ConfigError(f"{where}: sample {i}'s label is {v!r}, not a class id (a whole number)")
    return np.asarray(y, dtype=np.int64)


def _read_files(
    kind: Kind, files: list[Path]
) -> tuple[list[str], list[np.ndarray], list[np.ndarray], list[int]]:
    """Every user's samples, file after file, and how many users each file holds."""
    names, xs, ys, per_file = [], [], [], []
    seen: dict[str, Path] = {}
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
            x, y = _encode(kind, path, str(user), samples.get("x"), samples.get("y"))
            if counts is not None and counts[i] != len(y):
                # LEAF's sampling and -k read these counts: a file whose counts are not its samples
                # is not one LEAF's scripts wrote, and would be sampled by other numbers than here
                raise LeafError(
                    f"{path}: user {user!r} has {len(y)} samples, and 'num_samples' says {counts[i]}"
                )
            names.append(str(user))
            xs.append(x)
            ys.append(y)
        per_file.append(len(data["users"]))
    return names, xs, ys, per_file


def _stacked(
    kind: Kind, xs: list[np.ndarray], ys: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum([len(y) for y in ys])]).astype(np.int64)
    dtype = np.uint8
    x = np.concatenate(xs) if xs else np.zeros((0, *kind.input_shape), dtype)
    y = np.concatenate(ys) if ys else np.zeros(0, np.int64)
    return x, y, offsets


def fingerprint(files: Sequence[Path]) -> str:
    """What names the JSON files by their content: the SHA-256 of each file's folder, name and
    content's SHA-256, in order."""
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.parent.name}/{p.name}\0{file_digest(p)}\0".encode())
    return h.hexdigest()


_READ: dict[tuple[str, str], Users] = {}  # in this process: (folder, fingerprint) -> its users


def read_users(kind: Kind, root: str | Path) -> Users:
    """A LEAF folder's users (`layout`), from its arrays kept beside the JSON where they are of
    this JSON, else read from the JSON and kept (where the folder can be written)."""
    root = Path(root)
    train_files, test_files = layout(root, kind.name)
    stamp = fingerprint([*train_files, *test_files])
    key = (str(root.resolve()), stamp)
    if key in _READ:
        return _READ[key]
    kept = root / f"{_CACHE_PREFIX}{kind.name}-{stamp[:32]}.npz"
    users = _read_kept(kept) if kept.is_file() else None
    if users is None:
        users = _read_json(kind, root, train_files, test_files)
        _keep(users, kept, kind)
    users.stamp = stamp
    _READ[key] = users
    return users


_CACHE_PREFIX = ".fedray-leaf-"
_ARRAYS = ("names", "x", "y", "offsets", "file_offsets")
_TEST_ARRAYS = ("test_x", "test_y", "test_offsets")


def _read_kept(path: Path) -> Users | None:
    """The arrays kept at ``path``, or None (said once) where they cannot be read back whole."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        if not all(k in arrays for k in _ARRAYS):
            raise ValueError(f"it lacks {sorted(set(_ARRAYS) - set(arrays))}")
        tests = [arrays[k] for k in _TEST_ARRAYS] if "test_x" in arrays else []
        return Users([str(n) for n in arrays["names"]], *(arrays[k] for k in _ARRAYS[1:]), *tests)
    except Exception as e:  # noqa: BLE001 - any damage: the JSON is the data, read it again
        say_once(f"{path} could not be read back ({type(e).__name__}: {e}): reading the JSON again")
        return None


def _read_json(kind: Kind, root: Path, train_files: list[Path], test_files: list[Path]) -> Users:
    names, xs, ys, per_file = _read_files(kind, train_files)
    x, y, offsets = _stacked(kind, xs, ys)
    file_offsets = np.concatenate([[0], np.cumsum(per_file)]).astype(np.int64)
    users = Users(names, x, y, offsets, file_offsets)
    if test_files:
        test_names, txs, tys, _ = _read_files(kind, test_files)
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


def _keep(users: Users, path: Path, kind: Kind) -> None:
    """Write the arrays read beside the JSON (aside, then renamed; with the permissions the user's
    umask gives a new file) and remove the ones kept of an older JSON; a folder that cannot be
    written is read from its JSON every time, which is said once."""
    arrays = {k: getattr(users, k) for k in _ARRAYS[1:]} | {"names": np.asarray(users.names)}
    if users.split:
        arrays |= {k: getattr(users, k) for k in _TEST_ARRAYS}
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
    return [(u, users.offsets[u] + tr, users.offsets[u] + te) for u, tr, te in made]


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
                clients_why="its users are the clients",
                partition_label=lambda config: "leaf",
                count_clients=lambda section, kind=kind: count_leaf(kind, section),
                data_seed=0,
                files=leaf_files,
            )
        )


_register()
