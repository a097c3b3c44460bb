"""Datasets as in-memory numpy arrays, and the registry of datasets (`DATASETS`, `register_dataset`).

Images are kept as uint8 ``(N, C, H, W)`` arrays (4x smaller than float32, and what the object
store shares zero-copy with every actor); `DataSpec.to_tensor` turns a batch into floats the way
NIID-Bench's transforms do (docs/algorithms/common.md#data-transforms): ToTensor scaling, optional normalisation, and the
CIFAR training augmentation.
"""

from __future__ import annotations

import dataclasses
import gzip
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedray.config.coercion import ConfigError, suggest
from fedray.config.hparams import settings_from_dict
from fedray.config.keys import DATASET_KEYS, MOVED_TO_DATA

if TYPE_CHECKING:
    from fedray.config.sections import DataSection


class DatasetMissing(FileNotFoundError):
    """The dataset's files are not where the config says; the message says how to get them."""


@dataclass(frozen=True)
class DatasetInfo:
    input_shape: tuple[int, ...]
    num_classes: int
    train_size: int | None  # None when it depends on files we have not read
    normalized: bool = False  # the data set normalises its inputs ((x - mean) / std) before any model


@dataclass(frozen=True)
class DataSpec:
    """How a stored batch becomes a model input."""

    input_shape: tuple[int, ...]
    num_classes: int
    scale: float  # stored value * scale = ToTensor value (1/255 for uint8 images)
    mean: tuple[float, ...] | None = None  # per-channel normalisation after scaling
    std: tuple[float, ...] | None = None
    # "none" | "crop_flip" (reflect-pad 4, random crop, horizontal flip) | "crop_flip_rotate"
    # (the same, then a random rotation in [-15, 15] degrees: CIFAR-100 in NIID-Bench/FedConcat)
    augment: str = "none"

    def to_tensor(
        self, x: np.ndarray, augment: bool = False, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        # np.array copies into a fresh writable float32 array (stored arrays may be read-only views).
        t = torch.from_numpy(np.array(x, dtype=np.float32))
        if self.scale != 1.0:
            t = t * self.scale
        if augment and self.augment in ("crop_flip", "crop_flip_rotate"):
            t = crop_flip(t, generator)
        if augment and self.augment == "crop_flip_rotate":
            t = rotate(t, generator, max_degrees=15.0)
        return self.normalize(t)

    def normalize(self, t: torch.Tensor) -> torch.Tensor:
        """Per-channel (t - mean) / std, where the data set has a normalisation."""
        if self.mean is None or self.std is None:
            return t
        shape = (1, -1) + (1,) * (t.dim() - 2)
        return (t - torch.tensor(self.mean).view(shape)) / torch.tensor(self.std).view(shape)

    def random_inputs(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` inputs with every value i.i.d. uniform over the data's range: U[0, 1) at ToTensor
        scale, then the data set's normalisation (FedConcat-ID's random inputs, eq. F2)."""
        return self.normalize(torch.rand((n, *self.input_shape), generator=generator))


def crop_flip(t: torch.Tensor, generator: torch.Generator | None, pad: int = 4) -> torch.Tensor:
    """Per-sample random crop (after reflect padding) and horizontal flip, vectorised over the batch."""
    b, c, h, w = t.shape
    padded = torch.nn.functional.pad(t, (pad, pad, pad, pad), mode="reflect")
    oy = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    ox = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    flip = torch.rand(b, generator=generator) < 0.5
    rows = (oy[:, None] + torch.arange(h)[None, :])[:, None, :, None]
    cols = ox[:, None] + torch.arange(w)[None, :]
    cols = torch.where(flip[:, None], cols.flip(1), cols)[:, None, None, :]
    return padded[torch.arange(b)[:, None, None, None], torch.arange(c)[None, :, None, None], rows, cols]


def rotate(t: torch.Tensor, generator: torch.Generator | None, max_degrees: float) -> torch.Tensor:
    """Per-sample rotation about the centre by an angle uniform in [-max, max] degrees.

    Nearest-neighbour sampling with zero fill, like torchvision's RandomRotation defaults, but
    one angle per sample and no Python loop (affine_grid + grid_sample over the batch).
    """
    b = t.shape[0]
    angle = (torch.rand(b, generator=generator) * 2 - 1) * max_degrees * torch.pi / 180
    cos, sin = torch.cos(angle), torch.sin(angle)
    zero = torch.zeros(b)
    theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
    grid = torch.nn.functional.affine_grid(theta, list(t.shape), align_corners=False)
    return torch.nn.functional.grid_sample(t, grid, mode="nearest", padding_mode="zeros", align_corners=False)


@dataclass
class ArrayDataset:
    x: np.ndarray
    y: np.ndarray  # int64 class ids

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"{len(self.x)} inputs but {len(self.y)} labels")

    def __len__(self) -> int:
        return len(self.y)


@dataclass
class Dataset:
    name: str
    train: ArrayDataset
    test: ArrayDataset
    spec: DataSpec


# ----------------------------------------------------------------------------------------------------
# Loaders
# ----------------------------------------------------------------------------------------------------


def _digits(section: DataSection) -> Dataset:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = d.data.reshape(-1, 1, 8, 8).astype(np.uint8)  # pixel values 0..16
    # A fixed stratified 70/30 split, independent of the run seed: every run sees the same test set.
    xtr, xte, ytr, yte = train_test_split(
        x, d.target.astype(np.int64), test_size=0.3, random_state=0, stratify=d.target
    )
    spec = DataSpec((1, 8, 8), 10, scale=1.0 / 16.0)
    return Dataset("digits", ArrayDataset(xtr, ytr), ArrayDataset(xte, yte), spec)


def _synthetic(section: DataSection) -> Dataset:
    """Gaussian class clusters in [0, 1], a small learnable task for tests and smoke runs."""
    shape = tuple(section.synthetic_shape)
    classes = 10
    # Fixed generator: the data set is part of the problem, not of the run's randomness.
    g = np.random.default_rng(12345)
    means = g.uniform(0.2, 0.8, size=(classes, *shape))

    def draw(n: int) -> ArrayDataset:
        y = g.integers(0, classes, size=n).astype(np.int64)
        x = np.clip(means[y] + g.normal(0, 0.25, size=(n, *shape)), 0, 1).astype(np.float32)
        return ArrayDataset(x, y)

    train, test = draw(section.synthetic_size), draw(max(10, section.synthetic_size // 4))
    return Dataset("synthetic", train, test, DataSpec(shape, classes, scale=1.0))


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (the MNIST family's format), gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {data[:4].hex()})")
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {dims} but holds {arr.size} bytes (truncated?)")
    return arr.reshape(dims)


FMNIST_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}


def _find_idx(root: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        for folder in (root, root / "FashionMNIST" / "raw"):
            if (folder / name).is_file():
                return folder / name
    return None


def _fmnist(section: DataSection) -> Dataset:
    root = Path(section.resolved_data_root())
    found = {k: _find_idx(root, stem) for k, stem in FMNIST_FILES.items()}
    if any(p is None for p in found.values()):
        if not section.download:
            raise DatasetMissing(_fmnist_missing_message(root))
        from torchvision.datasets import FashionMNIST

        for train in (True, False):
            FashionMNIST(str(root), train=train, download=True)
        found = {k: _find_idx(root, stem) for k, stem in FMNIST_FILES.items()}
    arrays = {k: read_idx(p) for k, p in found.items()}  # type: ignore[arg-type]
    spec = DataSpec((1, 28, 28), 10, scale=1.0 / 255.0)
    return Dataset(
        "fmnist",
        ArrayDataset(arrays["train_x"][:, None], arrays["train_y"].astype(np.int64)),
        ArrayDataset(arrays["test_x"][:, None], arrays["test_y"].astype(np.int64)),
        spec,
    )


def _fmnist_missing_message(root: Path) -> str:
    return (
        f"dataset fmnist: no Fashion-MNIST IDX files in data_root={str(root)!r} "
        f"(looked for {', '.join(FMNIST_FILES.values())}, optionally .gz). "
        "Install them with `apt-get install dataset-fashion-mnist` (Debian/Ubuntu; files land in "
        f"{'/usr/share/datasets/fashion-mnist'}), point data_root at a folder holding them, "
        "or set download=true to fetch them with torchvision (needs internet)."
    )


@dataclass(frozen=True)
class TorchvisionSpec:
    cls_name: str
    marker: str  # a path under data_root that exists once the data set is there
    split_kwargs: Callable[[bool, DataSection], dict]
    info: Callable[[DataSection], DatasetInfo]
    spec: Callable[[DataSection], DataSpec]


_EMNIST_CLASSES = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 27, "digits": 10, "mnist": 10}
_EMNIST_TRAIN = {
    "byclass": 697932,
    "bymerge": 697932,
    "balanced": 112800,
    "letters": 124800,
    "digits": 240000,
    "mnist": 60000,
}
_CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
_CIFAR100_STD = (0.2673, 0.2564, 0.2762)

TORCHVISION: dict[str, TorchvisionSpec] = {
    "mnist": TorchvisionSpec(
        "MNIST",
        "MNIST/raw",
        lambda train, section: {"train": train},
        lambda section: DatasetInfo((1, 28, 28), 10, 60000),
        lambda section: DataSpec((1, 28, 28), 10, 1 / 255),
    ),
    "emnist": TorchvisionSpec(
        "EMNIST",
        "EMNIST/raw",
        lambda train, section: {"train": train, "split": section.emnist_split},
        lambda section: DatasetInfo(
            (1, 28, 28), _EMNIST_CLASSES[section.emnist_split], _EMNIST_TRAIN[section.emnist_split]
        ),
        lambda section: DataSpec((1, 28, 28), _EMNIST_CLASSES[section.emnist_split], 1 / 255),
    ),
    "cifar10": TorchvisionSpec(
        "CIFAR10",
        "cifar-10-batches-py",
        lambda train, section: {"train": train},
        lambda section: DatasetInfo((3, 32, 32), 10, 50000),
        lambda section: DataSpec((3, 32, 32), 10, 1 / 255, augment="crop_flip"),
    ),
    "cifar100": TorchvisionSpec(
        "CIFAR100",
        "cifar-100-python",
        lambda train, section: {"train": train},
        lambda section: DatasetInfo((3, 32, 32), 100, 50000),
        lambda section: DataSpec(
            (3, 32, 32), 100, 1 / 255, _CIFAR100_MEAN, _CIFAR100_STD, augment="crop_flip_rotate"
        ),
    ),
    "svhn": TorchvisionSpec(
        "SVHN",
        "train_32x32.mat",
        lambda train, section: {"split": "train" if train else "test"},
        lambda section: DatasetInfo((3, 32, 32), 10, 73257),
        lambda section: DataSpec((3, 32, 32), 10, 1 / 255),
    ),
}


def _as_nchw(data: object, name: str) -> np.ndarray:
    x = data.numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
    if x.ndim == 3:  # (N, H, W) grey images
        x = x[:, None]
        if name == "emnist":
            # EMNIST's stored images are transposed relative to MNIST; flip them upright.
            x = x.transpose(0, 1, 3, 2)
    elif name in ("cifar10", "cifar100"):  # stored as (N, H, W, C)
        x = x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x, dtype=np.uint8)


def _torchvision_loader(name: str) -> Callable[[DataSection], Dataset]:
    def load(section: DataSection) -> Dataset:
        import torchvision.datasets as tvd

        tv = TORCHVISION[name]
        root = section.resolved_data_root()
        cls = getattr(tvd, tv.cls_name)
        parts = []
        for train in (True, False):
            try:
                ds = cls(root, download=section.download, **tv.split_kwargs(train, section))
            except RuntimeError as e:
                raise DatasetMissing(_torchvision_missing_message(name, root, str(e))) from None
            labels = getattr(ds, "targets", None)
            if labels is None:
                labels = ds.labels
            labels = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
            parts.append(ArrayDataset(_as_nchw(ds.data, name), labels.astype(np.int64)))
        return Dataset(name, parts[0], parts[1], tv.spec(section))

    return load


def _torchvision_missing_message(name: str, root: str, detail: str = "") -> str:
    tv = TORCHVISION[name]
    return (
        f"dataset {name}: not found under data_root={root!r} (torchvision's {tv.cls_name} layout, e.g. "
        f"{root}/{tv.marker}){': ' + detail if detail else ''}. Set download=true to fetch it with torchvision "
        "(needs internet), or point data_root at a folder that holds it."
    )


# ----------------------------------------------------------------------------------------------------
# The registry
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetKind:
    """One value of config key ``dataset``: how it is loaded, described and checked. Every hook
    takes the run's data section (`fedray.config.sections.DataSection`: the dataset's keys, the
    partition's, the seeds), written ``section`` below; a whole `Config` has every key it holds,
    so a hook written against one reads either."""

    name: str
    load: Callable[[DataSection], Dataset]
    # shape, classes and size without reading it (config validation)
    info: Callable[[DataSection], DatasetInfo]
    # The config keys it reads that other datasets do not (emnist_split): such a key set with
    # another dataset is refused when the config is built.
    keys: tuple[str, ...] = ()
    # (section) -> None: raises DatasetMissing (cheaply) where its files are not there, unless download
    # is set; None: always there (built in). Optional.
    available: Callable[[DataSection], None] | None = None
    # (section) -> None: the checks of its keys; raises ConfigError naming the key. Optional.
    check: Callable[[DataSection], None] | None = None
    # (section, info) -> None: checks that need its `info` first (client_files: as many clients as
    # files); raises ConfigError naming the key. Optional.
    check_info: Callable[[DataSection, DatasetInfo], None] | None = None
    # (section) -> FederatedData: a data set that comes with its clients (client_files: its files are
    # the clients) builds them here, instead of load + a partition drawn over it; no partition key
    # is read then, and a config that sets one is told ``clients_why``.
    federate: Callable[[DataSection], Any] | None = None
    clients_why: str = "it comes with its own clients"
    # How reports name the partition of its runs (client_files: "files:FOLDER"), from the config mapping.
    partition_label: Callable[[Mapping[str, Any]], str] | None = None
    # (section) -> how many clients it makes from the config (LEAF: the users its filters keep), which
    # num_clients then is where the user leaves it out. Optional: None, num_clients is the user's.
    count_clients: Callable[[DataSection], int] | None = None
    # The data seed of its runs where config key data_seed is null (`data_seed`): a data set that is
    # read rather than drawn (LEAF, hf, client_files) fixes one, so the run's seed varies training
    # only; None: the run's seed, as before data_seed existed.
    data_seed: int | None = None
    # (section) -> (folder, files): the files it reads, which a run records by their content
    # (`fedray.data.identity`) so that it goes on from a checkpoint, or counts as finished, only on
    # those same files; raises DatasetMissing where they are not there. None: nothing is read from
    # files the user can change (made from the config: digits, synthetic), nothing recorded.
    files: Callable[[DataSection], tuple[Path, list[Path]]] | None = None
    # Its own settings (config key data.NAME), a dataclass with a default for every field and bounds
    # declared as an algorithm's Hparams declare theirs (fedray.config.hparams); None: it has none.
    settings: type | None = None
    # Its loader refuses a test set that is its training set itself, naming its own keys (hf, LEAF):
    # the check every data set gets (`fedray.data.held_out`) then leaves its test set out.
    checks_held_out: bool = False

    @property
    def own_clients(self) -> bool:
        """Whether it comes with its clients (``federate``): no partition is drawn over it."""
        return self.federate is not None

    def make_settings(self, values: Mapping[str, Any]) -> Any:
        """Its settings from the config's ``data`` values, checked (`settings_from_dict`)."""
        if self.settings is None:
            if values:
                raise ConfigError.of(
                    [
                        f"unknown config key 'data.{k}' for dataset {self.name} (it has no data keys)"
                        for k in values
                    ]
                )
            return None
        return settings_from_dict(self.settings, values, "data", f"dataset {self.name}")

    @property
    def flat_keys(self) -> tuple[str, ...]:
        """The flat config keys it reads: its ``keys``, and those that moved into its settings
        (`fedray.config.keys.MOVED_TO_DATA`: leaf_min_samples is LEAF's data.min_samples now)."""
        fields = {f.name for f in dataclasses.fields(self.settings)} if self.settings is not None else set()
        return (*self.keys, *(flat for flat, (new, _) in MOVED_TO_DATA.items() if new in fields))


DATASETS: dict[str, DatasetKind] = {}


def register_dataset(kind: DatasetKind) -> DatasetKind:
    """Add a dataset, which ``dataset: NAME`` then chooses (the built-ins are added the same way)."""
    if kind.name in DATASETS:
        raise ValueError(f"dataset {kind.name!r} is registered already")
    for key in kind.keys:  # its own keys: other datasets refuse them, so none that all datasets read
        if key not in DATASET_KEYS:
            raise ValueError(
                f"dataset {kind.name!r}: {key!r} is not a config key of its own: a dataset's own keys "
                f"are its settings (data.NAME), or of the flat ones, {', '.join(DATASET_KEYS)}"
            )
    DATASETS[kind.name] = kind
    return kind


def _check_synthetic(section: DataSection) -> None:
    shape = section.synthetic_shape
    if not (len(shape) in (1, 3) and all(s >= 1 for s in shape)):
        raise ConfigError(
            f"config key 'synthetic_shape': must be [D] or [C, H, W] with positive sizes, got {shape}"
        )


def _check_emnist(section: DataSection) -> None:
    allowed = sorted(_EMNIST_CLASSES)
    if section.emnist_split not in allowed:
        raise ConfigError(
            f"config key 'emnist_split': unknown value {section.emnist_split!r}{suggest(section.emnist_split, allowed)} "
            f"(allowed: {', '.join(allowed)})"
        )


def _fmnist_available(section: DataSection) -> None:
    root = Path(section.resolved_data_root())
    if any(_find_idx(root, stem) is None for stem in FMNIST_FILES.values()):
        raise DatasetMissing(_fmnist_missing_message(root))


def _fmnist_files(section: DataSection) -> tuple[Path, list[Path]]:
    _fmnist_available(section)
    root = Path(section.resolved_data_root())
    return root, [_find_idx(root, stem) for stem in FMNIST_FILES.values()]  # type: ignore[misc]


def _torchvision_files(name: str) -> Callable[[DataSection], tuple[Path, list[Path]]]:
    """The files torchvision's class reads for both splits, named as the class names them."""

    def files(section: DataSection) -> tuple[Path, list[Path]]:
        import torchvision.datasets as tvd

        root = Path(section.resolved_data_root())
        cls = getattr(tvd, TORCHVISION[name].cls_name)
        if name in ("mnist", "emnist"):  # the IDX files in its raw folder
            splits = ("train", "t10k") if name == "mnist" else ("train", "test")
            stems = [s if name == "mnist" else f"emnist-{section.emnist_split}-{s}" for s in splits]
            names = [
                f"{cls.__name__}/raw/{stem}-{what}"
                for stem in stems
                for what in ("images-idx3-ubyte", "labels-idx1-ubyte")
            ]
        elif name == "svhn":
            names = [cls.split_list[split][1] for split in ("train", "test")]
        else:  # CIFAR: its batches and its meta file in its folder
            listed = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
            names = [f"{cls.base_folder}/{f}" for f in listed]
        missing = [n for n in names if not (root / n).is_file()]
        if missing:
            raise DatasetMissing(_torchvision_missing_message(name, str(root), f"{missing[0]} is not there"))
        return root, [root / n for n in names]

    return files


def _torchvision_available(name: str) -> Callable[[DataSection], None]:
    def available(section: DataSection) -> None:
        root = Path(section.resolved_data_root())
        if not (root / TORCHVISION[name].marker).exists():
            raise DatasetMissing(_torchvision_missing_message(name, str(root)))

    return available


register_dataset(DatasetKind("digits", _digits, lambda section: DatasetInfo((1, 8, 8), 10, 1257)))
register_dataset(
    DatasetKind(
        "synthetic",
        _synthetic,
        lambda section: DatasetInfo(tuple(section.synthetic_shape), 10, section.synthetic_size),
        keys=("synthetic_size", "synthetic_shape"),
        check=_check_synthetic,
    )
)
register_dataset(
    DatasetKind(
        "fmnist",
        _fmnist,
        lambda section: DatasetInfo((1, 28, 28), 10, 60000),
        available=_fmnist_available,
        files=_fmnist_files,
    )
)
_TORCHVISION_KEYS: dict[str, dict[str, Any]] = {"emnist": {"keys": ("emnist_split",), "check": _check_emnist}}
for _name, _tv in TORCHVISION.items():
    register_dataset(
        DatasetKind(
            _name,
            _torchvision_loader(_name),
            _tv.info,
            available=_torchvision_available(_name),
            files=_torchvision_files(_name),
            **_TORCHVISION_KEYS.get(_name, {}),
        )
    )


def data_seed(section: DataSection) -> int:
    """The seed of what makes the run's data (its partition's draw, the clients' test splits, LEAF's
    sampling and split): config key data_seed, else the dataset's own (`DatasetKind.data_seed`),
    else the run's seed."""
    if section.data_seed is not None:
        return section.data_seed
    kind = DATASETS.get(section.dataset)
    return kind.data_seed if kind is not None and kind.data_seed is not None else section.seed


def data_settings(section: DataSection) -> Any:
    """The run's dataset's own settings (config key data.NAME, `DatasetKind.settings`), checked."""
    return DATASETS[section.dataset].make_settings(section.data)


def dataset_info(section: DataSection) -> DatasetInfo:
    """Shape, classes and size of a dataset without reading it (for config validation)."""
    return DATASETS[section.dataset].info(section)


def check_available(section: DataSection) -> None:
    """Raise DatasetMissing now (cheaply) rather than after Ray and the actors have started."""
    available = DATASETS[section.dataset].available
    if not section.download and available is not None:
        available(section)


def load_dataset(section: DataSection) -> Dataset:
    return DATASETS[section.dataset].load(section)


def train_labels(section: DataSection) -> tuple[np.ndarray, int]:
    """The training labels and the number of classes, read as cheaply as the dataset allows
    (Fashion-MNIST: its labels file alone; the others: the dataset)."""
    if section.dataset == "fmnist":
        path = _find_idx(Path(section.resolved_data_root()), FMNIST_FILES["train_y"])
        if path is not None:
            return read_idx(path).astype(np.int64), 10
    ds = load_dataset(section)
    return ds.train.y, ds.spec.num_classes
