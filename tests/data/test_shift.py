"""FedRC's shift benchmark: client roles of both presets, label maps, the shifted data, the test
clients, the clients table, and FedRC on it in-process and on Ray."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import load_clients, load_metrics
from fedray.config import seeding
from fedray.config.keys import ConfigError
from fedray.data import build_federated_data, partition_for
from fedray.data.corruptions import corrupt
from fedray.data.shift import assign_shifts, label_map, roles
from fedray.experiment.checks import from_dict
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import execute
from tests.helpers import FMNIST_NAMES, mnist_like, round_metrics


@pytest.mark.parametrize(
    "preset, concepts, corrupted", [("fedrc_code", [120, 90, 90], 120), ("fedrc_paper", [150, 75, 75], 90)]
)
def test_role_presets_give_the_documented_shares(preset, concepts, corrupted):
    r = roles(300, preset, np.random.default_rng(0))
    assert np.bincount([c for c, _ in r]).tolist() == concepts
    assert sum(x for _, x in r) == corrupted
    if preset == "fedrc_code":  # label changes with and without corruption split evenly between the maps
        assert sum(1 for c, x in r if c == 1 and x) == sum(1 for c, x in r if c == 2 and x) == 30
    shifts = assign_shifts(300, preset, seed=4)
    assert all(1 <= s.severity <= 5 for s in shifts if s.corruption)
    assert shifts == assign_shifts(300, preset, seed=4)  # seeded
    assert shifts != assign_shifts(300, preset, seed=5)


def test_label_maps():
    y = np.arange(10)
    assert label_map(y, 0, 10).tolist() == list(range(10))
    assert label_map(y, 1, 10).tolist() == list(range(9, -1, -1))  # C - 1 - y
    assert label_map(y, 2, 10).tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0]  # (y + 1) mod C


def shift_config(tmp_path, data=None, **over):
    data = data or tmp_path / "data"
    if not data.exists():  # random images: written once, shared by the configs that name the folder
        mnist_like(data, FMNIST_NAMES, n_train=400, n_test=100)
    base = dict(
        dataset="fmnist",
        data_root=str(data),
        model="simple_cnn",
        num_clients=10,
        partition="clientwise_dirichlet",
        partition_beta=1.0,
        shift="fedrc_code",
        client_test_fraction=0.1,
        rounds=2,
        local_epochs=1,
        batch_size=16,
        output=str(tmp_path / "out"),
    )
    base.update(over)
    return from_dict(base)


def test_shifted_data_applies_each_clients_concept_and_corruption(tmp_path):
    cfg = shift_config(tmp_path)
    plain = build_federated_data(shift_config(tmp_path, shift="none"))  # the same files
    data = build_federated_data(cfg)
    assert data.test_clients == [10, 11, 12]
    part = partition_for(cfg, plain.dataset.train.y, 10)
    for cid, s in enumerate(data.shifts[:10]):
        ix = data.clients[cid]
        mine = np.sort(np.concatenate([ix.train, ix.test]))  # one contiguous range, in partition order
        orig = part.clients[cid]
        # the partition's samples, relabelled and corrupted with the client's own generator
        assert np.array_equal(
            data.dataset.train.y[mine], label_map(plain.dataset.train.y[orig], s.concept, 10)
        )
        x0 = plain.dataset.train.x[orig]
        rng = seeding.rng(cfg.seed, "shift/corrupt", cid)
        expect = corrupt(x0, s.corruption, s.severity, rng) if s.corruption else x0
        assert np.array_equal(data.dataset.train.x[mine], expect)
        assert not s.corruption or s.corruption == "identity" or not np.array_equal(expect, x0)
    # test clients: the whole test set, uncorrupted, under each concept, split 90/10
    for k, cid in enumerate(data.test_clients):
        ix = data.clients[cid]
        assert (len(ix.train), len(ix.test)) == (90, 10)
        xs = data.dataset.train.x[np.sort(np.concatenate([ix.train, ix.test]))]
        assert np.array_equal(xs, plain.dataset.test.x)
        ys = data.dataset.train.y[np.sort(np.concatenate([ix.train, ix.test]))]
        assert np.array_equal(ys, label_map(plain.dataset.test.y, k, 10))
    np.testing.assert_array_equal(data.groups, [s.concept for s in data.shifts[:10]])


def test_test_clients_never_train_and_give_the_global_accuracy(tmp_path):
    cfg = shift_config(tmp_path, algorithm="fedrc", hp={"num_clusters": 3, "finetune": True})
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    assert fed.client_ids == list(range(10)) and fed.test_client_ids == [10, 11, 12]
    assert sorted(fed.num_examples()) == list(range(10))
    assert all(c < 10 for c in fed.sample(1.0, np.random.default_rng(0)))
    list(execute(cfg, make_local_federation))
    m = load_metrics(cfg.output)
    acc = m[m["metric"] == "accuracy"]
    per_test = acc[acc["scope"] == "client"]
    assert sorted(per_test["entity"].unique()) == [10, 11, 12]
    for rnd, rows in per_test.groupby("round"):
        mean = acc[(acc["scope"] == "global") & (acc["round"] == rnd)]["value"].item()
        assert mean == pytest.approx(rows["value"].mean())
    assert {"purity", "local_accuracy", "local_accuracy_ft"} <= set(m["metric"])
    ft = m[m["metric"] == "accuracy_ft"]  # FedRC-FT's global accuracy: the test clients tune too
    assert sorted(ft[ft["scope"] == "client"]["entity"].unique()) == [10, 11, 12]
    assert len(ft[ft["scope"] == "global"]) == len(acc[acc["scope"] == "global"])
    c = load_clients(cfg.output)
    assert (c["role"] == "test").sum() == 3 and (c[c["role"] == "test"]["num_test"] == 10).all()
    assert set(c[c["role"] == "train"]["concept"]) <= {"y", "C-1-y", "(y+1) mod C"}


def test_shift_needs_28x28_grayscale(tmp_path):
    with pytest.raises(ConfigError, match=r"'shift'.*1x28x28"):
        from_dict({"dataset": "digits", "shift": "fedrc_code"})
    with pytest.raises(ConfigError, match=r"'shift'.*fedrc_paper"):
        from_dict({"dataset": "digits", "shift": "fedrc"})


def test_a_run_without_shift_keeps_its_run_id():
    # `shift` came after results existed: at "none" it stays out of the id (earlier sweeps still skip)
    cfg = from_dict({})
    assert cfg.run_id() == from_dict({"shift": "none"}).run_id()
    assert cfg.run_id() != from_dict({"dataset": "fmnist", "model": "mlp", "shift": "fedrc_code"}).run_id()


def test_fedrc_on_the_shift_benchmark_is_the_same_in_process_and_on_3_actors(ray_session, tmp_path):
    """The test clients (their E-step after every round, their evaluation) on actors. One actor
    holding every client is tested once, for FedAvg (test_ray.py), not again here (CI time)."""
    from actors.federation import make_ray_federation

    hp = {"num_clusters": 3}
    data = tmp_path / "data"
    local = shift_config(tmp_path / "local", data, algorithm="fedrc", hp=hp, participation=0.5)
    list(execute(local, make_local_federation))
    ref = round_metrics(local.output)
    cfg = shift_config(tmp_path / "ray3", data, algorithm="fedrc", hp=hp, participation=0.5, num_actors=3)
    list(execute(cfg, make_ray_federation))
    got = round_metrics(cfg.output)
    assert got.equals(ref), f"3 actors differ from --local:\n{got.compare(ref)}"


def test_fedrc_global_accuracy_at_a_round_does_not_depend_on_eval_every(tmp_path):
    # The test clients' E-step runs after every round (the FedRC code at log_freq 1), not at each
    # evaluation: evaluated every round or only at the end, round 4 reads the same.
    got = {}
    for every in (1, 2, 4):
        cfg = shift_config(
            tmp_path,
            data=tmp_path / "data",
            algorithm="fedrc",
            rounds=4,
            eval_every=every,
            hp={"num_clusters": 2},
            output=str(tmp_path / f"out{every}"),
        )
        list(execute(cfg, make_local_federation))
        m = load_metrics(cfg.output, scope="global")
        got[every] = (
            m[(m["round"] == 4) & m["metric"].isin(["accuracy", "loss", "local_accuracy", "train_accuracy"])]
            .set_index("metric")["value"]
            .to_dict()
        )
    assert got[1] == got[2] == got[4] and set(got[1]) == {
        "accuracy",
        "loss",
        "local_accuracy",
        "train_accuracy",
    }
