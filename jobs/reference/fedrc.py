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
   ``meta.json`` gives the scaling to [0, 1] (1/255); the model ``fedrc_cnn`` then normalises with
   the reference's mean 0.1307 and std 0.3081 (a model that normalises itself on data that is
   normalised already is refused by config validation).

Then ``dataset: client_files`` with ``data_root: DIR/clients`` runs the clients in fedray (see
``jobs/configs/fedrc_fmnist_c_reference.yaml``).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np

from fedray.config.keys import Config
from fedray.records import rec
from jobs.reference.niid_bench import write_fmnist_raw
from jobs.reference.record import Option, Reference, ReferenceError

# fedray.algorithms, .data, .results and the harness: imported where used (the CLI reads FEDRC)

REPO, COMMIT = "LINs-lab/FedRC", "ce79229"
GENERATOR = Path("create_c") / "make_fmnist_c.py"
NUM_CLIENTS, NUM_TEST_CLIENTS = 300, 3
TRAIN_PORTION = 0.9  # the reference's split_train_val_test
# The generator's role codes -> the concept (label map) each client's labels follow.
CONCEPT_OF_TYPE = {0: 0, 1: 0, 2: 1, 3: 2, 4: 1, 5: 2}
# Scaled to [0, 1] only: the model (fedrc_cnn, the reference's FemnistCNN) normalises with the
# reference's mean 0.1307 and std 0.3081 itself, as the reference's SubFEMNISTC transform does.
META = {"num_classes": 10, "input_shape": [1, 28, 28], "scale": 1 / 255}


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


def check_count(n: int, total: int) -> None:
    if not 1 <= n <= total:
        raise ReferenceError(f"--clients {n}: between 1 and the generator's {total}")


def keep(types: list[int], n: int) -> list[int]:
    """The generated clients a run on ``n`` of the 300 keeps: each role (type) in proportion (the
    lowest-numbered clients of each type; shares rounded by largest remainder, ties to the lower
    type), in the generator's order. 300 keeps them all; 60 keeps 12/12/12/12/6/6 of the
    60/60/60/60/30/30."""
    check_count(n, len(types))
    kinds = sorted(set(types))
    counts = {t: types.count(t) for t in kinds}
    share = {t: counts[t] * n / len(types) for t in kinds}
    quota = {t: int(share[t]) for t in kinds}
    for t in sorted(kinds, key=lambda t: (-(share[t] - quota[t]), t))[: n - sum(quota.values())]:
        quota[t] += 1
    taken = {t: 0 for t in kinds}
    out = []
    for i, t in enumerate(types):
        if taken[t] < quota[t]:
            taken[t] += 1
            out.append(i)
    return out


def convert(generated: Path, dst: Path, seed: int, clients: int = NUM_CLIENTS) -> Path:
    """``generated`` (the generator's ``{i}.pkl`` and ``test-{j}.pkl``) as a client_files folder;
    ``clients`` < 300 keeps that many, each role in proportion (`keep`). Each file records the
    generated client it is (``reference_client``), and its 90/10 split is that client's."""
    from fedray.data import client_files

    missing = [
        n
        for n in [
            *(f"{i}.pkl" for i in range(NUM_CLIENTS)),
            *(f"test-{j}.pkl" for j in range(1, NUM_TEST_CLIENTS + 1)),
        ]
        if not (generated / n).is_file()
    ]
    if missing:
        raise ReferenceError(
            f"{str(generated)!r}: the generator's {missing[0]} is missing ({len(missing)} files)"
        )
    read = []
    for i in range(NUM_CLIENTS):
        x, y, t = read_generated(generated / f"{i}.pkl")
        if t not in CONCEPT_OF_TYPE:
            raise ReferenceError(f"{str(generated / f'{i}.pkl')!r}: unknown type {t}")
        read.append((x, y, t))
    chosen = keep([t for _, _, t in read], clients)
    out = [
        _client(
            read[i][0],
            read[i][1],
            seed,
            i,
            group=np.int64(CONCEPT_OF_TYPE[read[i][2]]),
            reference_type=np.int64(read[i][2]),
            reference_client=np.int64(i),
        )
        for i in chosen
    ]
    tests = []
    for j in range(NUM_TEST_CLIENTS):  # test-1, -2, -3: types 0, 1, 2 are the three concepts
        x, y, t = read_generated(generated / f"test-{j + 1}.pkl")
        tests.append(_client(x, y, seed, NUM_CLIENTS + j, group=np.int64(t)))
    return client_files.write(dst, out, META, tests)


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
        p = subprocess.run(
            [python, "-m", "jobs.reference.fedrc_generate", "--checkout", str(checkout), "--seed", str(seed)],
            cwd=work,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    if p.returncode != 0:
        tail = log.read_text()[-2000:]
        raise ReferenceError(f"{REPO}'s generator failed (exit {p.returncode}; {log}):\n{tail}")
    return data


def clients_folder(out: Path, clients: int) -> Path:
    """Where `main` writes the clients: ``out/clients`` (all 300) or ``out/clients-N``."""
    return out / ("clients" if clients == NUM_CLIENTS else f"clients-{clients}")


def main(checkout: Path, out: Path, seed: int, python: str | None, clients: int = NUM_CLIENTS) -> Path:
    """The clients as client_files in `clients_folder` (generated and converted unless there)."""
    check_count(clients, NUM_CLIENTS)  # before the generator runs
    dst = clients_folder(out, clients)
    if (dst / "meta.json").is_file() and (dst / f"test_client_{NUM_TEST_CLIENTS - 1:04d}.npz").is_file():
        return dst
    generated = generate(checkout, out, seed, python or sys.executable)
    return convert(generated, dst, seed, clients)


# ---- the reference's training on the same clients ---------------------------------------------

# fedray's algorithm -> run_experiment.py's method (utils/constants.py); FedAvg and CFL run one model
METHODS = {
    "fedavg": "FedAvg",
    "fedem": "FedEM",
    "fedrc": "fedrc",
    "ifca": "IFCA",
    "fesem": "FeSEM",
    "cfl": "clustered",
}
ONE_MODEL = {"fedavg", "cfl"}
# The script's SGD (utils/optim.py): momentum 0.9 and weight decay 5e-4, not settable.
SCRIPT_SGD = {"momentum": 0.9, "weight_decay": 5e-4}
# Every method's clients keep their learners' optimizers across rounds, and their training loaders
# drop the last partial batch; IFCA's and FeSEM's server zeroes a model nobody picked, and FeSEM's
# clients move their untrained copy and split their first loss over the K models: fedray's runs must
# say so to compute what the script computes.
SCRIPT_CLIENTS = {
    "persistent_optimizer": (True, "the script's clients keep their SGD optimizers (momentum) across rounds"),
    "drop_last": (True, "the script's training loaders drop each epoch's last partial batch"),
    "empty_cluster": ("zero", "the script overwrites a model no client picked with zeros"),
    "switch": ("untrained", "the script's FeSEM client that moves gives its new centre the copy it received"),
    "first_round": ("split", "the script's FeSEM clients weigh each model's first loss 1/K"),
}


def script_args(cfg: Config, run_id: str) -> list[str]:
    """run_experiment.py's arguments for fedray run ``cfg``; what the script cannot run as
    configured is a ReferenceError naming the key."""
    if cfg.algorithm not in METHODS:
        raise ReferenceError(f"{cfg.algorithm}: {REPO} is driven for {', '.join(METHODS)} only")
    if cfg.dataset != "client_files":
        raise ReferenceError(
            "config key 'dataset': the reference runs on the client_files this harness writes"
        )
    for key, value in SCRIPT_SGD.items():
        if getattr(cfg, key) != value:
            raise ReferenceError(
                f"config key '{key}': the script's SGD has {key} {value}, got {getattr(cfg, key)}"
            )
    if cfg.rounds < 1:
        raise ReferenceError("config key 'rounds': at least 1")
    from fedray.algorithms import ALGORITHMS

    hp = ALGORITHMS[cfg.algorithm].full_hparams(cfg.hp)  # every value, the registry's defaults included
    for key, (value, why) in SCRIPT_CLIENTS.items():
        if key in hp and hp[key] != value:
            raise ReferenceError(f"config key 'hp.{key}': {why}: set it {str(value).lower()}")
    k = 1 if cfg.algorithm in ONE_MODEL else int(hp["num_clusters"])
    # the script trains n_rounds + 1 rounds (while current_round <= n_rounds) and logs after each
    return [
        "fmnist-c",
        METHODS[cfg.algorithm],
        "--n_learners",
        str(k),
        "--n_rounds",
        str(cfg.rounds - 1),
        "--bz",
        str(cfg.batch_size),
        "--lr",
        f"{cfg.lr:g}",
        "--local_steps",
        str(cfg.local_epochs),
        "--sampling_rate",
        f"{cfg.participation:g}",
        "--optimizer",
        "sgd",
        "--lr_scheduler",
        "constant",
        "--log_freq",
        "1",
        "--seed",
        str(cfg.seed),
        "--verbose",
        "1",
        "--suffix",
        run_id,
    ]


def run_id_of(cfg: Config) -> str:
    return f"{cfg.run_id()}-ref"


def same_args(a: list[str], b: list[str]) -> bool:
    """The same run of the script: the same arguments but for ``--suffix`` (its log folder's name)."""

    def without_suffix(args: list[str]) -> list[str]:
        i = args.index("--suffix") if "--suffix" in args else len(args)
        return args[:i] + args[i + 2 :]

    return without_suffix(a) == without_suffix(b)


def run_one(cfg: Config, checkout: Path, out: Path, python: str, threads: int, device: str = "cpu") -> dict:
    """The reference's run of ``cfg`` (a subprocess under ``python``, on ``device``); returns the
    wrapper's record. A record already in ``out/reference/results/`` for the same arguments (a run
    done earlier, or elsewhere: on a GPU machine, with the same wrapper) is returned as it is."""
    run_id = run_id_of(cfg)
    result = out / "reference" / "results" / f"{run_id}.json"
    args = script_args(cfg, run_id)
    if result.is_file():
        record = json.loads(result.read_text())
        if same_args(record.get("args", []), args):
            return record
    work = out / "reference" / "logs" / run_id
    work.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[2]
    cmd = [
        python,
        "-m",
        "jobs.reference.fedrc_wrapper",
        "--checkout",
        str(checkout),
        "--clients",
        str(Path(cfg.data_root).resolve()),
        "--result",
        str(result),
        "--threads",
        str(threads),
        "--device",
        device,
        "--",
        *args,
    ]
    with open(work / "stdout.txt", "w") as f:
        p = subprocess.run(
            cmd, cwd=work, env={**os.environ, "PYTHONPATH": str(root)}, stdout=f, stderr=subprocess.STDOUT
        )
    if p.returncode != 0:
        tail = (work / "stdout.txt").read_text().splitlines()[-15:]
        raise RuntimeError(f"{REPO} run {run_id} failed (exit {p.returncode}):\n" + "\n".join(tail))
    return json.loads(result.read_text())


def groups(folder: Path) -> dict[int, int]:
    """Each training client's ground-truth concept (``group``) in a client_files folder."""
    from fedray.data import client_files

    out = {}
    for i, path in enumerate(client_files.client_paths(folder)[0]):
        with np.load(path, allow_pickle=False) as z:
            out[i] = int(z["group"])
    return out


def cluster_purity(clusters: dict | None, truth: dict[int, int]) -> float | None:
    """fedray's purity (`fedray.algorithms.clustering.purity`) of the reference's clusters at a logged round:
    the clustered method's ``clusters_indices`` where it has them, else each client's largest
    omega (``learners_weights``), as fedray assigns FedEM's, FedRC's, IFCA's and FeSEM's clients."""
    from fedray.algorithms.clustering import purity

    if not clusters:
        return None
    if clusters.get("clusters") is not None:
        assignment = {c: k for k, members in enumerate(clusters["clusters"]) for c in members}
    else:
        assignment = {c: int(np.argmax(w)) for c, w in enumerate(clusters["omega"])}
    return purity(assignment, truth)


def import_run(cfg: Config, record: dict, out: Path, commit: str) -> str:
    """The reference's run as a fedray run (source: the repository): per round after training
    (the script's log after round r, r = 1 .. rounds), accuracy and loss (the 3 test clients),
    local_accuracy (each training client's ensemble on its test split), train_accuracy and
    train_loss (on the training splits), the round's wall time, and purity where the run has more
    than one model and its record the clusters (`cluster_purity`)."""
    from fedray.storage.writer import ResultsWriter

    run_id = run_id_of(cfg)
    truth = groups(Path(cfg.data_root)) if cfg.algorithm != "fedavg" else {}
    config = {**cfg.to_dict(), "source": REPO}
    writer = ResultsWriter(out, run_id, config)
    writer.start()
    previous = 0.0
    for r in record["rounds"]:
        if r["round"] == 0:  # the script's log before any training
            previous = r["seconds"]
            continue
        train, test = r["train"], r["test"]
        writer.add(
            r["round"],
            [
                rec("accuracy", test["Test/Metric"]),
                rec("loss", test["Test/Loss"]),
                rec("local_accuracy", train["Test/Metric"]),
                rec("train_accuracy", train["Train/Metric"]),
                rec("train_loss", train["Train/Loss"]),
                rec("seconds", r["seconds"] - previous),
            ],
        )
        p = cluster_purity(r.get("clusters"), truth) if truth else None
        if p is not None:
            writer.add(r["round"], [rec("purity", p)])
        previous = r["seconds"]
    writer.finish(
        {
            "rounds_done": cfg.rounds,
            "total_seconds": record["total_seconds"],
            "reference": {
                "repo": REPO,
                "commit": commit,
                "script": "run_experiment.py",
                "args": record["args"],
                "threads": record["threads"],
                "device": record.get("device", "cpu"),
            },
        }
    )
    return run_id


def run_reference(
    runs: list[Config],
    checkout: Path,
    out: Path,
    python: str,
    threads: int,
    log=print,
    jobs: int = 1,
    device: str = "cpu",
) -> int:
    """Every run not imported yet, ``jobs`` at a time (each its own process, on ``device``);
    returns the number that failed (reported, the others go on)."""
    from fedray.storage.results import run_status
    from jobs.reference.harness import run_pool

    commit = check_checkout(checkout)
    for cfg in runs:
        script_args(cfg, "")  # every run checked before the first starts
    todo = [c for c in runs if run_status(out, run_id_of(c)) != "finished"]
    log(
        f"{REPO} @ {commit[:7]}: {len(runs)} runs, {len(runs) - len(todo)} already imported, {len(todo)} to run "
        f"({max(1, jobs)} at once, on {device})"
    )

    def one(cfg: Config) -> str:
        record = run_one(cfg, checkout, out, python, threads, device)
        import_run(cfg, record, out, commit)
        final = [r for r in record["rounds"] if r["round"] > 0][-1]["test"]["Test/Metric"]
        return f"{final:.4f} final accuracy, {record['total_seconds']:.0f} s"

    return run_pool(todo, one, lambda c: f"{c.algorithm} lr {c.lr:g} seed {c.seed}", jobs, log)[1]


def check_checkout(checkout: Path) -> str:
    """The checkout's commit (`jobs.reference.harness.check_checkout`: not the reference, or another
    commit, is an error); a checkout without the generator is not the reference either."""
    from jobs.reference.harness import check_checkout as checked

    if not (checkout / GENERATOR).is_file():
        raise ReferenceError(f"--checkout {str(checkout)!r}: not a {REPO} checkout (no {GENERATOR})")
    return checked(FEDRC, checkout)


# ---- the record: `fedray reference fedrc [CONFIG]` --------------------------------------------

SEED = Option("--seed", "the seed of the generator's draw and of the 90/10 splits", default=0, type=int)
PYTHON = Option("--python", "the Python of an environment with the reference's dependencies", default=None)
CLIENTS = Option(
    "--clients",
    f"keep N of the generator's {NUM_CLIENTS} clients, each role in proportion (default {NUM_CLIENTS})",
    default=NUM_CLIENTS,
    type=int,
    metavar="N",
)
DEVICE = Option(
    "--device", "the reference's device (cuda: GPU 0; default cpu)", default="cpu", choices=("cpu", "cuda")
)


def make_clients(checkout: Path, out: Path, options: dict) -> tuple[Path, list[str]]:
    """The clients (`main`), and the --set that put a sweep's runs on them."""
    folder = main(checkout, out, options["seed"], options["python"] or sys.executable, options["clients"])
    return folder, [f"data_root={folder}", f"num_clients={options['clients']}"]


FEDRC = Reference(
    name="fedrc",
    repo=REPO,
    commit=COMMIT,
    script="run_experiment.py",
    wrapper="jobs.reference.fedrc_wrapper",
    algorithms=frozenset(METHODS),
    about=f"{REPO}: its FMNIST-C clients as client_files",
    options=(SEED, PYTHON, CLIENTS, DEVICE),
    clients=make_clients,
    check_run=lambda cfg: script_args(cfg, ""),
    run=lambda ref, runs, checkout, out, jobs, threads, o: run_reference(
        runs, checkout, out, o["python"] or sys.executable, threads, jobs=jobs, device=o["device"]
    ),
    report="--cols source,algorithm --metric accuracy --at best-train",
)
