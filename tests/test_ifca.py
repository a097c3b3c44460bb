"""IFCA and FeSEM: K = 1 is FedAvg, an empty cluster keeps its model, FeSEM's distance by hand and
its first-round choice."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import load_assignments
from fedray.algorithms import ALGORITHMS, fesem, ifca
from fedray.data import build_federated_data
from fedray.local import make_local_federation
from tests.conftest import small_config
from tests.helpers import run_metrics

OVER = dict(rounds=3, participation=0.5, client_test_fraction=0.2, seed=6)


@pytest.mark.parametrize("algorithm", ["ifca", "fesem"])
def test_one_cluster_is_fedavg(tmp_path, algorithm):
    ref = run_metrics(small_config(tmp_path / "fedavg", **OVER))
    got = run_metrics(small_config(tmp_path / algorithm, algorithm=algorithm, hp={"num_clusters": 1}, **OVER))
    for name, scope in [("accuracy", "cluster"), ("loss", "cluster"), ("local_accuracy", "global"),
                        ("train_loss", "global"), ("train_accuracy", "global"), ("sgd_loss", "global"),
                        ("sgd_accuracy", "global")]:  # fmt: skip
        a = ref[(ref["metric"] == name) & (ref["scope"] == "global")]["value"].tolist()
        b = got[(got["metric"] == name) & (got["scope"] == scope)]["value"].tolist()
        assert len(a) == 3 and a == b, name


def local(tmp_path, **over):
    cfg = small_config(tmp_path, **{**OVER, **over})
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    alg = ALGORITHMS[cfg.algorithm]
    hp = alg.make_hparams(cfg.hp)
    return fed, alg, hp


def test_a_model_nobody_picks_keeps_its_weights(tmp_path):
    fed, alg, hp = local(tmp_path, algorithm="ifca", hp={"num_clusters": 2})
    state = alg.init(fed, hp)
    bad = {k: v.copy() for k, v in state.models[1].items()}
    bad["head.bias"] = np.zeros_like(bad["head.bias"])
    bad["head.bias"][0] = 1e4  # predicts class 0 for everything: a huge loss for every client
    state = ifca.State([state.models[0], bad])
    new, records = alg.round(state, fed, hp, 0)
    assert all(np.array_equal(new.models[1][k], bad[k]) for k in bad)
    assert {"metric": "empty_cluster", "value": 1.0, "scope": "cluster", "entity": 1, "stage": ""} in records
    assert set(new.assigned.values()) == {0} and len(new.assigned) == 3  # half of 6 clients took part
    assert not all(np.array_equal(new.models[0][k], state.models[0][k]) for k in bad)


def test_ifca_records_each_participants_choice(tmp_path):
    cfg = small_config(tmp_path, algorithm="ifca", hp={"num_clusters": 2}, partition="dominant",
                       partition_clusters=2, **OVER)  # fmt: skip
    m = run_metrics(cfg)
    a = load_assignments(cfg.output)
    assert (a.groupby("round").size() == 3).all() and set(a["weight"]) == {1.0}
    assert len(m[m["metric"] == "purity"]) == 3


def test_fesem_distance_by_hand():
    local_ = {"w": np.array([3.0, 4.0], np.float32), "b": np.array([1.0], np.float32), "n": np.array(5)}
    center = {"w": np.array([0.0, 0.0], np.float32), "b": np.array([-1.0], np.float32), "n": np.array(0)}
    assert fesem.center_distance(local_, center) == pytest.approx(
        5.0 + 2.0
    )  # integers are no tensor to compare


def test_fesem_first_round_tries_every_centre_then_follows_distances(tmp_path):
    fed, alg, hp = local(tmp_path, algorithm="fesem", hp={"num_clusters": 2}, participation=1.0)
    state = alg.init(fed, hp)
    s1, _ = alg.round(state, fed, hp, 0)
    assert sorted(s1.assigned) == fed.client_ids
    s2, records = alg.round(s1, fed, hp, 1)
    # round 2: each client trained its centre and moved to the nearest: check one client by hand
    cid = fed.client_ids[0]
    k = s1.assigned[cid]
    reply = fed.map(fesem.fesem_update, [cid], {"models": s1.models, "round": 1, "persistent_optimizer": False,
                                                 "drop_last": False, "assigned": k})[cid]  # fmt: skip
    d = [fesem.center_distance(reply["params"], m) for m in s1.models]
    assert s2.assigned[cid] == int(np.argmin(d))
