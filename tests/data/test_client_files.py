"""dataset: client_files: a natively federated dataset, one NumPy file per client, read safely;
bad files are errors naming the file, before anything starts."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import load_metrics
from fedray.config.keys import ConfigError
from fedray.data import build_federated_data
from fedray.data import client_files as cf
from fedray.experiment.checks import from_dict
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import execute
from tests.conftest import ROOT
from tests.helpers import clis_without_ray

META = {"num_classes": 3, "input_shape": [1, 6, 6], "scale": 1 / 255}


def client(n: int, seed: int, test: int = 0, group: int | None = None) -> dict:
    g = np.random.default_rng(seed)
    y = g.integers(0, 3, n + test)
    x = (y[:, None, None] * 80 + g.integers(0, 40, (n + test, 6, 6))).astype(np.uint8)  # learnable
    out = {"x_train": x[:n], "y_train": y[:n]}
    if test:
        out.update(x_test=x[n:], y_test=y[n:])
    if group is not None:
        out["group"] = np.array(group)
    return out


def folder(tmp_path, n_clients=4, tests=1, **over):
    clients = over.pop("clients", [client(30 + 5 * i, i, test=6, group=i % 2) for i in range(n_clients)])
    test_clients = [client(20, 100 + i, test=10) for i in range(tests)]
    return cf.write(tmp_path / "data", clients, {**META, **over}, test_clients)


def config(tmp_path, root, **over):
    base = dict(
        dataset="client_files",
        data_root=str(root),
        num_clients=4,
        model="mlp",
        rounds=2,
        local_epochs=1,
        batch_size=8,
        lr=0.05,
        output=str(tmp_path / "out"),
    )
    return from_dict({**base, **over})


def test_client_files_are_the_clients_and_the_test_clients(tmp_path):
    root = folder(tmp_path)
    data = build_federated_data(config(tmp_path, root))
    assert sorted(data.clients) == [0, 1, 2, 3, 4] and data.test_clients == [4]
    for cid in range(4):
        want = client(30 + 5 * cid, cid, test=6)
        ix = data.clients[cid]
        assert np.array_equal(data.dataset.train.x[ix.train][:, 0], want["x_train"])
        assert np.array_equal(data.dataset.train.y[ix.test], want["y_test"])
    assert data.groups.tolist() == [0, 1, 0, 1]
    assert len(data.clients[4].train) == 20 and len(data.clients[4].test) == 10
    assert data.dataset.spec.num_classes == 3 and data.dataset.spec.scale == pytest.approx(1 / 255)


def test_a_run_on_client_files_learns_and_reports_the_test_clients_accuracy(tmp_path):
    cfg = config(tmp_path, folder(tmp_path), rounds=3, local_epochs=10, lr=0.1)
    list(execute(cfg, make_local_federation))
    m = load_metrics(cfg.output, scope="global")
    final = m[m["round"] == 3].set_index("metric")["value"]
    assert final["accuracy"] > 0.8 and final["local_accuracy"] > 0.8  # separable by brightness


BAD = [
    ("no meta", lambda root: (root / "meta.json").unlink(), "meta.json' does not exist"),
    ("gap in the files", lambda root: (root / "client_0002.npz").unlink(), "client_0002.npz' is missing"),
    (
        "shape mismatch",
        lambda root: np.savez(
            root / "client_0001.npz", x_train=np.zeros((5, 7, 7), np.uint8), y_train=np.zeros(5, np.int64)
        ),
        "samples of shape [1, 7, 7]",
    ),
    (
        "labels out of range",
        lambda root: np.savez(
            root / "client_0001.npz", x_train=np.zeros((5, 6, 6), np.uint8), y_train=np.array([0, 1, 2, 3, 0])
        ),
        "y_train has label 3, outside 0 .. 2",
    ),
    (
        "length mismatch",
        lambda root: np.savez(
            root / "client_0001.npz", x_train=np.zeros((5, 6, 6), np.uint8), y_train=np.zeros(4, np.int64)
        ),
        "x_train has 5 samples but y_train has 4",
    ),
    (
        "empty client",
        lambda root: np.savez(
            root / "client_0001.npz", x_train=np.zeros((0, 6, 6), np.uint8), y_train=np.zeros(0, np.int64)
        ),
        "the client has no training samples",
    ),
    (
        "a pickle",
        lambda root: np.savez(
            root / "client_0001.npz",
            x_train=np.array([{"x": 1}], dtype=object),
            y_train=np.zeros(1, np.int64),
        ),
        "without pickles",
    ),
]


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory):
    """`fedray run` over a folder spoiled each BAD way: (exit code, stderr) each, all in one process
    that must never import Ray."""
    cases = []
    for name, spoil, _ in BAD:
        tmp = tmp_path_factory.mktemp(name.replace(" ", "-"))
        root = folder(tmp)
        spoil(root)
        cases.append(
            [
                "run",
                "--set",
                "dataset=client_files",
                "--set",
                f"data_root={root}",
                "--set",
                "num_clients=4",
                "--set",
                "model=mlp",
                "--output",
                str(tmp / "out"),
            ]
        )
    return clis_without_ray(cases, ROOT)


@pytest.mark.parametrize("case", range(len(BAD)), ids=[b[0] for b in BAD])
def test_a_bad_client_file_is_an_error_naming_it_before_ray(case, bad_runs):
    rc, err = bad_runs[case]
    assert rc == 2, err
    assert BAD[case][2] in err, err


def test_client_count_must_match_num_clients(tmp_path):
    root = folder(tmp_path)
    with pytest.raises(ConfigError, match="holds 4 client files; set num_clients: 4"):
        config(tmp_path, root, num_clients=5)
