"""Test samples that are training samples, for every data set (`fedray.data.held_out`): a test set
made only of training samples refused before any round, naming the data set; some shared said once
with how many; held-out data says nothing."""

from __future__ import annotations

import numpy as np
import pytest

import fedray
from fedray.config.keys import ConfigError
from fedray.data import build_federated_data, check_partition
from fedray.data import client_files as cf
from fedray.experiment.checks import from_dict
from tests.data.test_client_files import META, client


def arrays_config(tmp_path, x_train, y_train, x_test, y_test, **over):
    keys = fedray.from_arrays(x_train, y_train, x_test, y_test, folder=tmp_path / "data")
    base = dict(num_clients=3, model="mlp", rounds=1, partition="iid", output=str(tmp_path / "out"))
    return from_dict({**base, **keys, **over})


def draw(n, seed):
    g = np.random.default_rng(seed)
    return g.integers(0, 256, (n, 1, 4, 4)).astype(np.uint8), (np.arange(n) % 3).astype(np.int64)


def test_a_test_set_that_is_the_training_set_is_refused_naming_the_dataset(tmp_path):
    x, y = draw(30, 0)
    order = np.random.default_rng(1).permutation(30)[:12]  # training samples, shuffled, some of them
    cfg = arrays_config(tmp_path, x, y, x[order], y[order])
    with pytest.raises(ConfigError) as e:
        build_federated_data(cfg)
    assert str(e.value) == (
        "dataset arrays: all 12 of its test samples are training samples (the same input and label): a test "
        "set that is the training set measures nothing; give it held-out samples"
    )


def test_a_test_set_sharing_some_training_samples_is_said_once_with_how_many(tmp_path, capsys):
    x, y = draw(30, 0)
    tx, ty = draw(10, 2)
    relabelled = (y[5:6] + 1) % 3  # a training image under another label: not the same sample
    cfg = arrays_config(
        tmp_path,
        x,
        y,
        np.concatenate([tx, x[[3, 17]], x[5:6]]),
        np.concatenate([ty, y[[3, 17]], relabelled]),
    )
    capsys.readouterr()
    build_federated_data(cfg)
    build_federated_data(cfg)  # a sweep's next run: not said again
    err = capsys.readouterr().err
    line = (
        "fedray: dataset arrays: 2 of its 13 test samples are training samples too (the same input and "
        "label): its test accuracy is partly training accuracy\n"
    )
    assert err.count(line) == 1 and err.count("training accuracy") == 1, err
    # each client's own test split is a test set too: training rows twice over share samples
    doubled = arrays_config(
        tmp_path, np.concatenate([x, x]), np.concatenate([y, y]), tx, ty, client_test_fraction=0.5
    )
    capsys.readouterr()
    build_federated_data(doubled)
    assert "test samples are training samples too" in capsys.readouterr().err
    capsys.readouterr()
    build_federated_data(arrays_config(tmp_path, x, y, tx, ty, client_test_fraction=0.2))
    assert "training" not in capsys.readouterr().err  # held-out samples: nothing said


def test_client_files_whose_test_clients_and_splits_are_training_samples(tmp_path, capsys):
    clients = [client(20, i, test=4) for i in range(3)]
    meta = {**META, "num_classes": 3}

    def files(name, clients, test_clients):
        root = cf.write(tmp_path / name, clients, meta, test_clients)
        base = dict(dataset="client_files", data_root=str(root), num_clients=3, model="mlp", rounds=1)
        return from_dict({**base, "output": str(tmp_path / "out")})

    # every test sample a training one: each client's test split its first training rows, and the
    # test client's test split client 0's last training rows
    copied = [{**c, "x_test": c["x_train"][:4], "y_test": c["y_train"][:4]} for c in clients]
    again = {**client(10, 100), "x_test": clients[0]["x_train"][-5:], "y_test": clients[0]["y_train"][-5:]}
    same = files("same", copied, [again])
    for check in (check_partition, build_federated_data):  # the command's checks, before Ray; the run's
        with pytest.raises(
            ConfigError, match=r"dataset client_files: all 17 of its test samples are training"
        ):
            check(same if check is build_federated_data else same.data_section)
    # one client's test split copied from its training rows: said, with how many
    capsys.readouterr()
    build_federated_data(files("some", [copied[0], *clients[1:]], [client(10, 100, test=5)]))
    err = capsys.readouterr().err
    assert "dataset client_files: 4 of its 17 test samples are training samples too" in err, err


def test_the_embedded_default_and_fashion_mnists_shape_say_nothing(tmp_path, capsys):
    capsys.readouterr()
    build_federated_data(from_dict({"output": str(tmp_path / "out"), "client_test_fraction": 0.2}))
    assert "training samples" not in capsys.readouterr().err
