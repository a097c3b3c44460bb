"""`fedray reference fedrc`: LINs-lab/FedRC's FMNIST-C clients, drawn by its generator (run seeded,
through a wrapper, under any Python) and converted to client_files that fedray trains on. The
generator here is a stand-in with the real one's outputs and the library calls it needs shimmed; the
real one needs ImageMagick and takes minutes."""

from __future__ import annotations

import json
import pickle
import sys

import numpy as np
import pytest

from fedray.config.coercion import ConfigError
from fedray.data import build_federated_data
from fedray.experiment.checks import from_dict
from jobs.reference import fedrc
from jobs.reference.harness import ReferenceError


def generated(folder, n=10, n_test=20, seed=0):
    """The generator's output: 300 clients of n images (types cycling 0..5) and 3 test clients."""
    g = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(fedrc.NUM_CLIENTS):
        c = {
            "images": g.integers(0, 256, (n, 28, 28)).astype(np.uint8),
            "labels": (np.arange(n) + i).astype(np.uint8) % 10,
            "type": i % 6,
        }
        (folder / f"{i}.pkl").write_bytes(pickle.dumps(c))
    x = g.integers(0, 256, (n_test, 28, 28)).astype(np.uint8)
    y = np.arange(n_test) % 10
    for j, labels in enumerate([y, 9 - y, (y + 1) % 10]):
        (folder / f"test-{j + 1}.pkl").write_bytes(
            pickle.dumps({"images": x, "labels": labels.astype(np.uint8), "type": j})
        )
    return folder


def test_the_generated_clients_become_client_files_fedray_trains_on(tmp_path):
    src = generated(tmp_path / "gen")
    dst = fedrc.convert(src, tmp_path / "clients", seed=3)
    cfg = from_dict(
        {"dataset": "client_files", "data_root": str(dst), "num_clients": 300, "model": "simple_cnn"}
    )
    data = build_federated_data(cfg)
    assert len(data.clients) == 303 and data.test_clients == [300, 301, 302]
    # every client split as the reference splits: int(0.9 n) samples train, the rest test
    assert all(len(data.clients[c].train) == 9 and len(data.clients[c].test) == 1 for c in range(300))
    assert all(len(data.clients[c].train) == 18 and len(data.clients[c].test) == 2 for c in (300, 301, 302))
    # the concept of each client: types 0, 1 -> 0 (labels as they are); 2, 4 -> 1 (9 - y); 3, 5 -> 2 ((y + 1) mod 10)
    assert [data.groups[c] for c in range(6)] == [0, 0, 1, 2, 1, 2]
    assert len(data.groups) == 300  # the training clients' (fedray's purity)
    for j in range(3):  # test-1, -2, -3 are the three concepts
        with np.load(dst / f"test_client_{j:04d}.npz") as z:
            assert int(z["group"]) == j
    with np.load(dst / "client_0007.npz") as z:
        raw = pickle.loads((src / "7.pkl").read_bytes())
        tr, te = fedrc.split(10, 3, 7)
        assert np.array_equal(z["x_train"], raw["images"][tr]) and np.array_equal(
            z["y_test"], raw["labels"][te]
        )
        assert int(z["reference_type"]) == 1
    # the reference's scaling: ToTensor (1/255) then Normalize(0.1307, 0.3081), done once: the data
    # to [0, 1], the model (fedrc_cnn, which normalises itself) the rest
    from fedray.models import build_model

    x = data.dataset.train.x[:1]
    t = data.dataset.spec.to_tensor(x)
    assert t.flatten()[0].item() == pytest.approx(x.flat[0] / 255, rel=1e-6)
    model = build_model("fedrc_cnn", (1, 28, 28), 10)
    assert model.encoder.normalize(t).flatten()[0].item() == pytest.approx(
        (x.flat[0] / 255 - 0.1307) / 0.3081, rel=1e-5
    )
    # and a folder that normalises too is refused for that model, before anything runs
    meta = dst / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "mean": [0.1307], "std": [0.3081]}))
    with pytest.raises(
        ConfigError, match=r"config key 'model': fedrc_cnn normalises its inputs itself .* twice"
    ):
        from_dict(
            {"dataset": "client_files", "data_root": str(dst), "num_clients": 300, "model": "fedrc_cnn"}
        )
    from_dict({"dataset": "client_files", "data_root": str(dst), "num_clients": 300, "model": "simple_cnn"})


def test_fewer_clients_keep_every_role_in_proportion(tmp_path):
    types = [0] * 60 + [1] * 60 + [2] * 60 + [3] * 60 + [4] * 30 + [5] * 30  # the generator's roles
    kept = fedrc.keep(types, 60)
    assert [sum(types[i] == t for i in kept) for t in range(6)] == [12, 12, 12, 12, 6, 6]
    assert kept == sorted(kept) and kept[:12] == list(range(12)) and kept[-6:] == list(range(270, 276))
    assert fedrc.keep(types, 300) == list(range(300))
    # 7 of 300: shares 1.4 x 4 and 0.7 x 2 -> 1 each, the 3 left to the largest remainders (0.7, 0.7,
    # then 0.4 four times: the lowest type)
    assert [sum(types[i] == t for i in fedrc.keep(types, 7)) for t in range(6)] == [2, 1, 1, 1, 1, 1]
    with pytest.raises(ReferenceError, match="--clients 0: between 1 and the generator's 300"):
        fedrc.keep(types, 0)
    src = generated(tmp_path / "gen")  # types cycle 0..5: 50 of each
    dst = fedrc.convert(src, tmp_path / "clients-12", seed=3, clients=12)
    files = sorted(dst.glob("client_*.npz"))
    assert len(files) == 12 and len(list(dst.glob("test_client_*.npz"))) == 3
    with np.load(files[7]) as z:  # the 8th kept: type 1's second client, generated client 7
        assert int(z["reference_client"]) == 7 and int(z["reference_type"]) == 1
        tr, _ = fedrc.split(10, 3, 7)  # its split is generated client 7's, as in the 300
        assert np.array_equal(z["x_train"], pickle.loads((src / "7.pkl").read_bytes())["images"][tr])


def test_the_split_is_fixed_by_the_seed_and_the_client():
    a, b = fedrc.split(200, 0, 5)
    assert len(a) == 180 and len(b) == 20 and not set(a) & set(b)
    assert all(np.array_equal(u, v) for u, v in zip((a, b), fedrc.split(200, 0, 5), strict=True))
    assert not np.array_equal(a, fedrc.split(200, 0, 6)[0]) and not np.array_equal(
        a, fedrc.split(200, 1, 5)[0]
    )


class Boom:
    def __reduce__(self):
        return (print, ("this ran",))


def test_a_pickle_that_is_not_plain_arrays_is_refused_without_running_it(tmp_path, capsys):
    src = generated(tmp_path / "gen", n=2, n_test=2)
    (src / "4.pkl").write_bytes(pickle.dumps({"images": Boom(), "labels": np.zeros(2), "type": 0}))
    with pytest.raises(ReferenceError, match=r"4\.pkl'.*builtins\.print is not allowed"):
        fedrc.convert(src, tmp_path / "clients", seed=0)
    assert "this ran" not in capsys.readouterr().out
    (src / "4.pkl").write_bytes(
        pickle.dumps({"images": np.zeros((2, 28, 27), np.uint8), "labels": np.zeros(2), "type": 0})
    )
    with pytest.raises(ReferenceError, match=r"images must be n x 28 x 28 uint8 .* \[2, 28, 27\]"):
        fedrc.convert(src, tmp_path / "clients", seed=0)
    (src / "4.pkl").unlink()
    with pytest.raises(ReferenceError, match=r"the generator's 4\.pkl is missing \(1 files\)"):
        fedrc.convert(src, tmp_path / "clients", seed=0)


STAND_IN = """
import random, pickle
import numpy as np, torch
from skimage.filters import gaussian
from torchvision import datasets
assert datasets  # the real one reads FashionMNIST from ./data/fmnist-c/origin/
img = gaussian(np.zeros((28, 28, 3)), sigma=1, multichannel=True)  # removed in scikit-image 0.20
assert img.shape == (28, 28, 3) and np.int is int  # removed in NumPy 1.24
q = torch.distributions.dirichlet.Dirichlet(torch.tensor([0.5, 0.0])).sample()  # refused since torch 1.8
assert q[1] < 1e-30  # a class with no images left: (almost) never drawn
for i in range(300):
    x = (np.random.randint(0, 256, (4, 28, 28)) + random.randint(0, 5) + int(torch.randint(0, 3, ()))) % 256
    pickle.dump({"images": x.astype(np.uint8), "labels": np.arange(4, dtype=np.uint8), "type": i % 6},
                open(f"./data/fmnist-c/{i}.pkl", "wb"))
for j in (1, 2, 3):
    pickle.dump({"images": np.zeros((10, 28, 28), np.uint8), "labels": np.arange(10, dtype=np.uint8), "type": j - 1},
                open(f"./data/fmnist-c/test-{j}.pkl", "wb"))
"""


def test_the_generator_runs_seeded_with_todays_libraries(tmp_path, monkeypatch):
    checkout = tmp_path / "FedRC"
    (checkout / "create_c").mkdir(parents=True)
    (checkout / fedrc.GENERATOR).write_text(STAND_IN)
    monkeypatch.setattr(fedrc, "write_fmnist_raw", lambda raw: raw.mkdir(parents=True, exist_ok=True))
    runs = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        clients = fedrc.main(checkout, tmp_path / name, seed, sys.executable)
        with np.load(clients / "client_0000.npz") as z:
            runs.append(z["x_train"].copy())
    # same seed, same clients
    assert np.array_equal(runs[0], runs[1]) and not np.array_equal(runs[0], runs[2])
    (checkout / fedrc.GENERATOR).write_text("raise SystemExit('no ImageMagick')")
    with pytest.raises(
        ReferenceError, match=r"(?s)generator failed \(exit 1; .*generator\.log\):\nno ImageMagick"
    ):
        fedrc.main(checkout, tmp_path / "d", 0, sys.executable)
    with pytest.raises(
        ReferenceError, match="has no create_c/make_fmnist_c.py: not a LINs-lab/FedRC checkout"
    ):
        fedrc.main(tmp_path, tmp_path / "e", 0, sys.executable)


# A stand-in for the reference's training script, with the names the wrapper drives: parse_args,
# SummaryWriter, get_fmnistC_loaders, run_experiment (n_rounds + 1 rounds, a log before the first
# and after each), and datasets.SubFEMNISTC. Its "accuracy" is a number worked out from the clients'
# labels, so the imported values can be checked: the share of label 0 among the test clients'
# scored samples (test/global) or the training clients' test splits (train/global), plus the round
# / 100.
STAND_IN_SCRIPT = """
import argparse, os
import numpy as np

class SummaryWriter:
    def __init__(self, log_dir=None):
        self.log_dir = log_dir
    def add_scalar(self, tag, value, step=None):
        pass

def parse_args(argv):
    p = argparse.ArgumentParser()
    p.add_argument("experiment"); p.add_argument("method")
    for k in ("n_learners", "n_rounds", "bz", "local_steps", "log_freq", "seed", "verbose"):
        p.add_argument("--" + k, type=int)
    for k in ("lr", "sampling_rate"):
        p.add_argument("--" + k, type=float)
    for k in ("optimizer", "lr_scheduler", "suffix"):
        p.add_argument("--" + k)
    return p.parse_args(argv)

def get_fmnistC_loaders(root_path, batch_size, is_validation, test=False):
    raise AssertionError("the wrapper gives the clients")

def share_of_zero(iterators):
    ys = np.concatenate([np.asarray(it.dataset.targets[it.dataset.indices]) for it in iterators])
    return float((ys == 0).mean())

def run_experiment(args):
    from sklearn.cluster import AgglomerativeClustering  # as aggregator.py imports it, after the shim
    d = np.array([[0.0, 1.0, 9.0], [1.0, 0.0, 9.0], [9.0, 9.0, 0.0]])
    labels = AgglomerativeClustering(affinity="precomputed", linkage="complete").fit(d).labels_  # CFL's call
    assert labels[0] == labels[1] != labels[2]
    train = get_fmnistC_loaders("./data/fmnist-c/train", args.bz, False)
    test = get_fmnistC_loaders("./data/fmnist-c/test", args.bz, False, test=True)
    assert args.method == "fedrc" and args.n_learners == 3 and train[3][:6] == [0, 1, 2, 3, 4, 5]
    assert len(train[0]) == 300 and len(test[0]) == 3 and len(train[1][0].dataset.indices) == 9
    loggers = {k: SummaryWriter(os.path.join("logs", "x", k, "global")) for k in ("train", "test")}
    import aggregator
    agg = aggregator.Aggregator([{0: 0, 1: 0, 2: 1, 3: 2, 4: 1, 5: 2}[t] for t in train[3]])
    for r in range(args.n_rounds + 2):  # the log before training, then one after each round
        agg.c_round = r
        agg.write_logs()
        for k, its in (("train", train[2]), ("test", test[2])):
            loggers[k].add_scalar("Test/Metric", share_of_zero(its) + r / 100, r)
            loggers[k].add_scalar("Test/Loss", 1.0, r)
            loggers[k].add_scalar("Train/Metric", 0.5, r)
            loggers[k].add_scalar("Train/Loss", 2.0, r)
"""

# The aggregator the wrapper reads the clusters from after each log: clients 0-2 all with model 0, the
# rest by concept (0 -> model 1, 1 -> model 2, 2 -> model 2), so purity is worked out by hand below.
STAND_IN_AGGREGATOR = """
class Aggregator:
    def __init__(self, groups):
        self.c_round = 0
        self.clients = []
        for i, g in enumerate(groups):
            k = 0 if i < 3 else {0: 1, 1: 2, 2: 2}[g]
            ensemble = type("E", (), {"learners_weights": [0.8 if j == k else 0.1 for j in range(3)]})()
            self.clients.append(type("C", (), {"learners_ensemble": ensemble})())
    def write_logs(self):
        pass
"""

STAND_IN_DATASETS = """
import numpy as np
class SubFEMNISTC:
    def __init__(self, indices, cifar10_data=None, cifar10_targets=None):
        self.indices = np.asarray(indices, dtype=int)
        self.data, self.targets = cifar10_data, cifar10_targets
    def __len__(self):
        return len(self.indices)
    def __getitem__(self, i):
        return self.data[self.indices[i]], int(self.targets[self.indices[i]]), i
"""


def test_reference_runs_on_the_same_clients_land_beside_fedrays(tmp_path, monkeypatch):
    from dataclasses import replace

    from analysis import load_metrics, load_runs
    from fedray.sweeps.sweep_file import load_sweep

    checkout = tmp_path / "FedRC"
    (checkout / "create_c").mkdir(parents=True)
    (checkout / fedrc.GENERATOR).write_text("raise SystemExit('not run: the clients are there')")
    (checkout / "run_experiment.py").write_text(STAND_IN_SCRIPT)
    (checkout / "datasets.py").write_text(STAND_IN_DATASETS)
    (checkout / "aggregator.py").write_text(STAND_IN_AGGREGATOR)
    monkeypatch.setenv("FEDRAY_REFERENCE_ANY_COMMIT", "1")
    out = tmp_path / "out"
    clients = fedrc.convert(generated(tmp_path / "gen"), out / "clients", seed=0)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        f"experiment: fc\ndataset: client_files\ndata_root: {clients}\nnum_clients: 300\n"
        "model: fedrc_cnn\nrounds: 3\nbatch_size: 4\nlr: 0.06\nmomentum: 0.9\nweight_decay: 5.0e-4\n"
        "algorithm: fedrc\nhp: {num_clusters: 3}\n"
    )
    runs = [r.config for r in load_sweep(str(sweep), [], output=str(out)).runs]
    assert fedrc.script_args(runs[0], "x")[:6] == [
        "fmnist-c",
        "fedrc",
        "--n_learners",
        "3",
        "--n_rounds",
        "2",
    ]
    assert fedrc.run_reference(runs, checkout, out, sys.executable, threads=1, log=lambda s: None) == 0
    m = load_metrics(out).set_index(["round", "metric"])["value"]

    def share_of_zero(pattern, n):  # over the clients' scored samples (y_test), from the files
        ys = np.concatenate([np.load(clients / pattern.format(i))["y_test"] for i in range(n)])
        return float((ys == 0).mean())

    test_zero, local_zero = (
        share_of_zero("test_client_{:04d}.npz", 3),
        share_of_zero("client_{:04d}.npz", 300),
    )
    for r in (1, 2, 3):  # the script's log after round r (the one before training is left out)
        assert m[(r, "accuracy")] == pytest.approx(test_zero + r / 100)
        assert m[(r, "local_accuracy")] == pytest.approx(local_zero + r / 100)
        assert m[(r, "train_accuracy")] == 0.5 and m[(r, "train_loss")] == 2.0
    assert 0 not in m.index.get_level_values("round")
    # purity from each client's largest omega: clients 0, 1 (concept 0) and 2 (concept 1) sit with
    # model 0, the other 98 of concept 0 with model 1, the other 99 of concept 1 and all 100 of
    # concept 2 with model 2: (98 + 99 + 100) / 300
    assert m[(3, "purity")] == pytest.approx(297 / 300)
    run = load_runs(out).iloc[0]
    assert run["config"]["source"] == "LINs-lab/FedRC" and run["status"] == "finished"
    # imported once: a second call runs nothing
    assert fedrc.run_reference(runs, checkout, out, sys.executable, threads=1, log=lambda s: None) == 0
    # a result made elsewhere (a GPU machine) for the same arguments is imported without running;
    # one for other arguments is not taken
    (checkout / "run_experiment.py").write_text("raise SystemExit('the script ran')")
    again = tmp_path / "again"
    (again / "reference" / "results").mkdir(parents=True)
    result = f"{fedrc.run_id_of(runs[0])}.json"
    (again / "reference" / "results" / result).write_bytes(
        (out / "reference" / "results" / result).read_bytes()
    )
    assert fedrc.run_reference(runs, checkout, again, sys.executable, threads=1, log=lambda s: None) == 0
    assert load_metrics(again).set_index(["round", "metric"])["value"][(3, "accuracy")] == m[(3, "accuracy")]
    other = [replace(runs[0], lr=0.1)]
    (again / "reference" / "results" / f"{fedrc.run_id_of(other[0])}.json").write_bytes(
        (out / "reference" / "results" / result).read_bytes()
    )
    logged = []
    assert fedrc.run_reference(other, checkout, again, sys.executable, threads=1, log=logged.append) == 1
    assert "the script ran" in logged[-1]


def test_the_clustered_methods_clusters_give_purity_as_fedray_counts_it():
    truth = {0: 0, 1: 1, 2: 1, 3: 1}
    # CFL's clusters_indices: concept 0 whole in cluster 0 (1), concept 1 split 1 / 2 (2): 3 of 4
    assert fedrc.cluster_purity({"clusters": [[0, 1], [2, 3]], "omega": [[1.0]] * 4}, truth) == 0.75
    # without them, each client's largest omega (the same split)
    omega = [[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.3, 0.7]]
    assert fedrc.cluster_purity({"clusters": None, "omega": omega}, truth) == 0.75
    assert fedrc.cluster_purity(None, truth) is None


@pytest.mark.parametrize(
    "over, message",
    [
        (
            {"algorithm": "fedsoft"},
            "fedsoft: LINs-lab/FedRC is driven for fedavg, fedem, fedrc, ifca, fesem, cfl only",
        ),
        ({"momentum": 0.5}, "config key 'momentum': the script's SGD has momentum 0.9, got 0.5"),
        ({"dataset": "fmnist"}, "config key 'dataset': the reference runs on the client_files"),
        (
            {"algorithm": "fedavg"},
            "config key 'hp.persistent_optimizer': the script's clients keep their SGD optimizers",
        ),
        (
            {"algorithm": "ifca", "hp": {"persistent_optimizer": True}},
            "config key 'hp.drop_last': the script's training loaders drop each epoch's last partial batch",
        ),
        (
            {"algorithm": "ifca", "hp": {"persistent_optimizer": True, "drop_last": True}},
            "config key 'hp.empty_cluster': the script overwrites a model no client picked with zeros: set it zero",
        ),
        (
            {
                "algorithm": "fesem",
                "hp": {"persistent_optimizer": True, "drop_last": True, "empty_cluster": "zero"},
            },
            "config key 'hp.switch': the script's FeSEM client that moves gives its new centre the copy it received",
        ),
        (
            {
                "algorithm": "fesem",
                "hp": {
                    "persistent_optimizer": True,
                    "drop_last": True,
                    "empty_cluster": "zero",
                    "switch": "untrained",
                },
            },
            "config key 'hp.first_round': the script's FeSEM clients weigh each model's first loss 1/K",
        ),
    ],
)
def test_what_the_script_cannot_run_is_refused_naming_the_key(over, message):
    cfg = from_dict(
        {"dataset": "digits", "model": "mlp", "momentum": 0.9, "weight_decay": 5e-4, "algorithm": "fedrc"}
    )
    from dataclasses import replace

    bad = replace(cfg, **({"dataset": "client_files"} | over))
    with pytest.raises(ReferenceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        fedrc.script_args(bad, "x")


def test_a_record_is_the_same_run_whatever_its_log_folders_name():
    args = ["fmnist-c", "FedAvg", "--n_rounds", "14", "--seed", "0", "--suffix"]
    assert fedrc.same_args([*args, "a-ref"], [*args, "b-ref"])
    assert not fedrc.same_args([*args[:3], "15", *args[4:], "a-ref"], [*args, "a-ref"])
