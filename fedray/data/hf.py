"""Dataset ``hf``: a federated data set in the Hugging Face hub's format, whose rows name their
client (a writer, a speaker, a device): the clients are those ids, no partition is drawn. Read with
the `datasets` library (the hub's own loader; an optional extra: ``pip install 'fedray[hf]'``).

- ``data.name``: a folder a dataset was saved to (``Dataset.save_to_disk`` / ``DatasetDict``), or a hub
  name (``flwrlabs/femnist``, ``flwrlabs/shakespeare``), read from ``data_root/<owner>__<name>``
  where fedray saved it; ``download: true`` fetches it there once (needs the internet; nothing
  downloads otherwise, and a dataset that is not there is named in one line with what to run).
- ``data.split`` (default ``train``): the split whose rows are the clients' samples;
  ``data.client_column``, ``data.input_column``, ``data.label_column``: which columns.
- The input is an image (the ``Image`` feature or an array: grey or RGB, all of one size), text (a
  string, its characters as LEAF's 80 symbols: next-character data such as Shakespeare's), or an
  array of numbers. The label is a class id, or one character (its symbol).
- Each client's test split is ``data.test_split``'s rows of that client where it is set, read as
  they are. Else the clients are made as LEAF's preprocess.sh makes its users into clients
  (`fedray.data.leaf.make_clients`): ``data.sample_fraction`` (LEAF's niid ``--sf``, over the
  clients in sorted order), ``data.min_samples`` (``-k``), then each client's rows split by LEAF's
  rule with ``client_test_fraction`` its test share (``--tf`` = 1 - it): a client trains on
  ``max(1, int((1 - f) n))`` rows (one of two), drawn at random from the data seed, except text
  (next-character data, whose samples are windows sliding by one): its first rows, in order, its
  test rows starting a window's length - 1 rows later; a client with fewer than two rows, or no
  test row left, is dropped (as LEAF drops it). Every client's test rows are the global test set.
- Number arrays of one channel (``H x W``) get their channel (``1 x H x W``), as images do.
- Checked at load, before any round: number inputs holding NaN or an infinity (a null reads as NaN;
  a float64 beyond float32's range is one) are refused in one line naming the column, the split,
  how many rows and the first; a ``data.test_split`` whose rows are all training rows (the same
  input and label, compared by each row's digest: `row_keys`) is refused, one sharing some said
  once with how many.
- Its files (`hf_files`, the run's data identity: `fedray.data.identity`) are those
  ``load_from_disk`` reads (`loader_reads`): ``dataset_dict.json``, each split's ``state.json``,
  ``dataset_info.json`` and the Arrow files ``state.json`` names, whatever their names; not a README
  or the cache files ``map`` writes beside them, which it never reads.

The clients are the ids in sorted order, less those dropped; ``num_clients`` may be left out (it
is their number, which a given one must equal). The data seed is ``data_seed``, 0 where it is
left out (whatever the run's seed), so seeds vary training only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedray.config.coercion import ConfigError
from fedray.config.hparams import bound
from fedray.config.notes import say_once
from fedray.data.datasets import (
    ArrayDataset,
    Dataset,
    DatasetInfo,
    DatasetKind,
    DatasetMissing,
    DataSpec,
    data_settings,
    register_dataset,
)
from fedray.data.federated import FederatedData, own_splits
from fedray.data.held_out import count_seen, row_keys
from fedray.data.leaf import SHAKESPEARE_VOCAB, SYMBOL_INDEX, Recipe, class_ids, make_clients

if TYPE_CHECKING:
    from fedray.config.sections import DataSection


@dataclass(frozen=True)
class HfSettings:
    """Dataset hf's own keys (data.NAME): which dataset, which splits, which columns, and LEAF's
    sampling of its clients (where it splits them: no test_split)."""

    name: str = ""  # a saved dataset's folder, or a hub name kept in data_root (download: true)
    split: str = "train"  # the split whose rows are the clients' samples
    test_split: str = ""  # a split of each client's test rows ("": client_test_fraction)
    client_column: str = ""  # the column naming each row's client
    input_column: str = ""  # the input column (an image, text, or numbers)
    label_column: str = ""  # the label column (a class id, or the next character)
    # LEAF's niid sampling (--sf) over the clients in sorted order; null = no sampling
    sample_fraction: float | None = field(default=None, metadata=bound(gt=0, le=1, note="null = all"))
    min_samples: int = field(default=0, metadata=bound(ge=0))  # LEAF's -k: a client's fewest rows


COLUMN_KEYS = ("client_column", "input_column", "label_column")


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "config key 'dataset': hf reads with the datasets library, which is not installed: "
            "pip install 'fedray[hf]' (or pip install datasets)"
        ) from None
    return datasets


def local_copy(section: DataSection) -> Path:
    """Where a dataset is read from: ``data.name`` itself where it is a folder, else the copy fedray
    keeps in ``data_root`` (``owner__name``)."""
    s: HfSettings = data_settings(section)
    given = Path(s.name).expanduser()
    if given.is_dir():
        return given
    return Path(section.resolved_data_root()) / re.sub(r"[^\w.-]", "__", s.name)


def hf_available(section: DataSection) -> None:
    s: HfSettings = data_settings(section)
    if not s.name:
        raise DatasetMissing("dataset hf: set data.name (a hub dataset, or a folder a dataset was saved to)")
    where = local_copy(section)
    if where.is_dir() or section.download:
        return
    raise DatasetMissing(
        f"dataset hf: {s.name} is not in {str(where)!r} (nothing downloads at run time): --set download=true "
        f'fetches it there (needs the internet), or save it there yourself: python -c "import datasets; '
        f"datasets.load_dataset('{s.name}').save_to_disk('{where}')\""
    )


def hf_files(section: DataSection) -> tuple[Path, list[Path]]:
    """The files ``datasets.load_from_disk`` reads of the saved dataset (`loader_reads`), nothing
    else: a README, a lock or a ``cache-*.arrow`` the library wrote beside it (``map``'s results)
    are not read, so they are not the data."""
    s: HfSettings = data_settings(section)
    where = local_copy(section)
    if not where.is_dir():
        raise DatasetMissing(f"dataset hf: {s.name} is not in {str(where)!r}")
    return where, loader_reads(where)


# the JSON files `datasets` writes beside a saved dataset's Arrow files (its config names)
DATASET_DICT_JSON, STATE_JSON, INFO_JSON = "dataset_dict.json", "state.json", "dataset_info.json"


def loader_reads(folder: Path) -> list[Path]:
    """The files ``datasets.load_from_disk(folder)`` opens, found as its code finds them (read in
    datasets 5.2: `datasets.load.load_from_disk`): a folder with ``dataset_info.json`` and
    ``state.json`` is one Dataset, which reads those two and the Arrow files that ``state.json``'s
    ``_data_files`` names (``data-*-of-*.arrow`` as ``save_to_disk`` writes them; whatever they are
    named, a ``cache-*.arrow`` too, they are read); else ``dataset_dict.json`` names the splits, each
    a Dataset in its own folder, read so. The files there now, sorted; none where it is neither
    (loading then says so), and only the JSON where it cannot be parsed (it is read, and fails)."""
    if (folder / INFO_JSON).is_file() and (folder / STATE_JSON).is_file():
        return _dataset_reads(folder)
    if (folder / DATASET_DICT_JSON).is_file():
        found = {folder / DATASET_DICT_JSON}
        for split in _listed(folder / DATASET_DICT_JSON, "splits"):
            if isinstance(split, str) and split:
                found |= set(_dataset_reads(folder / split))
        return sorted(found)
    return []


def _dataset_reads(folder: Path) -> list[Path]:
    """One saved Dataset's files (`datasets.Dataset.load_from_disk`): its two JSON files and the
    Arrow files its state names, those there."""
    found = {p for p in (folder / INFO_JSON, folder / STATE_JSON) if p.is_file()}
    for entry in _listed(folder / STATE_JSON, "_data_files"):
        name = entry.get("filename") if isinstance(entry, dict) else None
        if isinstance(name, str) and name and (folder / name).is_file():
            found.add(folder / name)
    return sorted(found)


def _listed(path: Path, key: str) -> list:
    """``path``'s JSON's list ``key``; none where it is not there or not that."""
    import json

    try:
        listed = json.loads(path.read_text(encoding="utf-8"))[key]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return listed if isinstance(listed, list) else []


def _open(section: DataSection) -> Any:
    """The dataset (a DatasetDict, or one Dataset), downloaded and kept first where asked."""
    s: HfSettings = data_settings(section)
    ds = _datasets()
    where = local_copy(section)
    if not where.is_dir():
        hf_available(section)
        if unreachable := _hub_unreachable():
            raise DatasetMissing(f"dataset hf: cannot download {s.name}: {unreachable}")
        try:
            ds.load_dataset(s.name).save_to_disk(str(where))
        except Exception as e:  # noqa: BLE001 - the hub's errors, said in one line
            raise DatasetMissing(f"dataset hf: cannot download {s.name}: {type(e).__name__}: {e}") from None
    try:
        return ds.load_from_disk(str(where))
    except Exception as e:  # noqa: BLE001 - not a saved dataset
        raise DatasetMissing(
            f"dataset hf: {str(where)!r} is not a saved dataset ({type(e).__name__}: {e})"
        ) from None


def _hub_unreachable(timeout_s: float = 5.0) -> str | None:
    """Why the hub (HF_ENDPOINT, else huggingface.co) cannot be reached, said at once, or None: the
    library itself retries for half a minute, a line each time, before saying so."""
    import os
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as e:
        return f"{host} cannot be reached ({e.strerror or type(e).__name__}): no network here? Save the dataset on a machine that has one (save_to_disk) and point data.name at the folder"


def _split(section: DataSection, data: Any, name: str, key: str) -> Any:
    s: HfSettings = data_settings(section)
    if not hasattr(data, "keys"):  # one Dataset, saved alone: its only split
        if name not in ("train", ""):
            raise ConfigError(f"config key '{key}': {s.name} has one split, not {name!r}")
        return data
    if name not in data:
        raise ConfigError(
            f"config key '{key}': {s.name} has no split {name!r} (its splits: {', '.join(data)})"
        )
    return data[name]


def _columns(section: DataSection, split: Any, keys: tuple[str, ...] = COLUMN_KEYS) -> list[str]:
    """The columns ``keys`` name; every one that is not a column of ``split`` said at once."""
    s: HfSettings = data_settings(section)
    problems = [
        f"config key 'data.{key}': {getattr(s, key)!r} is not a column of {s.name} "
        f"(its columns: {', '.join(split.column_names)})"
        for key in keys
        if getattr(s, key) not in split.column_names
    ]
    if problems:
        raise ConfigError.of(problems)
    return [getattr(s, key) for key in keys]


def _symbols(texts: list[str], where: str) -> np.ndarray:
    codes = [np.frombuffer(t.encode("utf-32-le"), dtype=np.uint32) for t in texts]
    if len({len(c) for c in codes}) > 1:
        raise ConfigError(f"{where}: text inputs of one length are one model's inputs; they differ here")
    flat = np.concatenate(codes) if codes else np.zeros(0, np.uint32)
    index = np.where(flat < len(SYMBOL_INDEX), SYMBOL_INDEX[np.minimum(flat, len(SYMBOL_INDEX) - 1)], -1)
    if (index < 0).any():
        raise ConfigError(
            f"{where}: {''.join(texts)[int(np.flatnonzero(index < 0)[0])]!r} is not one of LEAF's 80 symbols"
        )
    return index.astype(np.uint8).reshape(len(texts), -1)


def _inputs(split: Any, column: str, where: str, finite: bool = True) -> tuple[np.ndarray, float]:
    """A column's values as model inputs and the scale that makes them the model's numbers: text
    as symbols; images (the Image feature) and number arrays alike by their stored type, uint8
    grey levels scaled by 1/255, any other number as it is (as float32): a NaN or an infinity
    there refused (`_refuse_non_finite`), unless ``finite`` is False (a first row, for its shape)."""
    first = split[0][column] if len(split) else None
    if isinstance(first, str):
        return _symbols(split[column], where), 1.0
    if hasattr(first, "convert"):  # PIL images
        arrays = [
            np.asarray(v.convert("L" if v.mode in ("L", "1", "I", "I;16", "F") else "RGB"))
            for v in split[column]
        ]
    else:  # arrays in the type they were stored as (a list of lists would read as int64 or float64)
        arrays = list(split.with_format("numpy", dtype=None)[:][column])  # dtype None: not made int64
    if len({np.shape(a) for a in arrays}) > 1 or any(np.asarray(a).dtype == object for a in arrays[:1]):
        raise ConfigError(
            f"{where}: the inputs differ in shape ({np.shape(arrays[0])}, ...): one model takes one shape"
        )
    x = np.stack(arrays) if arrays else np.zeros((0, 1))
    if x.ndim == 3:
        x = x[:, None]  # grey images, or H x W numbers: one channel
    elif x.ndim == 4 and hasattr(first, "convert"):
        x = x.transpose(0, 3, 1, 2)  # H x W x C -> C x H x W
    if x.dtype == np.uint8:
        return x, 1 / 255
    with np.errstate(over="ignore"):  # a float64 beyond float32's range: said below
        numbers = x.astype(np.float32)
    if finite:
        _refuse_non_finite(x, numbers, where)
    return numbers, 1.0


def _refuse_non_finite(stored: np.ndarray, numbers: np.ndarray, where: str) -> None:
    """Rows whose numbers hold a NaN or an infinity (a null in a float list reads as NaN), or a
    float64 beyond float32's range (an infinity to the model), refused in one line: how many, and
    the first (its index in the split as stored). A model would train on them, and diverge later."""
    if not np.issubdtype(numbers.dtype, np.floating) or not len(numbers):
        return
    bad = ~np.isfinite(numbers.reshape(len(numbers), -1)).all(axis=1)
    if not bad.any():
        return
    rows = np.flatnonzero(bad)
    beyond = np.zeros(len(rows), bool)  # finite as stored: beyond float32's range
    if np.issubdtype(stored.dtype, np.floating):
        beyond = np.isfinite(stored[rows].reshape(len(rows), -1)).all(axis=1)
    what = (
        "numbers beyond float32's range (the model's numbers)"
        if beyond.all()
        else "NaN or infinite values (a null reads as NaN)"
        if not beyond.any()
        else "NaN, infinite values or numbers beyond float32's range"
    )
    raise ConfigError(
        f"{where}: {len(rows)} of its {len(numbers)} rows {'holds' if len(rows) == 1 else 'hold'} {what}, "
        f"the first row {int(rows[0])}: a model cannot train on them; drop or fill those rows and save the "
        "dataset again"
    )


def _labels(values: list[Any], where: str) -> tuple[np.ndarray, int | None]:
    if values and isinstance(values[0], str):
        if any(len(v) != 1 for v in values):
            raise ConfigError(f"{where}: a text label is one character (the next one)")
        return _symbols(values, where)[:, 0].astype(np.int64), len(SHAKESPEARE_VOCAB)
    y = class_ids(where, list(values))
    if y.size and y.min() < 0:
        raise ConfigError(f"{where}: class ids count from 0, got {y.min()}")
    return y, None


def _classes(split: Any, label: str, y: np.ndarray, known: int | None) -> int:
    feature = split.features[label]
    return known or getattr(feature, "num_classes", None) or int(y.max()) + 1


def _recipe(section: DataSection, train: Any, input_col: str) -> Recipe:
    """LEAF's rules for making the clients of rows that are not split already: text (windows
    sliding by one) split in order with a window's length - 1 rows between, the rest at random."""
    first = train[0][input_col] if len(train) else None
    gap = len(first) - 1 if isinstance(first, str) else None
    return Recipe.of(section, gap, train_fraction=1 - section.client_test_fraction)


def _clients(
    section: DataSection, train: Any, client_col: str, input_col: str
) -> tuple[np.ndarray, list, list]:
    """The client ids (sorted), each one's rows (in the split's order) and, where fedray splits
    them, the clients LEAF's rules keep: (client, its training rows' positions, its test rows').
    Made once a process for a split as saved (its fingerprint, and its Arrow files as they stand:
    other bytes under the same state.json are made again) and the rules: counted, checked and
    loaded for one run, and again for each run of a sweep."""
    s: HfSettings = data_settings(section)
    recipe = None if s.test_split else _recipe(section, train, input_col)
    key = (getattr(train, "_fingerprint", None), _as_they_stand(train), client_col, recipe)
    if None not in key[:2] and key in _MADE:
        return _MADE[key]
    raw = train[client_col]
    if (missing := next((i for i, c in enumerate(raw) if c is None), None)) is not None:
        raise ConfigError(f"dataset hf {s.name}: column {client_col!r}: row {missing} names no client (null)")
    ids = np.asarray([str(c) for c in raw])
    order = np.argsort(ids, kind="stable")
    names, starts = np.unique(ids[order], return_index=True)
    rows = np.split(order, starts[1:]) if len(names) else []
    if recipe is None:
        made = [(c, np.arange(len(r)), None) for c, r in enumerate(rows)]
    else:
        made = make_clients(
            [np.arange(len(rows))], np.asarray([len(r) for r in rows], dtype=np.int64), recipe
        )
    if None not in key[:2]:
        _MADE[key] = (names, rows, made)
    return names, rows, made


def _as_they_stand(split: Any) -> tuple | None:
    """The Arrow files a split is mapped from, each by its inode, size and times (a write changes
    its ctime, which no tool sets back: `fedray.config.keys.file_digest`); None where one cannot be
    looked at (then nothing is kept)."""
    import os

    stood = []
    for f in getattr(split, "cache_files", None) or []:
        try:
            st = os.stat(f["filename"])
        except (OSError, KeyError, TypeError):
            return None
        stood.append((f["filename"], st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(stood)


# in this process: (a split's fingerprint, its files, its client column, LEAF's rules) -> `_clients`
_MADE: dict[tuple, tuple[np.ndarray, list, list]] = {}


def hf_data(section: DataSection) -> FederatedData:
    """The clients: the rows of ``data.split`` grouped by ``data.client_column``, ids sorted."""
    s: HfSettings = data_settings(section)
    data = _open(section)
    train = _split(section, data, s.split, "data.split")
    client_col, input_col, label_col = _columns(section, train)
    where = f"dataset hf {s.name}"
    x, scale = _inputs(train, input_col, f"{where}: split {s.split!r}, column {input_col!r}")
    y, known = _labels(train[label_col], f"{where}: column {label_col!r}")
    classes = _classes(train, label_col, y, known)
    ids, rows, made = _clients(section, train, client_col, input_col)
    parts = []
    if s.test_split:
        test = _split(section, data, s.test_split, "data.test_split")
        tx, ty = _test_arrays(section, test, (input_col, label_col), (x, scale, classes))
        t_ids = np.asarray([str(c) for c in test[client_col]])
        used = np.isin(t_ids, ids)  # the test rows of clients that train (the others are not read)
        _refuse_training_rows(section, (x, y), (tx[used], ty[used]))
        for c, r in enumerate(rows):
            t = np.flatnonzero(t_ids == ids[c])
            parts.append((ArrayDataset(x[r], y[r]), ArrayDataset(tx[t], ty[t])))
    else:
        for c, tr, te in made:
            keep, held = rows[c][tr], rows[c][te]
            parts.append((ArrayDataset(x[keep], y[keep]), ArrayDataset(x[held], y[held])))
    train_set, test_set, clients = own_splits(parts)
    spec = DataSpec(tuple(x.shape[1:]), classes, scale)
    return FederatedData(Dataset("hf", train_set, test_set, spec), clients, None)


def _test_arrays(
    section: DataSection, test: Any, columns: tuple[str, str], train: tuple
) -> tuple[np.ndarray, np.ndarray]:
    """``data.test_split``'s inputs and labels, refused where one model could not read them as it
    reads the training split's: another shape, another stored type (another scale), a class the
    training split does not have."""
    s: HfSettings = data_settings(section)
    (input_col, label_col), (x, scale, classes) = columns, train
    where = f"dataset hf {s.name}: split {s.test_split!r}"
    tx, tscale = _inputs(test, input_col, f"{where}, column {input_col!r}")
    ty, _ = _labels(test[label_col], f"{where}, column {label_col!r}")
    if tx.shape[1:] != x.shape[1:]:
        raise ConfigError(
            f"{where}: its inputs are {list(tx.shape[1:])}, the training split's {list(x.shape[1:])}"
        )
    if tscale != scale:
        raise ConfigError(
            f"{where}: its inputs are stored as {tx.dtype} and the training split's as {x.dtype}: one model "
            "reads one kind (store both alike)"
        )
    if ty.size and ty.max() >= classes:
        raise ConfigError(f"{where}: label {int(ty.max())} is beyond the training split's {classes} classes")
    return tx, ty


def _refuse_training_rows(section: DataSection, train: tuple, test: tuple) -> None:
    """``data.test_split``'s rows that are training rows (the same input and label as a row of
    ``data.split``): all of them refused (its accuracy would be training accuracy), some said once,
    with how many (its accuracy is partly so)."""
    s: HfSettings = data_settings(section)
    n = len(test[1])
    if not n:
        return
    same = count_seen(set(row_keys(*train)), *test)
    if same == n:
        raise ConfigError(
            f"config key 'data.test_split': the {n} rows of {s.name}'s split {s.test_split!r} are all rows "
            f"of split {s.split!r} (the same input and label): its accuracy would be training accuracy; set "
            "data.test_split to a split of held-out rows, or leave it out (client_test_fraction then holds "
            "out each client's own)"
        )
    if same:
        say_once(
            f"dataset hf {s.name}: {same} of the {n} test rows of split {s.test_split!r} are rows of split "
            f"{s.split!r} too (the same input and label): its test accuracy is partly training accuracy"
        )


def hf_info(section: DataSection) -> DatasetInfo:
    """Shape and classes from the dataset's first rows (memory-mapped: nothing else is read)."""
    s: HfSettings = data_settings(section)
    data = _open(section)
    train = _split(section, data, s.split, "data.split")
    _, input_col, label_col = _columns(section, train)
    x, _ = _inputs(
        train.select(range(min(1, len(train)))),
        input_col,
        f"dataset hf {s.name}: column {input_col!r}",
        finite=False,  # its load reads every row, and says how many
    )
    y, known = _labels(train[:1][label_col], f"dataset hf {s.name}: column {label_col!r}")
    classes = (
        known or getattr(train.features[label_col], "num_classes", None) or int(max(train[label_col])) + 1
    )
    return DatasetInfo(tuple(x.shape[1:]), classes, None)


def count_hf(section: DataSection) -> int:
    """The clients the rows make under this config (those LEAF's rules keep)."""
    s: HfSettings = data_settings(section)
    train = _split(section, _open(section), s.split, "data.split")
    client_col, input_col, _ = _columns(section, train)
    return len(_clients(section, train, client_col, input_col)[2])


def check_hf(section: DataSection, info: DatasetInfo) -> None:
    """The columns are there and the clients are the run's: num_clients their number."""
    s: HfSettings = data_settings(section)
    if not s.test_split and section.client_test_fraction <= 0:
        raise ConfigError(
            "config key 'client_test_fraction': dataset hf's test samples are each client's own: set "
            "client_test_fraction (e.g. 0.1), or data.test_split to a split of the same clients"
        )
    if s.test_split and s.test_split == s.split:
        raise ConfigError(
            f"config key 'data.test_split': {s.test_split!r} is the training split (data.split): the test "
            "samples would be the training ones"
        )
    if s.test_split:
        for key in ("sample_fraction", "min_samples"):
            if getattr(s, key) not in (None, 0):
                raise ConfigError(
                    f"config key 'data.{key}': data.test_split gives each client's test rows, so its clients "
                    "are read as they are (as a folder LEAF split already): leave it out, or data.test_split"
                )
    n = count_hf(section)
    if n == 0:
        raise ConfigError(
            f"config key 'data.client_column': no client of {s.name}'s column {s.client_column!r} "
            "is left by data.sample_fraction, data.min_samples and LEAF's split (a client needs two rows, and "
            "a test row after the split)"
        )
    if n != section.num_clients:
        raise ConfigError(
            f"config key 'num_clients': {s.name}'s column {s.client_column!r} names {n} clients "
            f"(kept by LEAF's rules); set num_clients: {n}, or leave it out (fedray counts them)"
        )
    if section.shift != "none":
        raise ConfigError(
            "config key 'shift': dataset hf's clients are its own; a shift preset does not apply"
        )


register_dataset(
    DatasetKind(
        "hf",
        lambda section: hf_data(section).dataset,
        hf_info,
        settings=HfSettings,
        available=hf_available,
        check_info=check_hf,
        federate=hf_data,
        checks_held_out=True,
        clients_why="its rows name their clients",
        partition_label=lambda config: "hf",
        count_clients=count_hf,
        data_seed=0,
        files=hf_files,
    )
)
