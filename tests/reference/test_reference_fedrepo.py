"""The FedRepo harness (jobs/reference/fedrepo.py, fedrepo_wrapper.py): FedRepo's FedRS class gets the
partition's clients, a bias-free model and FedRepo's args; its per-round test is recorded and imported
next to fedray's. lxcnju/FedRepo is not here: a small package in its shape (utils.setup_seed, an
algorithms.fedrs.FedRS(csets, gset, model, args) that calls ``loader_iter.next()`` and tests the
global model through ``self.test(model=..., loader=self.glo_test_loader)`` each round) stands in."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis.report import run_values
from fedray.config.keys import partition_file_for
from fedray.data.datasets import train_labels
from fedray.experiment.checks import from_dict
from jobs.cli import main as cli
from jobs.reference import harness
from jobs.reference.fedrepo import FEDREPO
from jobs.reference.harness import ReferenceError
from tests.helpers import draw_borrowed_partition as draw_partition

UTILS = """
import random, numpy as np, torch
def setup_seed(seed):
    random.seed(seed); np.random.seed(seed); torch.manual_seed(seed)
"""

FEDRS = """
import json, numpy as np, torch
from torch.utils.data import DataLoader
class FedRS:
    def __init__(self, csets, gset, model, args):
        self.clients, self.model, self.args = list(csets), model, args
        self.train_loaders = {c: DataLoader(csets[c][0], batch_size=args.batch_size, shuffle=True) for c in csets}
        self.glo_test_loader = DataLoader(gset, batch_size=args.batch_size * 10, shuffle=False)
        seen = {"sizes": {str(c): len(csets[c][0]) for c in csets},
                "counts": {str(c): np.bincount(csets[c][0].ys, minlength=args.n_classes).tolist() for c in csets},
                "local_test": {str(c): len(csets[c][1]) for c in csets},
                "params": [n for n, _ in model.named_parameters()], "args": args._asdict(), "test": len(gset)}
        json.dump(seen, open("seen.json", "w"))
    def train(self):
        for r in range(1, self.args.max_round + 1):
            for c in np.random.choice(self.clients, len(self.clients), replace=False):
                x, y = iter(self.train_loaders[c]).next()  # FedRepo's Python 2 spelling
                hs, logits = self.model(x)
                self.model.zero_grad()
                torch.nn.functional.cross_entropy(logits, y).backward()
                with torch.no_grad():
                    for p in self.model.parameters():
                        p -= self.args.lr * p.grad
            self.test(model=self.model, loader=self.glo_test_loader)
    def test(self, model, loader):
        accs = []
        with torch.no_grad():
            for x, y in loader:
                accs.append((model(x)[1].argmax(1) == y).float().mean().item())
        return float(np.mean(accs)), 0.0
"""


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    root = tmp_path / "FedRepo"
    (root / "algorithms").mkdir(parents=True)
    (root / "utils.py").write_text(UTILS)
    (root / "algorithms" / "__init__.py").write_text("")
    (root / "algorithms" / "fedrs.py").write_text(FEDRS)
    monkeypatch.setenv("FEDRAY_REFERENCE_ANY_COMMIT", "1")  # not a git checkout of 617ee01
    return root


def cfg(out: Path, **over):
    base = dict(
        dataset="digits",
        model="mlp",
        num_clients=4,
        partition="labels",
        partition_k=2,
        algorithm="fedrs",
        head_bias=False,
        rounds=2,
        local_epochs=1,
        batch_size=32,
        lr=0.05,
        output=str(out),
    )
    return from_dict({**base, **over})


def test_fedrs_runs_on_the_partitions_clients_with_a_bias_free_model_and_lands_beside_fedray(
    checkout, tmp_path
):
    out = tmp_path / "out"
    c = cfg(out)
    parts = draw_partition(c)
    done, failed = harness.run_reference(FEDREPO, [c], checkout, out, threads=1, log=lambda s: None)
    assert (done, failed) == (1, 0)
    run_id = harness.reference_run_id(c, FEDREPO)
    seen = json.loads((out / "reference" / "logs" / run_id / "seen.json").read_text())
    y, _ = train_labels(c)
    assert seen["sizes"] == {str(k): len(p) for k, p in enumerate(parts)}
    assert seen["counts"] == {str(k): np.bincount(y[p], minlength=10).tolist() for k, p in enumerate(parts)}
    assert set(seen["local_test"].values()) == {1}  # the logging-only local test: one sample each
    assert "classifier.weight" in seen["params"] and "classifier.bias" not in seen["params"]
    a = seen["args"]
    assert (a["c_ratio"], a["max_round"], a["test_round"], a["local_epochs"], a["local_steps"]) == (
        1.0,
        2,
        1,
        1,
        None,
    )
    assert (a["alpha"], a["max_grad_norm"], a["lr"], a["optimizer"], a["cuda"]) == (
        0.5,
        100.0,
        0.05,
        "SGD",
        False,
    )
    record = json.loads((out / "reference" / "results" / f"{run_id}.json").read_text())
    assert len(record["evals"]) == 2 and all(0 <= e["accuracy"] <= 1 for e in record["evals"])
    # the exact fraction right is imported; FedRepo's mean of batch means is kept beside it
    assert all("fedrepo_accuracy" in e for e in record["evals"])
    values = run_values(out)
    assert [c["source"] for c in values["config"]] == ["lxcnju/FedRepo"]
    assert values["value"].iloc[0] == record["evals"][-1]["accuracy"]
    # seeded as FedRepo seeds (setup_seed): the same run again gives the same weights
    harness.run_reference(FEDREPO, [c], checkout, out, threads=1, force=True, log=lambda s: None)
    again = json.loads((out / "reference" / "results" / f"{run_id}.json").read_text())
    assert [e["model_sha256"] for e in again["evals"]] == [e["model_sha256"] for e in record["evals"]]
    # the fedray side: the same run on the same file
    side = harness.write_fedray_side("fedrepo", [c], out, FEDREPO.repo)
    from fedray.sweeps.sweep_file import load_sweep

    (run,) = load_sweep(side).runs
    assert run.config.partition == "file" and run.config.head_bias is False
    assert (
        Path(run.config.resolved_partition_file()).read_bytes()
        == Path(partition_file_for(harness.partition_template(out, c), 0)).read_bytes()
    )


@pytest.mark.parametrize(
    "over,message",
    [
        ({"head_bias": True}, "set head_bias: false"),
        ({"algorithm": "fedavg"}, "has no such algorithm"),
        ({"hp": {"server_lr": 0.5}}, "hp.server_lr: 1"),
        ({"seed": 1}, "no partition .*s1.json.*--partitions-only"),
    ],
)
def test_what_fedrepo_cannot_run_is_refused_before_anything_runs(tmp_path, over, message):
    out = tmp_path / "out"
    draw_partition(cfg(out))  # seed 0's only
    with pytest.raises(ReferenceError, match=message):
        harness.plan_jobs(FEDREPO, [cfg(out, **over)], out, out)


@pytest.mark.parametrize("flag", ["--check", "--partitions-only", "--keep-logging-evals"])
def test_options_fedrepo_has_no_use_for_are_refused(tmp_path, capsys, flag):
    rc = cli(["reference", "fedrepo", "x.yaml", "--checkout", str(tmp_path), "--output", str(tmp_path), flag])
    assert rc == 2 and f"fedrepo: {flag} does not apply" in capsys.readouterr().err
