"""The FL-bench harness (jobs/reference/flbench.py, flbench_wrapper.py): FL-bench's FedLC server gets
the partition's clients (through FL-bench's own args.json and partition.pkl, read from its
FLBENCH_ROOT), the run's settings through its own config machinery, fedray's model behind its
DecoupledModel interface and fedray's unnormalised tensors; its per-round centralized test is
recorded and imported next to fedray's. KarhouTam/FL-bench is not here: a small tree in its shape
(config/defaults.yaml, src/server/{fedavg,fedlc}.py, src/utils/{functional,models}.py,
data/utils/datasets.py) stands in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.report import run_values
from fedray.data.datasets import load_dataset, train_labels
from fedray.experiment.checks import from_dict
from jobs.cli import main as cli
from jobs.reference import flbench_wrapper, harness
from jobs.reference.flbench import FLBENCH
from jobs.reference.harness import ReferenceError
from tests.helpers import draw_borrowed_partition as draw_partition

DEFAULTS_YAML = """
method: fedavg
dataset: {name: mnist}
model: {name: lenet5}
lr_scheduler: {name: null, step_size: 10}
optimizer: {name: sgd, lr: 0.1, dampening: 0, weight_decay: 0, momentum: 0, nesterov: false}
mode: serial
common:
  seed: 42
  join_ratio: 0.1
  global_epoch: 100
  local_epoch: 5
  batch_size: 32
  client_side_evaluation: true
  use_cuda: true
  test: {server: {interval: -1, test: false}}
fedprox: {mu: 0.01}
"""

FUNCTIONAL = """
from omegaconf import DictConfig, OmegaConf
def parse_args(config, method_name, get_method_args_func):
    final = OmegaConf.create(OmegaConf.to_container(config))
    defaults = DictConfig(get_method_args_func([]).__dict__)
    if method_name not in final:
        final[method_name] = defaults
    for key in defaults:
        if key not in final[method_name]:
            final[method_name][key] = defaults[key]
    del final["fedprox"]  # FL-bench keeps only the groups of DEFAULTS and the method's
    return final
"""

MODELS = """
import torch
class DecoupledModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.base, self.classifier = None, None
    def check_and_preprocess(self, args):
        if self.base is None or self.classifier is None:
            raise RuntimeError("base and classifier")
    def forward(self, x):
        return self.classifier(self.base(x))
"""

DATASETS = """
from torch.utils.data import Dataset
class BaseDataset(Dataset):
    def __init__(self, data, targets, classes, train_data_transform=None, train_target_transform=None,
                 test_data_transform=None, test_target_transform=None):
        self.data, self.targets, self.classes = data, targets, classes
        self.transform = train_data_transform
        if self.data.max() > 1.0:
            self.data /= 255.0
    def __getitem__(self, i):
        x = self.data[i]
        return (self.transform(x) if self.transform else x), self.targets[i]
    def __len__(self):
        return len(self.targets)
"""

FEDAVG = """
import json, pickle, random
import numpy as np, torch
from hydra.core.hydra_config import HydraConfig
from torch.utils.data import DataLoader, Subset
from pathlib import Path
FLBENCH_ROOT = Path(__file__).parent.parent.parent.absolute()

class Acc:
    def __init__(self, accuracy):
        self.accuracy = accuracy

class FedAvgServer:
    def __init__(self, args):
        self.args = args
        random.seed(args.common.seed); np.random.seed(args.common.seed); torch.manual_seed(args.common.seed)
        self.output_dir = Path(HydraConfig.get().runtime.output_dir)
        root = FLBENCH_ROOT / "data" / args.dataset.name
        self.args.dataset.update(json.loads((root / "args.json").read_text()))
        with open(root / "partition.pkl", "rb") as f:
            self.partition = pickle.load(f)
        self.init_model()
        self.dataset = self.get_dataset()
        self.test_results = {}
        idx = self.partition["data_indices"]
        test = np.concatenate([d["test"] for d in idx])
        self.testloader = DataLoader(Subset(self.dataset, test), batch_size=args.common.batch_size)
        seen = {"sizes": [len(d["train"]) for d in idx], "dtypes": sorted({str(d[k].dtype) for d in idx for k in d}),
                "train": [np.asarray(d["train"]).tolist() for d in idx], "test": test.tolist(),
                "separation": self.partition["separation"], "dataset_args": dict(self.args.dataset),
                "params": [n for n, _ in self.model.named_parameters()],
                "data_range": [float(self.dataset.data.min()), float(self.dataset.data.max())],
                "transform": repr(self.dataset.transform),
                "data_len": len(self.dataset), "common": {k: v for k, v in args.common.items() if k != "test"},
                "server_test": dict(args.common.test.server), "optimizer": dict(args.optimizer),
                "method": dict(args[args.method]), "output_dir": str(self.output_dir)}
        (Path.cwd() / "seen.json").write_text(json.dumps(seen))

    def init_model(self, model=None, preprocess_func=None, postprocess_func=None):
        self.model = model
        self.model.check_and_preprocess(self.args)

    def run_experiment(self):
        a = self.args
        counts = {}
        for c, d in enumerate(self.partition["data_indices"]):
            y = np.asarray(self.dataset.targets)[d["train"]]
            counts[c] = torch.tensor([max(int((y == k).sum()), 1e-8) for k in range(len(self.dataset.classes))])
        for E in range(a.common.global_epoch):
            self.current_epoch = E
            states, weights = [], []
            for c in random.sample(self.partition["separation"]["train"], len(self.partition["separation"]["train"])):
                model = __import__("copy").deepcopy(self.model)
                opt = torch.optim.SGD(model.parameters(), lr=a.optimizer.lr)
                loader = DataLoader(Subset(self.dataset, self.partition["data_indices"][c]["train"]),
                                    batch_size=a.common.batch_size, shuffle=True)
                for _ in range(a.common.local_epoch):
                    for x, y in loader:
                        logit = model(x) - a[a.method].tau * counts[c].float() ** -0.25
                        loss = torch.nn.functional.cross_entropy(logit, y)
                        opt.zero_grad(); loss.backward(); opt.step()
                states.append(model.state_dict()); weights.append(len(loader.dataset))
            w = torch.tensor(weights, dtype=torch.float32) / sum(weights)
            self.model.load_state_dict({k: sum(wi * s[k] for wi, s in zip(w, states)) for k in states[0]})
            if a.common.test.server.interval > 0:
                self.test_global_model()

    def test_global_model(self):
        right = total = 0
        with torch.no_grad():
            for x, y in self.testloader:
                right += int((self.model(x).argmax(1) == y).sum()); total += len(y)
        self.test_results[self.current_epoch + 1] = {"centralized": {"after": {"test": Acc(100.0 * right / total)}}}
"""

FEDLC = """
from argparse import ArgumentParser
from src.server.fedavg import FedAvgServer
class FedLCServer(FedAvgServer):
    @staticmethod
    def get_hyperparams(args_list=None):
        parser = ArgumentParser()
        parser.add_argument("--tau", type=float, default=1.0)
        return parser.parse_args(args_list)
"""


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    root = tmp_path / "FL-bench"
    for path, text in {
        "config/defaults.yaml": DEFAULTS_YAML,
        "src/utils/functional.py": FUNCTIONAL,
        "src/utils/models.py": MODELS,
        "data/utils/datasets.py": DATASETS,
        "src/server/fedavg.py": FEDAVG,
        "src/server/fedlc.py": FEDLC,
    }.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    monkeypatch.setenv("FEDRAY_REFERENCE_ANY_COMMIT", "1")  # not a git checkout of 06e658b
    return root


def cfg(out: Path, **over):
    base = dict(
        dataset="digits",
        model="mlp",
        num_clients=4,
        partition="labels",
        partition_k=2,
        algorithm="fedlc",
        hp={"tau": 0.5},
        rounds=2,
        local_epochs=1,
        batch_size=32,
        lr=0.05,
        momentum=0.9,
        weight_decay=1e-4,
        output=str(out),
    )
    return from_dict({**base, **over})


def test_fedlc_runs_on_the_partitions_clients_through_flbench_files_and_config_and_lands_beside_fedray(
    checkout, tmp_path
):
    out = tmp_path / "out"
    c = cfg(out)
    parts = draw_partition(c)
    done, failed = harness.run_reference(FLBENCH, [c], checkout, out, threads=1, log=lambda s: None)
    assert (done, failed) == (1, 0)
    run_id = harness.reference_run_id(c, FLBENCH)
    logs = out / "reference" / "logs" / run_id
    seen = json.loads((logs / "seen.json").read_text())
    y, _ = train_labels(c)
    n, n_test = len(y), len(load_dataset(c).test.y)
    # the clients, as FL-bench's partition.pkl (int64 arrays, as its generator writes them)
    assert seen["train"] == [p.tolist() for p in parts] and seen["dtypes"] == ["int64"]
    assert seen["separation"] == {"train": [0, 1, 2, 3], "val": [], "test": [], "total": 4}
    # the test split follows the training split in one data set, as FL-bench's own FashionMNIST
    assert seen["data_len"] == n + n_test and seen["test"] == list(range(n, n + n_test))
    # fedray's x / 255, no normalisation
    assert seen["data_range"] == [0.0, 1.0] and seen["transform"] == "None"
    assert seen["dataset_args"]["name"] == "digits" and seen["dataset_args"]["client_num"] == 4
    assert seen["output_dir"] == str(logs / "out")  # HydraConfig answers the run's folder
    assert "classifier.weight" in seen["params"] and "classifier.bias" in seen["params"]
    assert seen["method"] == {"tau": 0.5}
    o = seen["optimizer"]
    assert (o["name"], o["lr"], o["momentum"], o["weight_decay"]) == ("sgd", 0.05, 0.9, 1e-4)
    m = seen["common"]
    assert (m["seed"], m["join_ratio"], m["global_epoch"], m["local_epoch"], m["batch_size"]) == (
        0,
        1.0,
        2,
        1,
        32,
    )
    assert (m["client_side_evaluation"], m["use_cuda"], m["save_log"], m["monitor"]) == (
        False,
        False,
        False,
        None,
    )
    assert seen["server_test"]["interval"] == 1 and seen["server_test"]["test"] is True
    record = json.loads((out / "reference" / "results" / f"{run_id}.json").read_text())
    assert len(record["evals"]) == 2
    # the exact fraction right is imported; FL-bench's own percentage is kept beside it and agrees
    for e in record["evals"]:
        assert 0 <= e["accuracy"] <= 1 and e["flbench_accuracy"] == pytest.approx(100 * e["accuracy"])
    assert record["flbench_config"]["fedlc"] == {"tau": 0.5}
    values = run_values(out)
    assert [v["source"] for v in values["config"]] == ["KarhouTam/FL-bench"]
    assert values["value"].iloc[0] == record["evals"][-1]["accuracy"]
    # seeded as FL-bench seeds: the same run again gives the same weights
    harness.run_reference(FLBENCH, [c], checkout, out, threads=1, force=True, log=lambda s: None)
    again = json.loads((out / "reference" / "results" / f"{run_id}.json").read_text())
    assert [e["model_sha256"] for e in again["evals"]] == [e["model_sha256"] for e in record["evals"]]


@pytest.mark.parametrize(
    "over,message",
    [
        ({"algorithm": "fedavg", "hp": {}}, "has no such algorithm"),
        ({"hp": {"server_lr": 0.5}}, "hp.server_lr: 1"),
        ({"seed": 1}, "no partition .*s1.json.*--partitions-only"),
        ({"client_test_fraction": 0.2}, "no client_test_fraction"),
    ],
)
def test_what_flbench_cannot_run_is_refused_before_anything_runs(tmp_path, over, message):
    out = tmp_path / "out"
    draw_partition(cfg(out))  # seed 0's only
    with pytest.raises(ReferenceError, match=message):
        harness.plan_jobs(FLBENCH, [cfg(out, **over)], out, out)


@pytest.mark.parametrize("flag", ["--check", "--partitions-only", "--keep-logging-evals"])
def test_options_flbench_has_no_use_for_are_refused(tmp_path, capsys, flag):
    rc = cli(
        ["reference", "fl-bench", "x.yaml", "--checkout", str(tmp_path), "--output", str(tmp_path), flag]
    )
    assert rc == 2 and f"fl-bench: {flag} does not apply" in capsys.readouterr().err


def test_a_missing_flbench_dependency_is_named_with_the_install_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(flbench_wrapper, "NEEDS", ("hydra", "no_such_module_here"))
    rc = flbench_wrapper.main(
        [
            "--checkout",
            str(tmp_path),
            "--result",
            str(tmp_path / "r.json"),
            "--",
            "src/server/fedlc.py",
            *harness_args(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "no_such_module_here" in err and 'pip install -e ".[flbench]"' in err
    assert not (tmp_path / "r.json").exists()


def harness_args(tmp_path: Path) -> list[str]:
    out = tmp_path / "out"
    c = cfg(out)
    draw_partition(c)
    return FLBENCH.args(c, out, out)
