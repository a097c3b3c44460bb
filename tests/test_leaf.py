"""LEAF's FEMNIST and Shakespeare: their users are the clients, read from the JSON LEAF's scripts
write (small files made here: nothing downloads)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedray.config.keys import ConfigError
from fedray.data.leaf import FEMNIST, SHAKESPEARE, SHAKESPEARE_VOCAB, leaf_data, read_users
from fedray.experiment.validation import from_dict


def _femnist_user(rng: np.random.Generator, n: int) -> dict:
    grey = rng.integers(0, 256, size=(n, 784)) / 255  # LEAF writes 1 - pixel / 255: k / 255
    return {"x": grey.tolist(), "y": rng.integers(0, 62, n).tolist()}


def _shakespeare_user(rng: np.random.Generator, n: int) -> dict:
    pick = lambda k: "".join(rng.choice(list(SHAKESPEARE_VOCAB), k))  # noqa: E731
    return {"x": [pick(80) for _ in range(n)], "y": [pick(1) for _ in range(n)]}


def write_leaf(
    root: Path, sizes: dict[str, int], kind: str = "femnist", folder: str = "all_data", files: int = 2
) -> Path:
    """LEAF JSON as its scripts write it: the users spread over ``files`` files of ``folder``."""
    rng = np.random.default_rng(len(sizes))
    make = _femnist_user if kind == "femnist" else _shakespeare_user
    names = list(sizes)
    (root / folder).mkdir(parents=True, exist_ok=True)
    for f in range(files):
        mine = names[f::files]
        data = {
            "users": mine,
            "num_samples": [sizes[u] for u in mine],
            "user_data": {u: make(rng, sizes[u]) for u in mine},
        }
        (root / folder / f"{folder}_{f}.json").write_text(json.dumps(data))
    return root


def leaf_config(tmp_path, root, kind="femnist", **over):
    model = "leaf_cnn" if kind == "femnist" else "leaf_lstm"
    return from_dict(
        {"dataset": kind, "data_root": str(root), "model": model, "output": str(tmp_path / "out"), **over}
    )


def test_femnist_users_are_the_clients_split_by_sample_as_leaf_splits_them(tmp_path):
    root = write_leaf(tmp_path / "femnist", {"f_a": 10, "f_b": 2, "f_c": 1, "f_d": 5})
    with pytest.raises(
        ConfigError, match=r"config key 'num_clients': the femnist users of .* are 3; set num_clients: 3"
    ):
        leaf_config(tmp_path, root, num_clients=4)
    cfg = leaf_config(tmp_path, root, num_clients=3)
    data = leaf_data(FEMNIST, cfg)
    # a user needs two samples (f_c has one); it trains on max(1, int(0.9 n)) of them, one of two
    assert [(len(c.train), len(c.test)) for c in data.clients.values()] == [(9, 1), (1, 1), (4, 1)]
    assert len(data.dataset.test) == 3  # every user's test samples
    users = read_users(FEMNIST, root)
    assert users.names == ["f_a", "f_c", "f_b", "f_d"]  # in the files' order
    # the grey levels exactly, as uint8 read back by the data set's scale
    raw = json.loads((root / "all_data" / "all_data_0.json").read_text())["user_data"]["f_a"]
    x, y = data.dataset.train.x, data.dataset.train.y
    a = data.clients[0]
    got = sorted(map(tuple, x[np.concatenate([a.train, a.test])].reshape(10, 784)))
    want = sorted(map(tuple, np.rint(np.asarray(raw["x"]) * 255).astype(np.uint8)))
    assert got == want and sorted(y[np.concatenate([a.train, a.test])]) == sorted(raw["y"])
    assert data.dataset.spec.input_shape == (1, 28, 28) and data.dataset.spec.scale == 1 / 255

    # the split is the data seed's, not the run's: another seed trains on the same samples, another
    # data_seed draws other test samples
    def tests(d):
        return [d.dataset.train.x[d.clients[c].test].tobytes() for c in d.clients]

    assert tests(leaf_data(FEMNIST, leaf_config(tmp_path, root, num_clients=3))) == tests(data)
    assert tests(leaf_data(FEMNIST, leaf_config(tmp_path, root, num_clients=3, seed=4))) == tests(data)
    assert tests(leaf_data(FEMNIST, leaf_config(tmp_path, root, num_clients=3, data_seed=4))) != tests(data)


def test_leaf_min_samples_keeps_the_users_with_as_many_samples(tmp_path):
    root = write_leaf(tmp_path / "femnist", {f"u{i}": 2 + 3 * i for i in range(8)}, files=1)  # 2, 5, ..., 23
    cfg = leaf_config(tmp_path, root, num_clients=6, leaf_min_samples=6)  # 8, 11, ..., 23
    assert [len(c.train) + len(c.test) for c in leaf_data(FEMNIST, cfg).clients.values()] == [
        8,
        11,
        14,
        17,
        20,
        23,
    ]
    with pytest.raises(ConfigError, match=r"'leaf_train_fraction': must be"):
        leaf_config(tmp_path, root, num_clients=8, leaf_train_fraction=1.0)


def test_a_folder_leaf_split_already_is_read_as_split_and_its_keys_stay_leafs(tmp_path):
    root = tmp_path / "femnist"
    write_leaf(root, {"a": 6, "b": 3}, folder="train", files=1)
    write_leaf(root, {"a": 2, "b": 1}, folder="test", files=1)
    cfg = leaf_config(tmp_path, root, num_clients=2)
    data = leaf_data(FEMNIST, cfg)
    assert [(len(c.train), len(c.test)) for c in data.clients.values()] == [(6, 2), (3, 1)]
    with pytest.raises(ConfigError, match=r"'leaf_train_fraction': .* is split by LEAF already"):
        leaf_config(tmp_path, root, num_clients=2, leaf_train_fraction=0.8)


def test_shakespeare_is_next_character_prediction_split_in_order_as_leaf_splits_it(tmp_path):
    root = write_leaf(
        tmp_path / "shakespeare", {"HAMLET": 100, "OPHELIA": 92, "YORICK": 88}, kind="shakespeare"
    )
    cfg = leaf_config(tmp_path, root, "shakespeare", leaf_train_fraction=0.1)
    data = leaf_data(SHAKESPEARE, cfg)
    assert len(SHAKESPEARE_VOCAB) == 80 and data.dataset.spec.input_shape == (80,)
    raw = json.loads((root / "all_data" / "all_data_0.json").read_text())["user_data"]["HAMLET"]
    x, y = data.dataset.train.x, data.dataset.train.y
    text = lambda rows: ["".join(SHAKESPEARE_VOCAB[i] for i in r) for r in x[rows]]  # noqa: E731
    # HAMLET's first int(0.1 * 100) = 10 samples train; its test samples start 79 later (10 + 79 =
    # 89), so no test sample's 80 characters and next one overlap a training sample's
    assert text(data.clients[0].train) == raw["x"][:10] and text(data.clients[0].test) == raw["x"][89:]
    assert "".join(SHAKESPEARE_VOCAB[i] for i in y[data.clients[0].test]) == "".join(raw["y"][89:])
    # YORICK's 88: 8 train, and 8 + 79 = 87 leaves it one test sample (with 87 it would have none,
    # and be dropped as LEAF drops such a role: the next test)
    assert cfg.num_clients == 3 and [(len(c.train), len(c.test)) for c in data.clients.values()] == [
        (10, 11),
        (8, 1),
        (9, 4),
    ]
    bad = json.loads((root / "all_data" / "all_data_1.json").read_text())
    bad["user_data"]["OPHELIA"]["y"][0] = "é"
    (root / "all_data" / "all_data_1.json").write_text(json.dumps(bad))
    with pytest.raises(
        ConfigError, match=r"all_data_1\.json: user 'OPHELIA': character 'é' is not one of LEAF's 80 symbols"
    ):
        leaf_config(tmp_path, root, "shakespeare", leaf_train_fraction=0.1)


def test_what_is_read_is_kept_beside_the_json_and_read_back(tmp_path):
    import fedray.data.leaf as leaf

    root = write_leaf(tmp_path / "femnist", {"a": 4, "b": 3})
    first = read_users(FEMNIST, root)
    (kept,) = root.glob(".fedray-leaf-femnist-*.npz")
    leaf._READ.clear()
    again = read_users(FEMNIST, root)
    assert again.names == first.names and np.array_equal(again.x, first.x)
    (root / "all_data" / "all_data_0.json").touch()  # touched, not changed: the same arrays
    leaf._READ.clear()
    read_users(FEMNIST, root)
    assert list(root.glob(".fedray-leaf-femnist-*.npz")) == [kept]


def test_a_missing_folder_is_one_line_before_anything_runs(tmp_path):
    from tests.helpers import FEDRAY, run

    p = run(
        [*FEDRAY, "run", "--set", "dataset=femnist", "--set", f"data_root={tmp_path / 'none'}"], cwd=tmp_path
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "no LEAF data in" in p.stderr and "all_data/*.json" in p.stderr and "preprocess.sh" in p.stderr


@pytest.mark.parametrize("kind", ["femnist", "shakespeare"])
def test_fedavg_runs_on_leafs_users_with_leafs_model(tmp_path, kind):
    from fedray.experiment.loop import Finished, execute
    from fedray.federation.local import make_local_federation

    sizes = {"a": 12, "b": 9, "c": 7} if kind == "femnist" else {"a": 100, "b": 95, "c": 92}
    root = write_leaf(tmp_path / kind, sizes, kind=kind)
    split = {} if kind == "femnist" else {"leaf_train_fraction": 0.1}  # the gap of 79 takes 80 samples
    cfg = leaf_config(tmp_path, root, kind, num_clients=3, rounds=2, batch_size=4, lr=0.05, **split)
    events = list(execute(cfg, make_local_federation))
    assert isinstance(events[-1], Finished) and 0 <= events[-1].summary["final_accuracy"] <= 1
    assert events[-1].summary["batched_calls"] == 0


def test_leafs_lstm_trains_one_client_at_a_time_and_on_refuses_it(tmp_path, capfd):
    from fedray.config import notes
    from fedray.engine import choice
    from fedray.models import build_model

    lstm = lambda: build_model("leaf_lstm", (80,), 80)  # noqa: E731
    auto = choice.choose("auto", "cuda", lstm)
    assert not auto.stacked and "LSTM" in auto.why
    # a host on a GPU under auto says once that it trains one client at a time, and why
    import dataclasses

    from fedray.data import ArrayDataset, DataSpec
    from fedray.engine.client import Task
    from fedray.federation.host import ClientHost

    task = Task(0, "leaf_lstm", DataSpec((80,), 80, 1.0), 1, 4, 0.1, 0.0, 0.0, 1.0, 8)
    data = ArrayDataset(np.zeros((4, 80), np.uint8), np.zeros(4, np.int64))
    host = ClientHost(dataclasses.replace(task, batched_clients="auto"), data, {})
    host.device = __import__("torch").device("cuda")  # as on a GPU (the decision only reads its type)
    notes._SAID.clear()
    assert not host.trains_batched() and not ClientHost(task, data, {}).trains_batched()
    host._engine = None
    assert not host.trains_batched()
    said = capfd.readouterr().err
    assert (
        said.count(
            "fedray: batched_clients auto trains one client at a time here: the model cannot train stacked: layer 'encoder.lstm' is LSTM"
        )
        == 1
    )
    root = write_leaf(tmp_path / "shakespeare", {"a": 100, "b": 95}, kind="shakespeare")
    with pytest.raises(
        ConfigError, match=r"'batched_clients': on: model leaf_lstm cannot train batched: layer .* is LSTM"
    ):
        leaf_config(tmp_path, root, "shakespeare", leaf_train_fraction=0.1, batched_clients="on")


def test_leafs_models_are_leafs(tmp_path):
    from fedray.models import build_model

    cnn = build_model("leaf_cnn", (1, 28, 28), 62)
    assert sum(p.numel() for p in cnn.parameters()) == 6_603_710  # LEAF's FEMNIST CNN
    lstm = build_model("leaf_lstm", (80,), 80)
    # embedding 8, two LSTM layers of 256, the head on the last step: LEAF's 817,872 and 2,048 more,
    # as PyTorch's LSTM keeps two bias vectors a layer where TensorFlow's cell keeps one (the same sums)
    assert sum(p.numel() for p in lstm.parameters()) == 819_920
    import torch

    assert lstm(torch.zeros(3, 80)).shape == (3, 80)
