"""A federated dataset that comes as one file per client (``dataset: client_files``).

``data_root`` holds, all written with NumPy (``numpy.savez``; read with ``allow_pickle=False``, so a
data folder can never run code)::

    meta.json              {"num_classes": 10, "input_shape": [1, 28, 28],
                            "scale": 0.00392156862745098,        # stored value * scale = model input before
                            "mean": [0.1307], "std": [0.3081]}   # normalisation (optional, per channel)
    client_0000.npz        x_train, y_train (a client that trains), and optionally x_test, y_test (its own
    client_0001.npz        test split: local_accuracy) and group (a scalar: its ground-truth cluster)
    ...
    test_client_0000.npz   a client that never trains (FedRC's test clients): x_train, y_train (the
    ...                    labelled part it adapts on), x_test, y_test (the part it is scored on)
    global_test.npz        optional: x, y, the global test set (``accuracy``); without it, the test
                           clients' mean gives ``accuracy``

Clients are numbered 0 .. N-1 in file order (training clients first, then test clients); every
``client_NNNN`` from 0000 up must be there. Images are ``(n, C, H, W)`` (or ``(n, H, W)`` for one
channel), uint8 or float32, all of ``input_shape``; labels are integers in [0, num_classes). A bad
file is a `ClientFilesError` naming the file; it is raised while the config is validated when it
can be (meta.json, the files' names) and when the data is read otherwise (before any actor starts).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

META = "meta.json"
_TRAIN = re.compile(r"client_(\d{4,})\.npz$")
_TEST = re.compile(r"test_client_(\d{4,})\.npz$")


class ClientFilesError(ValueError):
    """The client files cannot be used; the message names the file."""


@dataclass(frozen=True)
class Meta:
    num_classes: int
    input_shape: tuple[int, ...]
    scale: float = 1.0
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None


@dataclass
class ClientArrays:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    group: int = -1


def read_meta(root: str | Path) -> Meta:
    p = Path(root) / META
    if not p.is_file():
        raise ClientFilesError(
            f"dataset client_files: {str(p)!r} does not exist (data_root must hold {META} and client files)"
        )
    try:
        doc = json.loads(p.read_text())
        meta = Meta(
            int(doc["num_classes"]),
            tuple(int(s) for s in doc["input_shape"]),
            float(doc.get("scale", 1.0)),
            tuple(doc["mean"]) if doc.get("mean") is not None else None,
            tuple(doc["std"]) if doc.get("std") is not None else None,
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ClientFilesError(
            f"dataset client_files: {str(p)!r} must be JSON with num_classes and input_shape ({type(e).__name__}: {e})"
        ) from None
    if meta.num_classes < 1 or len(meta.input_shape) not in (1, 3) or min(meta.input_shape) < 1:
        raise ClientFilesError(
            f"dataset client_files: {str(p)!r}: num_classes >= 1 and input_shape [C, H, W] or [D]"
        )
    return meta


def client_paths(root: str | Path) -> tuple[list[Path], list[Path]]:
    """The training clients' and the test clients' files, in client order; gaps are errors."""
    root = Path(root)
    found: dict[str, dict[int, Path]] = {"train": {}, "test": {}}
    for p in root.iterdir():
        m = _TEST.fullmatch(p.name) or _TRAIN.fullmatch(p.name)
        if m:
            found["test" if p.name.startswith("test_") else "train"][int(m.group(1))] = p
    out = []
    for kind, name in (("train", "client"), ("test", "test_client")):
        ids = sorted(found[kind])
        missing = sorted(set(range(len(ids))) - set(ids))
        if missing:
            raise ClientFilesError(
                f"dataset client_files: {str(root / f'{name}_{missing[0]:04d}.npz')!r} is missing "
                f"({name} files are numbered from 0000 without gaps)"
            )
        out.append([found[kind][i] for i in ids])
    if not out[0]:
        raise ClientFilesError(f"dataset client_files: no client_NNNN.npz in {str(root)!r}")
    return out[0], out[1]


def _images(p: Path, key: str, a: np.ndarray, meta: Meta) -> np.ndarray:
    if a.dtype not in (np.uint8, np.float32):
        raise ClientFilesError(f"{str(p)!r}: {key} must be uint8 or float32, got {a.dtype}")
    if len(meta.input_shape) == 3 and meta.input_shape[0] == 1 and a.ndim == 3:
        a = a[:, None]
    if tuple(a.shape[1:]) != meta.input_shape:
        raise ClientFilesError(
            f"{str(p)!r}: {key} has samples of shape {list(a.shape[1:])}, but meta.json's input_shape is "
            f"{list(meta.input_shape)}"
        )
    return a


def read_client(p: Path, meta: Meta, test_client: bool) -> ClientArrays:
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise ClientFilesError(f"{str(p)!r} is not a NumPy .npz file without pickles: {e}") from None
    need = {"x_train", "y_train"} | ({"x_test", "y_test"} if test_client else set())
    missing = sorted(need - set(arrays))
    if missing:
        raise ClientFilesError(
            f"{str(p)!r}: missing array(s) {', '.join(missing)} (has {', '.join(sorted(arrays))})"
        )
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise ClientFilesError(f"{str(p)!r}: x_test and y_test come together")
    out = {}
    for split in ("train", "test"):
        if f"x_{split}" not in arrays:
            out[split] = (
                np.zeros((0, *meta.input_shape), dtype=arrays["x_train"].dtype),
                np.zeros(0, np.int64),
            )
            continue
        x = _images(p, f"x_{split}", arrays[f"x_{split}"], meta)
        y = arrays[f"y_{split}"]
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
            raise ClientFilesError(
                f"{str(p)!r}: y_{split} must be a 1-D array of integer labels, got {y.dtype} {list(y.shape)}"
            )
        if len(x) != len(y):
            raise ClientFilesError(
                f"{str(p)!r}: x_{split} has {len(x)} samples but y_{split} has {len(y)} labels"
            )
        bad = y[(y < 0) | (y >= meta.num_classes)]
        if len(bad):
            raise ClientFilesError(
                f"{str(p)!r}: y_{split} has label {int(bad[0])}, outside 0 .. {meta.num_classes - 1} (meta.json's num_classes)"
            )
        out[split] = (x, y.astype(np.int64))
    if len(out["train"][1]) == 0:
        raise ClientFilesError(f"{str(p)!r}: the client has no training samples (x_train is empty)")
    if test_client and len(out["test"][1]) == 0:
        raise ClientFilesError(f"{str(p)!r}: a test client needs samples to be scored on (x_test is empty)")
    group = int(arrays["group"]) if "group" in arrays else -1
    return ClientArrays(*out["train"], *out["test"], group)


def read_global_test(root: Path, meta: Meta) -> tuple[np.ndarray, np.ndarray] | None:
    p = root / "global_test.npz"
    if not p.is_file():
        return None
    try:
        with np.load(p, allow_pickle=False) as z:
            x, y = z["x"], z["y"]
    except (OSError, ValueError, KeyError) as e:
        raise ClientFilesError(f"{str(p)!r}: expected arrays x and y ({type(e).__name__}: {e})") from None
    x = _images(p, "x", x, meta)
    if len(x) != len(y) or y.ndim != 1:
        raise ClientFilesError(f"{str(p)!r}: x has {len(x)} samples but y has {len(y)} labels")
    return x, y.astype(np.int64)


def write(
    root: str | Path,
    clients: list[dict[str, np.ndarray]],
    meta: dict,
    test_clients: list[dict[str, np.ndarray]] = (),
    global_test: tuple[np.ndarray, np.ndarray] | None = None,
) -> Path:
    """Write a client_files folder (for converters and tests): ``clients`` and ``test_clients``
    are dicts of the arrays above."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / META).write_text(json.dumps(meta))
    for i, c in enumerate(clients):
        np.savez(root / f"client_{i:04d}.npz", **c)
    for i, c in enumerate(test_clients):
        np.savez(root / f"test_client_{i:04d}.npz", **c)
    if global_test is not None:
        np.savez(root / "global_test.npz", x=global_test[0], y=global_test[1])
    return root
