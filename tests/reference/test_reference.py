"""The reference harness (jobs/reference/): the wrapper's shortcuts change no trained weight, what it
records, and how a reference run lands next to fedray's. The authors' repositories are not here: a
small script in their shape (NIID-Bench's experiments.py: utils.partition_data, compute_accuracy
called by each client before and after training and by the main block once per round, a PIL +
ToTensor + AddGaussianNoise data pipeline) stands in for them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis.fidelity import agreement, section_table
from analysis.fidelity import cells as fidelity_cells
from analysis.report import pivot, run_values
from fedray.experiment.checks import from_dict
from jobs.reference import harness
from jobs.reference.harness import Job, Reference, ReferenceError
from jobs.reference.niid_bench import FEDCONCAT, NIID_BENCH, eval_round
from jobs.reference.niid_wrapper import replay_draws

ROOT = Path(__file__).resolve().parents[2]

UTILS = """
import numpy as np, torch
def partition_data(dataset, datadir, logdir, partition, n_parties, beta=0.4):
    y = np.load(datadir + "/y.npy")
    idx = np.random.permutation(len(y))
    parts = {i: list(p) for i, p in enumerate(np.array_split(idx, n_parties))}
    return None, y, None, None, parts, None
def compute_accuracy(model, dataloader, get_confusion_matrix=False, device="cpu"):
    correct = total = 0
    with torch.no_grad():
        for x, t in dataloader:
            correct += int((model(x).argmax(1) == t).sum()); total += len(t)
    return (correct / total, None) if get_confusion_matrix else correct / total
"""

DATASETS = """
import numpy as np, torch
from PIL import Image
class FashionMNIST_truncated(torch.utils.data.Dataset):
    def __init__(self, datadir, dataidxs=None, train=True, transform=None):
        x = torch.from_numpy(np.load(datadir + ("/x.npy" if train else "/xt.npy")))
        y = torch.from_numpy(np.load(datadir + ("/y.npy" if train else "/yt.npy")))
        self.data, self.target = (x, y) if dataidxs is None else (x[dataidxs], y[dataidxs])
        self.train, self.transform, self.target_transform = train, transform, None
    def __getitem__(self, i):
        img = Image.fromarray(self.data[i].numpy(), mode="L")
        return self.transform(img), self.target[i]
    def __len__(self):
        return len(self.data)
"""

SCRIPT = """
import sys, random, numpy as np, torch
from torch import nn
from torchvision import transforms
from utils import *
from datasets import FashionMNIST_truncated
class AddGaussianNoise:
    def __init__(self, std): self.std = std
    def __call__(self, t): return t + torch.randn(t.size()) * self.std
datadir, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
np.random.seed(0); torch.manual_seed(0); random.seed(0)
_, y, _, _, parts, _ = partition_data("fmnist", datadir, None, "homo", n)
tf = transforms.Compose([transforms.ToTensor(), AddGaussianNoise(0.0)])
test_dl = torch.utils.data.DataLoader(FashionMNIST_truncated(datadir, train=False, transform=tf), batch_size=32)
def train_net(net, dl):
    compute_accuracy(net, dl); compute_accuracy(net, test_dl, get_confusion_matrix=True)  # logging only
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for x, t in dl:
        opt.zero_grad(); nn.functional.cross_entropy(net(x), t).backward(); opt.step()
glob = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
for rnd in range(rounds):
    states = []
    for c in range(n):
        net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10)); net.load_state_dict(glob.state_dict())
        dl = torch.utils.data.DataLoader(FashionMNIST_truncated(datadir, parts[c], True, tf), batch_size=8, shuffle=True)
        train_net(net, dl)
        states.append(net.state_dict())
    glob.load_state_dict({k: sum(s[k] for s in states) / n for k in states[0]})
    acc, _ = compute_accuracy(glob, test_dl, get_confusion_matrix=True)  # the script's own evaluation
"""


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ref")
    (root / "utils.py").write_text(UTILS)
    (root / "datasets.py").write_text(DATASETS)
    (root / "experiments.py").write_text(SCRIPT)
    g = np.random.default_rng(0)
    for name, size in (("x", 120), ("xt", 40)):
        np.save(root / f"{name}.npy", g.integers(0, 256, (size, 8, 8), dtype=np.uint8))
    np.save(root / "y.npy", g.integers(0, 10, 120))
    np.save(root / "yt.npy", g.integers(0, 10, 40))
    return root


@pytest.fixture(scope="module")
def niid_bench_checkout(checkout, tmp_path_factory) -> Path:
    """The same script with NIID-Bench's own signature, compute_accuracy(model, dataloader,
    get_confusion_matrix, moon_model, device), and its main block passing moon_model and device by
    keyword (FedConcat's copy has no moon_model)."""
    root = tmp_path_factory.mktemp("niid")
    for name in ("datasets.py", "x.npy", "xt.npy", "y.npy", "yt.npy"):
        (root / name).write_bytes((checkout / name).read_bytes())
    (root / "utils.py").write_text(
        UTILS.replace(
            'get_confusion_matrix=False, device="cpu"',
            'get_confusion_matrix=False, moon_model=False, device="cpu"',
        )
    )
    (root / "experiments.py").write_text(
        SCRIPT.replace(
            "compute_accuracy(glob, test_dl, get_confusion_matrix=True)",
            'compute_accuracy(glob, test_dl, get_confusion_matrix=True, moon_model=False, device="cpu")',
        )
    )
    return root


def wrap(checkout: Path, out: Path, *flags: str) -> dict:
    result = out / "r.json"
    cmd = [
        sys.executable,
        "-m",
        "jobs.reference.niid_wrapper",
        "--checkout",
        str(checkout),
        "--result",
        str(result),
        *flags,
        "--",
        "experiments.py",
        str(checkout),
        "4",
        "3",
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=300)
    return json.loads(result.read_text())


def test_wrapper_shortcuts_leave_every_trained_weight_as_the_script_makes_it(checkout, tmp_path):
    as_is = wrap(checkout, tmp_path / "a", "--keep-logging-evals", "--slow-data")
    fast = wrap(checkout, tmp_path / "b")
    assert [e["model_sha256"] for e in fast["evals"]] == [e["model_sha256"] for e in as_is["evals"]]
    assert [e["accuracy"] for e in fast["evals"]] == [e["accuracy"] for e in as_is["evals"]]
    assert len(fast["evals"]) == 3  # one per round: the main block's evaluation only
    assert fast["skipped_logging_evals"] == 3 * 4 * 2 and as_is["skipped_logging_evals"] == 0
    # The script's partition, as drawn from its own seed: 4 clients of its 120 samples.
    assert fast["train_size"] == 120 and sorted(sum(fast["partition"].values(), [])) == list(range(120))
    # Without the replayed draws the loaders would shuffle differently, and the weights would differ.
    assert (
        wrap(checkout, tmp_path / "c", "--slow-data")["evals"][-1]["model_sha256"]
        == as_is["evals"][-1]["model_sha256"]
    )


def test_the_wrapper_runs_niid_benchs_signature_with_moon_model(niid_bench_checkout, tmp_path):
    # the wrapper once passed device positionally, which NIID-Bench reads as moon_model (a TypeError)
    fast = wrap(niid_bench_checkout, tmp_path / "b")
    as_is = wrap(niid_bench_checkout, tmp_path / "a", "--keep-logging-evals", "--slow-data")
    assert len(fast["evals"]) == 3
    assert [e["model_sha256"] for e in fast["evals"]] == [e["model_sha256"] for e in as_is["evals"]]


def test_partition_only_stops_after_the_partition(checkout, tmp_path):
    r = wrap(checkout, tmp_path, "--partition-only")
    assert r["evals"] == [] and len(r["partition"]) == 4


def test_replayed_draws_equal_the_loaders_own():
    class Noise:
        def __call__(self, t):
            return t + torch.randn(t.size())

    class ToTensor:
        def __call__(self, x):
            return torch.as_tensor(x, dtype=torch.float32)[None]

    class Data(torch.utils.data.Dataset):
        def __init__(self):
            self.transform = type("Compose", (), {"transforms": [ToTensor(), Noise()]})()

        def __getitem__(self, i):
            t = self.transform.transforms[0](np.full((3, 3), i))
            return self.transform.transforms[1](t), i

        def __len__(self):
            return 37

    for shuffle in (False, True):
        loader = torch.utils.data.DataLoader(Data(), batch_size=5, shuffle=shuffle)
        torch.manual_seed(1)
        for _ in loader:
            pass
        after_loop = torch.get_rng_state()
        torch.manual_seed(1)
        replay_draws(loader)
        assert torch.equal(torch.get_rng_state(), after_loop)


def cfg(tmp_path, **over):
    base = dict(
        dataset="fmnist",
        model="simple_cnn",
        num_clients=40,
        partition="labels",
        partition_k=2,
        rounds=20,
        local_epochs=2,
        batch_size=64,
        lr=0.01,
        momentum=0.9,
        weight_decay=1e-5,
        output=str(tmp_path),
    )
    return from_dict({**base, **over})


def test_a_fedray_config_becomes_the_scripts_arguments(tmp_path):
    d, logs = Path("/data"), Path("/logs")
    args = FEDCONCAT.args(cfg(tmp_path), d, logs)
    pairs = dict(zip(args[::2], args[1::2], strict=False))
    assert (
        pairs["--partition"] == "noniid-#label2"
        and pairs["--n_parties"] == "40"
        and pairs["--alg"] == "fedavg"
    )
    assert (pairs["--epochs"], pairs["--batch-size"], pairs["--lr"], pairs["--rho"], pairs["--reg"]) == (
        "2",
        "64",
        "0.01",
        "0.9",
        "1e-05",
    )
    assert pairs["--comm_round"] == "20" and pairs["--init_seed"] == "0" and pairs["--device"] == "cpu"
    dirichlet = FEDCONCAT.args(cfg(tmp_path, partition="dirichlet", partition_beta=0.1), d, logs)
    assert "noniid-labeldir" in dirichlet and dirichlet[dirichlet.index("--beta") + 1] == "0.1"
    fc = FEDCONCAT.args(cfg(tmp_path, algorithm="fedconcat", rounds=69, hp={"encoder_rounds": 12}), d, logs)
    p = dict(zip(fc[::2], fc[1::2], strict=False))
    assert (p["--alg"], p["--n_clusters"], p["--encoder_round"], p["--classifier_round"]) == (
        "fedconcat",
        "5",
        "12",
        "57",
    )
    assert eval_round(cfg(tmp_path, algorithm="fedconcat", rounds=69, hp={"encoder_rounds": 12}), 0) == (
        13,
        "classifier",
    )
    mu = FEDCONCAT.args(cfg(tmp_path, algorithm="fedprox"), d, logs)
    assert mu[mu.index("--mu") + 1] == "0.001"  # fedray's default, written out


@pytest.mark.parametrize(
    "over,message",
    [
        ({"partition": "dominant", "partition_beta": 0.5}, "the script draws only"),
        ({"model": "mlp"}, "simple CNN"),
        ({"algorithm": "fedavg", "hp": {"server_lr": 0.5}}, "hp.server_lr: 1"),
        (
            {"algorithm": "fedconcat", "rounds": 69, "hp": {"encoder_rounds": 12, "classifier_steps": 5}},
            "hp.classifier_steps",
        ),
        ({"algorithm": "scaffold", "participation": 0.5}, "hp.server_update: code"),
        ({"algorithm": "fednova"}, "by their batches per epoch .*: set hp.weights: batches"),
        ({"partition": "dirichlet", "partition_min_size": 20}, "partition_min_size: 10"),
        ({"algorithm": "ifca"}, "has no such algorithm"),
    ],
)
def test_what_the_script_cannot_run_is_refused_before_anything_runs(tmp_path, over, message):
    with pytest.raises(ReferenceError, match=message.replace("(", r"\(")):
        harness.plan_jobs(FEDCONCAT, [cfg(tmp_path, **over)], tmp_path, Path("/data"))
    with pytest.raises(ReferenceError, match="has no such algorithm"):
        harness.plan_jobs(
            NIID_BENCH,
            [cfg(tmp_path, algorithm="fedconcat", rounds=69, hp={"encoder_rounds": 12})],
            tmp_path,
            Path("/data"),
        )


def fake_record(partition: dict, accs: list[float]) -> dict:
    return {
        "args": ["--alg", "fedavg"],
        "total_seconds": 12.0,
        "train_size": 60000,
        "partition": partition,
        "evals": [{"accuracy": a, "seconds": 1.5, "model_sha256": f"h{i}"} for i, a in enumerate(accs)],
        "skipped_logging_evals": 7,
        "state_dict": "copies",
        "kmeans_n_init": 10,
        "fast_data": True,
    }


def test_reference_runs_land_next_to_fedrays_and_report_side_by_side(tmp_path):
    out = tmp_path / "out"
    ref = Reference(
        "fake",
        "someone/fake",
        "abc",
        "experiments.py",
        "w",
        frozenset({"fedavg"}),
        lambda c, d, lg: [],
        lambda c, k: (k + 1, ""),
        lambda o: o,
    )
    part = {str(c): list(range(c * 1500, (c + 1) * 1500)) for c in range(40)}
    for seed, accs in ((0, [0.5, 0.70]), (1, [0.4, 0.72])):
        c = cfg(out, seed=seed, rounds=2)
        job = Job(c, harness.reference_run_id(c, ref), [], out / "x.json")
        record = fake_record(part, accs)
        path = harness.save_partition(c, out, record)
        assert path.name == f"fmnist-labels2-n40-s{seed}.json"
        harness.import_run(ref, c, job, record, "abc1234", out)
        # the same setting and seed, other clients
        with pytest.raises(ReferenceError, match="drew other clients"):
            harness.save_partition(c, out, fake_record({**part, "0": part["0"][:-1]}, accs))
    values = run_values(out)
    assert sorted(values["value"]) == [0.70, 0.72]
    cells = pivot(values, rows=("partition",), cols=("source", "algorithm"))
    assert cells["col"].tolist() == ["someone/fake fedavg"] and cells["partition"].tolist() == ["#C=2"]
    assert cells["mean"].iloc[0] == pytest.approx(0.71)
    # The fedray side: the same runs on those partitions, a sweep file that validates.
    side = harness.write_fedray_side("fake", [cfg(out, seed=s, rounds=2) for s in (0, 1)], out, ref.repo)
    from fedray.sweeps.sweep_file import load_sweep

    runs = load_sweep(side).runs
    assert [r.config.seed for r in runs] == [0, 1]
    assert all(r.config.partition == "file" and r.config.partition_name == "#C=2" for r in runs)
    assert all(Path(r.config.resolved_partition_file()).is_file() for r in runs)
    # A later piece (--only) adds its runs to the side file instead of replacing it: seed 2 of the
    # same case keeps a grid; another case for seed 0 only is written run by run.
    parts = out / "reference" / "partitions"
    (parts / "fmnist-labels2-n40-s2.json").write_bytes((parts / "fmnist-labels2-n40-s1.json").read_bytes())
    harness.write_fedray_side("fake", [cfg(out, seed=2, rounds=2)], out, ref.repo)
    assert [r.config.seed for r in load_sweep(side).runs] == [0, 1, 2]
    harness.write_fedray_side("fake", [cfg(out, seed=0, rounds=3), cfg(out, seed=1, rounds=2)], out, ref.repo)
    runs = load_sweep(side).runs
    assert [(r.config.rounds, r.config.seed) for r in runs] == [(2, 0), (2, 1), (2, 2), (3, 0)]
    # A run written again with a setting outside the run id changed keeps its one entry and takes
    # the new setting.
    harness.write_fedray_side(
        "fake", [cfg(out, seed=1, rounds=2, keep_finished_checkpoints=False)], out, ref.repo
    )
    runs = load_sweep(side).runs
    assert [(r.config.rounds, r.config.seed) for r in runs] == [(2, 0), (2, 1), (2, 2), (3, 0)]
    assert [r.config.keep_finished_checkpoints for r in runs] == [True, False, True, True]


def test_agreement_rule_worked_by_hand():
    # fedray 80, 82, 84 (mean 82, sd 2); reference 78, 79, 80 (mean 79, sd 1):
    # SE = sqrt(4/3 + 1/3) = 1.291; tolerance max(1, 2.582) = 2.582 < |3.0| -> disagree.
    s = agreement([0.80, 0.82, 0.84], [0.78, 0.79, 0.80])
    assert s["diff"] == pytest.approx(3.0) and s["se"] == pytest.approx(1.2910, abs=1e-4)
    assert s["tolerance"] == pytest.approx(2.582, abs=1e-3) and s["agree"] is False
    # Identical single values: tolerance is the 1-point floor.
    s = agreement([0.80], [0.805])
    assert s["tolerance"] == 1.0 and s["agree"] is True
    # One reference seed: it takes fedray's seed variance (sd 2): SE = sqrt(4/3 + 4/1) = 2.309,
    # tolerance 4.619 >= |82 - 78| -> agree (with no variance of its own it would be 2.31 and not)
    s = agreement([0.80, 0.82, 0.84], [0.78])
    assert s["se"] == pytest.approx(2.3094, abs=1e-4) and s["agree"] is True


def test_fidelity_table_from_a_results_folder(tmp_path):
    import pandas as pd

    out = tmp_path / "out"
    ref = Reference(
        "fake",
        "someone/fake",
        "abc",
        "experiments.py",
        "w",
        frozenset({"fedavg"}),
        lambda c, d, lg: [],
        lambda c, k: (k + 1, ""),
        lambda o: o,
    )
    part = {str(c): list(range(c * 1500, (c + 1) * 1500)) for c in range(40)}
    for seed, acc in ((0, 0.78), (1, 0.79), (2, 0.80)):
        c = cfg(out, seed=seed, rounds=1)
        harness.import_run(
            ref,
            c,
            Job(c, harness.reference_run_id(c, ref), [], out / "x"),
            fake_record(part, [acc]),
            "abc",
            out,
        )
    c = fidelity_cells(out)
    assert c["source"].tolist() == ["someone/fake"]
    table = section_table(c, paper={"#C=2": {"fedavg": 79.0}})
    assert table.loc[0, "reference"].startswith("79.0 ± 1.0 (3)") and table.loc[0, "paper"] == "79.0"
    assert table.loc[0, "reference time/run"] == "12 s" and table.loc[0, "fedray"] == "-"
    assert isinstance(table, pd.DataFrame)


def test_a_reference_run_that_went_nan_is_imported_as_diverged(tmp_path):
    """The script trains on through NaN weights; the wrapper records each evaluated model's
    finiteness and the import marks the first non-finite round, which docs/fidelity.md counts."""
    import torch

    from jobs.reference.niid_wrapper import weights_finite

    model = torch.nn.Linear(3, 2)
    assert weights_finite(model)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    assert not weights_finite(model)

    out = tmp_path / "out"
    ref = Reference(
        "fake",
        "someone/fake",
        "abc",
        "experiments.py",
        "w",
        frozenset({"fedavg"}),
        lambda c, d, lg: [],
        lambda c, k: (k + 1, ""),
        lambda o: o,
    )
    part = {str(c): list(range(c * 1500, (c + 1) * 1500)) for c in range(40)}
    c = cfg(out, seed=0, rounds=3)
    record = fake_record(part, [0.6, 0.1, 0.1])
    for e, finite in zip(record["evals"], (True, False, False), strict=True):
        e["finite"] = finite
    harness.import_run(ref, c, Job(c, harness.reference_run_id(c, ref), [], out / "x"), record, "abc", out)
    from analysis import load_runs

    assert load_runs(out)["summary"].iloc[0]["diverged_round"] == 2
    cell = fidelity_cells(out).iloc[0]
    assert cell["diverged"] == 1 and cell["values"] == []


def test_the_fedray_side_runs_in_process_with_local(monkeypatch):
    # Ray's workers run niced: on a machine busy with reference runs the fedray side waits, so
    # `fedray reference ... --local` runs it as `fedray sweep --local` does, in this process.
    import jobs.cli as cli

    swept = []
    monkeypatch.setattr(cli, "main", lambda argv: swept.append(list(argv)) or 0)
    for flags, expected in (([], ["sweep", "side.yaml"]), (["--local"], ["sweep", "side.yaml", "--local"])):
        args = cli.build_parser().parse_args(
            ["reference", "fedrc", "x.yaml", "--checkout", ".", "--output", "o", *flags]
        )
        assert args.run_sweep(Path("side.yaml"), args.local) == 0
        assert swept.pop() == expected


def test_pieces_written_at_once_into_one_folder_all_land_in_the_side_file(tmp_path):
    # Two queues run `fedray reference ... --only ...` into one folder at the same time: each adds its
    # runs to DIR/reference/NAME-fedray.yaml, and none may lose another's or read it half-written.
    import threading

    from fedray.sweeps.sweep_file import load_sweep

    pieces = [cfg(tmp_path, lr=lr, seed=seed) for lr in (0.01, 0.03, 0.06, 0.1) for seed in (0, 1, 2)]
    start = threading.Barrier(len(pieces))

    def write(c):
        start.wait()
        harness.write_fedray_side("fake", [c], tmp_path, "someone/fake", place=lambda c, out: c)

    threads = [threading.Thread(target=write, args=(c,)) for c in pieces]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runs = load_sweep(tmp_path / "reference" / "fake-fedray.yaml").runs
    assert sorted((r.config.lr, r.config.seed) for r in runs) == sorted((c.lr, c.seed) for c in pieces)
    assert [p.name for p in (tmp_path / "reference").iterdir() if p.name.endswith(".tmp")] == []
    # an entry whose clients are not drawn yet (its partition file missing) is written all the same:
    # nothing is read or validated while merging
    from dataclasses import replace

    missing = replace(cfg(tmp_path, lr=0.2), partition="file", partition_file=str(tmp_path / "none.json"))
    harness.write_fedray_side("fake", [missing], tmp_path, "someone/fake", place=lambda c, out: c)
    text = (tmp_path / "reference" / "fake-fedray.yaml").read_text()
    assert f"partition_file: {tmp_path / 'none.json'}" in text
