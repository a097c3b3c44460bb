"""NIID-Bench-family references: sjtudyq/FedConcat's and Xtra-Computing/NIID-Bench's experiments.py.

A fedray config becomes the script's arguments: the same dataset, partition setting (the script
draws it, from its own seed; fedray then runs on the script's clients), model, local training,
participation, rounds and seed. What the script cannot express is an error before anything runs.

Settings that differ between the two (docs/algorithms/baselines.md#paper-and-code-differences), and which way each cell runs:
- FedNova: FedConcat's copy weights clients by their number of batches, NIID-Bench's by samples;
  fedray by samples (the paper's). FedConcat's cells must say ``hp.weights: batches`` (checked),
  so each reference run is labelled with what it computes and pairs with fedray's same rule.
- SCAFFOLD: both scripts update the server's control variate by the participants' mean (fedray's
  ``hp.server_update: code``); at full participation the paper's rule is the same.
- MOON (NIID-Bench only): SGD momentum 0.9 whatever ``momentum`` says; batches of one sample
  skipped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from fedray.config.keys import Config
from jobs.reference.record import (
    CHECK,
    FORCE,
    KEEP_LOGGING_EVALS,
    PARTITIONS_ONLY,
    STATE_DICT,
    Reference,
    ReferenceError,
)

_PARTITIONS = {"labels", "dirichlet", "iid", "quantity"}
_DATASETS = {"fmnist": "FashionMNIST"}


def _partition_args(cfg: Config) -> list[str]:
    if cfg.partition not in _PARTITIONS:
        raise ReferenceError(
            f"partition {cfg.partition!r}: the script draws only {', '.join(sorted(_PARTITIONS))}"
        )
    if cfg.client_test_fraction or cfg.shift != "none":
        raise ReferenceError("the script has no client test splits or shifts (client_test_fraction, shift)")
    if cfg.partition == "labels":
        return ["--partition", f"noniid-#label{cfg.partition_k}"]
    if cfg.partition == "dirichlet":
        if cfg.partition_min_size != 10:
            raise ReferenceError(
                "the script's Dirichlet redraws until every client has 10 samples (partition_min_size: 10)"
            )
        return ["--partition", "noniid-labeldir", "--beta", f"{cfg.partition_beta:g}"]
    if cfg.partition == "quantity":
        return ["--partition", "iid-diff-quantity", "--beta", f"{cfg.partition_beta:g}"]
    return ["--partition", "homo"]


def _server_lr_one(hp: dict) -> None:
    if "server_lr" in hp and hp["server_lr"] != 1.0:
        raise ReferenceError("the script averages with server learning rate 1 (hp.server_lr: 1)")


def _algorithm_args(cfg: Config, fedconcat: bool) -> list[str]:
    from fedray.algorithms import ALGORITHMS

    alg = cfg.algorithm
    if alg not in ALGORITHMS:
        raise ReferenceError(f"algorithm {alg!r} is not in this script")
    hp = ALGORITHMS[alg].full_hparams(cfg.hp)  # every value, the registry's defaults included
    if alg in ("fedavg", "fedprox", "scaffold", "fednova", "moon"):
        _server_lr_one(hp)
    if alg == "fedavg":
        return ["--alg", "fedavg", "--comm_round", str(cfg.rounds)]
    if alg == "fedprox":
        return ["--alg", "fedprox", "--comm_round", str(cfg.rounds), "--mu", f"{hp['mu']:g}"]
    if alg == "scaffold":
        if cfg.participation < 1 and hp["server_update"] != "code":
            raise ReferenceError("the script updates c by the participants' mean: set hp.server_update: code")
        return ["--alg", "scaffold", "--comm_round", str(cfg.rounds)]
    if alg == "fednova":
        if fedconcat and hp["weights"] != "batches":
            raise ReferenceError(
                "FedConcat's experiments.py weights FedNova's clients by their batches per epoch "
                "(n_i = len(train_dl_local)): set hp.weights: batches"
            )
        return ["--alg", "fednova", "--comm_round", str(cfg.rounds)]
    if alg == "moon":
        if cfg.momentum != 0.9:
            raise ReferenceError(
                "NIID-Bench's MOON trains with momentum 0.9 whatever is asked (momentum: 0.9)"
            )
        out_dim = hp["out_dim"]
        head = (
            ["--use_projection_head", "1", "--out_dim", str(out_dim)]
            if out_dim
            else ["--use_projection_head", "0"]
        )
        return [
            "--alg",
            "moon",
            "--comm_round",
            str(cfg.rounds),
            "--mu",
            f"{hp['mu']:g}",
            "--temperature",
            f"{hp['temperature']:g}",
            "--loss",
            "contrastive",
            *head,
        ]
    if alg == "fedconcat" and fedconcat:
        # The script's FedConcat: K-means on the exact label distributions, 3 classifier steps, a
        # random classifier init (cache_features changes no number for the simple CNN).
        fixed = {
            "classifier_steps": 3,
            "balanced": False,
            "init_from_clusters": False,
            "elbow_range": [],
            "clustering": "kmeans",
        }
        unsupported = sorted(k for k, v in fixed.items() if hp[k] != v)
        if unsupported:
            raise ReferenceError(
                "the script runs FedConcat with K-means on the label distributions, 3 classifier steps and a "
                f"random classifier; it cannot set hp.{', hp.'.join(unsupported)}"
            )
        te = hp["encoder_rounds"]
        return [
            "--alg",
            "fedconcat",
            "--n_clusters",
            str(hp["num_clusters"]),
            "--encoder_round",
            str(te),
            "--classifier_round",
            str(cfg.rounds - te),
            "--eps",
            f"{hp['eps']:g}",
        ]
    raise ReferenceError(f"algorithm {alg!r} is not in this script")


def script_args(cfg: Config, datadir: Path, logdir: Path, fedconcat: bool) -> list[str]:
    if cfg.dataset not in _DATASETS:
        raise ReferenceError(f"dataset {cfg.dataset!r}: the harness prepares {', '.join(_DATASETS)} only")
    if cfg.model != "simple_cnn":
        raise ReferenceError(
            f"model {cfg.model!r}: the script's FMNIST model is the simple CNN (model: simple_cnn)"
        )
    return [
        "--dataset",
        cfg.dataset,
        "--datadir",
        str(datadir),
        "--model",
        "simple-cnn",
        *_partition_args(cfg),
        "--n_parties",
        str(cfg.num_clients),
        "--epochs",
        str(cfg.local_epochs),
        "--batch-size",
        str(cfg.batch_size),
        "--lr",
        f"{cfg.lr:g}",
        "--rho",
        f"{cfg.momentum:g}",
        "--reg",
        f"{cfg.weight_decay:g}",
        "--sample",
        f"{cfg.participation:g}",
        "--init_seed",
        str(cfg.seed),
        *_algorithm_args(cfg, fedconcat),
        "--device",
        "cpu",
        "--logdir",
        str(logdir),
        "--log_file_name",
        "log",
    ]


def eval_round(cfg: Config, k: int) -> tuple[int, str]:
    """The script evaluates after every round; FedConcat after every classifier round only."""
    if cfg.algorithm == "fedconcat":
        from fedray.algorithms import ALGORITHMS

        return ALGORITHMS["fedconcat"].full_hparams(cfg.hp)["encoder_rounds"] + k + 1, "classifier"
    return k + 1, ""


def prepare_fmnist(out: Path) -> Path:
    """DATADIR/FashionMNIST/raw/ with the four IDX files unzipped, as torchvision's FashionMNIST
    (which the script uses, with download=True) finds them without downloading."""
    datadir = out / "reference" / "data"
    write_fmnist_raw(datadir / "FashionMNIST" / "raw")
    return datadir


def write_fmnist_raw(raw: Path) -> None:
    """The four Fashion-MNIST IDX files, unzipped, in ``raw`` (torchvision's FashionMNIST reads them
    there without downloading), from the Debian package's folder."""
    import gzip

    from fedray.config.keys import DEFAULT_FMNIST_ROOT
    from fedray.data.datasets import FMNIST_FILES, _find_idx

    raw.mkdir(parents=True, exist_ok=True)
    for stem in FMNIST_FILES.values():
        target = raw / stem
        if target.is_file():
            continue
        src = _find_idx(Path(DEFAULT_FMNIST_ROOT), stem)
        if src is None:
            raise ReferenceError(
                f"Fashion-MNIST's {stem} is not in {DEFAULT_FMNIST_ROOT} (apt-get install dataset-fashion-mnist)"
            )
        tmp = target.with_name(f".{stem}.tmp")
        with gzip.open(src, "rb") if src.suffix == ".gz" else open(src, "rb") as f, open(tmp, "wb") as g:
            shutil.copyfileobj(f, g)
        tmp.replace(target)


# The tiny runs `--check` compares (FMNIST, #C=2, 10 clients, one round of one epoch; FedConcat
# one encoder and one classifier round).
CHECK_ARGS = {
    "fedavg": ["--alg", "fedavg", "--comm_round", "2"],
    "fedconcat": [
        "--alg",
        "fedconcat",
        "--n_clusters",
        "3",
        "--encoder_round",
        "1",
        "--classifier_round",
        "1",
    ],
}
CHECK_COMMON = [
    "--dataset",
    "fmnist",
    "--model",
    "simple-cnn",
    "--partition",
    "noniid-#label2",
    "--n_parties",
    "10",
    "--epochs",
    "1",
    "--batch-size",
    "64",
    "--lr",
    "0.01",
    "--rho",
    "0.9",
    "--reg",
    "1e-5",
    "--sample",
    "1",
    "--init_seed",
    "0",
    "--device",
    "cpu",
    "--log_file_name",
    "log",
]


def check_wrapper(ref: Reference, checkout: Path, out: Path) -> int:
    """`--check`: run tiny configs with and without the wrapper's shortcuts and compare the per-round
    model hashes: the shortcuts (skipped logging-only evaluations with their draws replayed, samples
    loaded without PIL) must leave them equal. Also shows what the state-dict copies change."""
    from jobs.reference.harness import check_checkout

    check_checkout(ref, checkout)
    datadir = ref.prepare_data(out)
    root = Path(__file__).resolve().parents[2]

    def run(name: str, alg: str, flags: list[str]) -> dict:
        result = out / "reference" / "check" / f"{name}.json"
        logdir = result.parent / name
        cmd = [
            sys.executable,
            "-m",
            ref.wrapper,
            "--checkout",
            str(checkout),
            "--result",
            str(result),
            "--workdir",
            str(logdir),
            "--threads",
            "1",
            *flags,
            "--",
            ref.script,
            *CHECK_COMMON,
            "--datadir",
            str(datadir),
            "--logdir",
            str(logdir),
            *CHECK_ARGS[alg],
        ]
        subprocess.run(cmd, check=True, cwd=str(root), capture_output=True)
        return json.loads(result.read_text())

    ok = True
    for alg in (a for a in CHECK_ARGS if a in ref.algorithms):
        plain = run(f"{alg}-as-is", alg, ["--keep-logging-evals", "--slow-data"])
        fast = run(f"{alg}-shortcuts", alg, [])
        same = [
            a["model_sha256"] == b["model_sha256"] for a, b in zip(plain["evals"], fast["evals"], strict=True)
        ]
        print(
            f"{alg}: as the script runs ({plain['total_seconds']:.0f} s) vs with the shortcuts "
            f"({fast['total_seconds']:.0f} s, {fast['skipped_logging_evals']} evaluations skipped): "
            f"weights after each evaluated round {'identical' if all(same) else 'DIFFERENT'} "
            f"({sum(same)}/{len(same)}); accuracies {[e['accuracy'] for e in plain['evals']]} vs "
            f"{[e['accuracy'] for e in fast['evals']]}"
        )
        ok &= all(same)
        if alg == "fedconcat":
            views = run(f"{alg}-views", alg, ["--state-dict", "views"])
            differ = views["evals"][-1]["model_sha256"] != fast["evals"][-1]["model_sha256"]
            print(
                f"{alg}: cluster models initialised from views of client 0's weights (the script on a CPU) "
                f"{'differ from' if differ else 'equal'} copies (the script on a GPU): accuracy "
                f"{views['evals'][-1]['accuracy']} vs {fast['evals'][-1]['accuracy']}"
            )
    return 0 if ok else 1


# What both scripts' records share: the same wrapper (its shortcuts, --check) and data.
_NIID_FAMILY = dict(
    script="experiments.py",
    wrapper="jobs.reference.niid_wrapper",
    eval_round=eval_round,
    prepare_data=prepare_fmnist,
    options=(FORCE, PARTITIONS_ONLY, KEEP_LOGGING_EVALS, STATE_DICT, CHECK),
    check=check_wrapper,
)

FEDCONCAT = Reference(
    name="fedconcat",
    repo="sjtudyq/FedConcat",
    commit="6123be7",
    algorithms=frozenset({"fedavg", "fedprox", "scaffold", "fednova", "fedconcat"}),
    args=lambda cfg, datadir, logdir: script_args(cfg, datadir, logdir, fedconcat=True),
    **_NIID_FAMILY,
)

NIID_BENCH = Reference(
    name="niid-bench",
    repo="Xtra-Computing/NIID-Bench",
    commit="61b901a",
    algorithms=frozenset({"fedavg", "fedprox", "scaffold", "fednova", "moon"}),
    args=lambda cfg, datadir, logdir: script_args(cfg, datadir, logdir, fedconcat=False),
    **_NIID_FAMILY,
)
