"""The FMNIST-C clients of LINs-lab/FedRC (commit ce79229), drawn by its own generator and written
as a ``client_files`` folder, so fedray (and, through the same files, the reference) trains on the
same clients.

    fedray reference fedrc --checkout PATH --output DIR [--seed S] [--python PY]

1. The generator (``create_c/make_fmnist_c.py``) runs unchanged under the reference's Python
   (``--python``: an environment with its dependencies, Wand with ImageMagick among them) through
   `jobs.reference.fedrc_generate`, seeded with ``--seed``, in ``DIR/reference/generated/``; it writes
   300 training clients of 200 Fashion-MNIST images (label-skewed by Dirichlet(1.0 * class
   frequencies)) and 3 test clients (the 10,000 test images under each of the three concepts).
2. `convert` reads the generator's pickles once (a restricted unpickler: plain dicts of NumPy
   arrays and numbers, nothing else can load) and writes ``DIR/clients/`` (`fedray.data.client_files`):
   ``client_NNNN.npz`` per training client and ``test_client_000{0,1,2}.npz``, each split 90% / 10%
   into x_train / x_test as the reference splits them (its rule, ``int(0.9 n)`` shuffled samples to
   training; the draw is ours and written down, since the reference's is unseeded), with ``group``,
   the client's concept (0: labels as they are, 1: 9 - y, 2: (y + 1) mod 10) and ``reference_type``,
   the generator's own role code (0 clean, 1 corrupted, 2 / 3 the two label maps, 4 / 5 both).
   ``meta.json`` gives the reference's input scaling (1/255, then mean 0.1307, std 0.3081).

Then ``dataset: client_files`` with ``data_root: DIR/clients`` runs the clients in fedray (see
``jobs/configs/fedrc_fmnist_c_reference.yaml``).
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np

from fedray.data import client_files
from jobs.reference.harness import ReferenceError
from jobs.reference.niid_bench import write_fmnist_raw

REPO, COMMIT = "LINs-lab/FedRC", "ce79229"
GENERATOR = Path("create_c") / "make_fmnist_c.py"
NUM_CLIENTS, NUM_TEST_CLIENTS = 300, 3
TRAIN_PORTION = 0.9  # the reference's split_train_val_test
# The generator's role codes -> the concept (label map) each client's labels follow.
CONCEPT_OF_TYPE = {0: 0, 1: 0, 2: 1, 3: 2, 4: 1, 5: 2}
META = {"num_classes": 10, "input_shape": [1, 28, 28], "scale": 1 / 255, "mean": [0.1307], "std": [0.3081]}


class _ArraysOnly(pickle.Unpickler):
    """Unpickles the generator's client dicts and nothing else: NumPy arrays, dtypes and scalars."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str):  # noqa: ANN201 - pickle's signature
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed (only NumPy arrays and numbers)")
        return super().find_class(module, name)


def read_generated(path: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """(images n x 28 x 28 uint8, labels n, type) of one of the generator's client files."""
    try:
        with open(path, "rb") as f:
            obj = _ArraysOnly(io.BytesIO(f.read())).load()
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError) as e:
        raise ReferenceError(f"{str(path)!r}: not one of FedRC's generated client files ({e})") from None
    if not isinstance(obj, dict) or not {"images", "labels", "type"} <= set(obj):
        raise ReferenceError(f"{str(path)!r}: expected a dict with images, labels and type")
    x, y = np.asarray(obj["images"]), np.asarray(obj["labels"])
    if x.dtype != np.uint8 or x.ndim != 3 or x.shape[1:] != (28, 28) or y.shape != (len(x),):
        raise ReferenceError(
            f"{str(path)!r}: images must be n x 28 x 28 uint8 with n labels, got {x.dtype} {list(x.shape)} "
            f"and {list(y.shape)} labels"
        )
    return x, y.astype(np.int64), int(obj["type"])


def split(n: int, seed: int, client: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference's split of a client's n samples (int(0.9 n) shuffled samples train, the rest
    test), drawn from (seed, client) so it is the same every time."""
    order = np.random.default_rng([seed, client]).permutation(n)
    k = int(TRAIN_PORTION * n)
    return np.sort(order[:k]), np.sort(order[k:])


def _client(x: np.ndarray, y: np.ndarray, seed: int, index: int, **extra) -> dict[str, np.ndarray]:
    tr, te = split(len(y), seed, index)
    return {"x_train": x[tr], "y_train": y[tr], "x_test": x[te], "y_test": y[te], **extra}


def convert(generated: Path, dst: Path, seed: int) -> Path:
    """``generated`` (the generator's ``{i}.pkl`` and ``test-{j}.pkl``) as a client_files folder."""
    missing = [n for n in [*(f"{i}.pkl" for i in range(NUM_CLIENTS)),
                           *(f"test-{j}.pkl" for j in range(1, NUM_TEST_CLIENTS + 1))]
               if not (generated / n).is_file()]  # fmt: skip
    if missing:
        raise ReferenceError(
            f"{str(generated)!r}: the generator's {missing[0]} is missing ({len(missing)} files)"
        )
    clients = []
    for i in range(NUM_CLIENTS):
        x, y, t = read_generated(generated / f"{i}.pkl")
        if t not in CONCEPT_OF_TYPE:
            raise ReferenceError(f"{str(generated / f'{i}.pkl')!r}: unknown type {t}")
        clients.append(_client(x, y, seed, i, group=np.int64(CONCEPT_OF_TYPE[t]), reference_type=np.int64(t)))
    tests = []
    for j in range(NUM_TEST_CLIENTS):  # test-1, -2, -3: types 0, 1, 2 are the three concepts
        x, y, t = read_generated(generated / f"test-{j + 1}.pkl")
        tests.append(_client(x, y, seed, NUM_CLIENTS + j, group=np.int64(t)))
    return client_files.write(dst, clients, META, tests)


def generate(checkout: Path, out: Path, seed: int, python: str) -> Path:
    """Run the reference's generator (seeded, unchanged) in ``out/reference/generated``; returns the
    folder its pickles are in. Skipped when they are all there."""
    if not (checkout / GENERATOR).is_file():
        raise ReferenceError(f"{str(checkout)!r} has no {GENERATOR}: not a {REPO} checkout")
    work = out / "reference" / "generated"
    data = work / "data" / "fmnist-c"
    if all((data / f"{i}.pkl").is_file() for i in range(NUM_CLIENTS)) and (data / "test-3.pkl").is_file():
        return data
    write_fmnist_raw(data / "origin" / "FashionMNIST" / "raw")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    log = work / "generator.log"
    with open(log, "w") as f:
        p = subprocess.run([python, "-m", "jobs.reference.fedrc_generate", "--checkout", str(checkout),
                            "--seed", str(seed)], cwd=work, env=env, stdout=f, stderr=subprocess.STDOUT)  # fmt: skip
    if p.returncode != 0:
        tail = log.read_text()[-2000:]
        raise ReferenceError(f"{REPO}'s generator failed (exit {p.returncode}; {log}):\n{tail}")
    return data


def main(checkout: Path, out: Path, seed: int, python: str | None) -> Path:
    generated = generate(checkout, out, seed, python or sys.executable)
    return convert(generated, out / "clients", seed)
