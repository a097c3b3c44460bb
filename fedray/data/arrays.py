"""``dataset: arrays``: a researcher's own data, as arrays in one ``.npz`` file (``data_root``).

The file holds ``x_train``, ``y_train``, ``x_test``, ``y_test`` (inputs of any shape, C x H x W for
images; integer labels 0..C-1) and may hold ``scale`` (stored value * scale = model input, e.g.
1/255 for uint8 images) and ``num_classes``. `from_arrays` writes one from arrays, `from_torch`
from torch Datasets (what ``fedray.from_arrays`` and ``fedray.from_torch`` are): the file is named
by its content, and the run id names the content, not the path, so the same data is the same run
wherever it lies. On Ray the coordinator reads the file on the driver's node and puts the arrays
into the object store, as for every data set.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedray.data.datasets import (
    ArrayDataset,
    Dataset,
    DatasetInfo,
    DatasetKind,
    DatasetMissing,
    DataSpec,
    register_dataset,
)
from fedray.params import read_npz

if TYPE_CHECKING:
    from fedray.config.sections import DataSection

KEYS = ("x_train", "y_train", "x_test", "y_test")


def _header(z: zipfile.ZipFile, key: str) -> tuple[tuple[int, ...], np.dtype]:
    with z.open(f"{key}.npy") as f:
        version = np.lib.format.read_magic(f)
        read = (
            np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        )
        shape, _, dtype = read(f)  # the shape without reading the array
    return tuple(shape), np.dtype(dtype)


def _info(section: DataSection, verify: bool = True) -> DatasetInfo:
    """The file's shapes and classes; with ``verify``, every member read once against its CRC
    (validation, before the run: `_load` reads the file whole, which checks them anyway)."""
    path = Path(section.data_root)
    _available(section)
    try:
        with zipfile.ZipFile(path) as z:
            names = {n.removesuffix(".npy") for n in z.namelist()}
            missing = [k for k in KEYS if k not in names]
            if missing:
                raise ValueError(f"{path}: no {', '.join(missing)} (an arrays file holds {', '.join(KEYS)})")
            shape, _ = _header(z, "x_train")
            damaged = z.testzip() if verify else None
            if damaged is not None:
                raise ValueError(f"{path}: {damaged} is damaged (its CRC-32 does not match its contents)")
    except (OSError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not a readable .npz file ({type(e).__name__}: {e})") from None
    head = read_npz(path, ["num_classes"] if "num_classes" in names else ["y_train"])
    classes = int(head["num_classes"]) if "num_classes" in head else int(head["y_train"].max()) + 1
    return DatasetInfo(shape[1:], classes, shape[0])


def _available(section: DataSection) -> None:
    if not section.data_root:
        raise DatasetMissing(
            "dataset arrays: config key 'data_root' names no file (fedray.from_arrays writes one)"
        )
    if not Path(section.data_root).is_file():
        raise DatasetMissing(f"dataset arrays: config key 'data_root': {section.data_root} is not a file")


def _load(section: DataSection) -> Dataset:
    info = _info(section, verify=False)
    a = read_npz(section.data_root)
    scale = float(a["scale"]) if "scale" in a else 1.0
    for split in ("train", "test"):
        y = a[f"y_{split}"]
        if not np.issubdtype(y.dtype, np.integer) or (
            len(y) and (y.min() < 0 or y.max() >= info.num_classes)
        ):
            raise ValueError(
                f"{section.data_root}: y_{split} must be integer labels 0..{info.num_classes - 1}"
            )
        if a[f"x_{split}"].shape[1:] != info.input_shape:
            raise ValueError(f"{section.data_root}: x_test's inputs are not shaped as x_train's")
    spec = DataSpec(tuple(info.input_shape), info.num_classes, scale=scale)
    train = ArrayDataset(a["x_train"], a["y_train"].astype(np.int64))
    test = ArrayDataset(a["x_test"], a["y_test"].astype(np.int64))
    return Dataset(f"arrays:{Path(section.data_root).name}", train, test, spec)


def _files(section: DataSection) -> tuple[Path, list[Path]]:
    _available(section)
    return Path(section.data_root).parent, [Path(section.data_root)]


register_dataset(DatasetKind("arrays", _load, _info, available=_available, files=_files))


def from_arrays(
    x_train: Any,
    y_train: Any,
    x_test: Any,
    y_test: Any,
    folder: str | Path = ".fedray-data",
    scale: float = 1.0,
    num_classes: int | None = None,
) -> dict[str, str]:
    """Write the arrays to ``folder/arrays-SHA.npz`` (named by its content; kept if there already)
    and return the config keys that choose it: ``{"dataset": "arrays", "data_root": PATH}``."""
    arrays = {
        k: np.ascontiguousarray(np.asarray(v))
        for k, v in zip(KEYS, (x_train, y_train, x_test, y_test), strict=True)
    }
    for split in ("train", "test"):
        if len(arrays[f"x_{split}"]) != len(arrays[f"y_{split}"]):
            raise ValueError(
                f"x_{split} has {len(arrays[f'x_{split}'])} inputs but y_{split} {len(arrays[f'y_{split}'])} labels"
            )
        if not np.issubdtype(arrays[f"y_{split}"].dtype, np.integer):
            raise ValueError(f"y_{split}: integer class labels, got {arrays[f'y_{split}'].dtype}")
    extra = {"scale": np.float64(scale), **({"num_classes": np.int64(num_classes)} if num_classes else {})}
    buf = io.BytesIO()
    np.savez(buf, **arrays, **extra)
    data = buf.getvalue()
    path = Path(folder) / f"arrays-{hashlib.sha256(data).hexdigest()[:16]}.npz"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return {"dataset": "arrays", "data_root": str(path.resolve())}


def from_torch(
    train: Any, test: Any, folder: str | Path = ".fedray-data", num_classes: int | None = None
) -> dict[str, str]:
    """`from_arrays` for two torch Datasets of ``(input tensor, int label)`` pairs (inputs as the
    model takes them: apply the transforms in the Dataset)."""
    import torch

    def stack(ds: Any) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        for x, y in ds:
            xs.append(torch.as_tensor(x).numpy().astype(np.float32))
            ys.append(int(y))
        return np.stack(xs), np.asarray(ys, dtype=np.int64)

    (xtr, ytr), (xte, yte) = stack(train), stack(test)
    return from_arrays(xtr, ytr, xte, yte, folder=folder, num_classes=num_classes)
