"""FedSoft: importance weights and aggregation weights by hand, per-cluster selection, the proximal
pull, and lam = 0 with one cluster is each client's local training alone."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import load_assignments
from fedray.algorithms import ALGORITHMS
from fedray.algorithms.clustered import fedsoft
from fedray.data import build_federated_data
from fedray.engine.train import train_update
from fedray.engine.update import LocalUpdate
from fedray.experiment.local import make_local_federation
from tests.conftest import small_config
from tests.helpers import run_metrics


def test_importance_by_hand():
    losses = np.array([[0.1, 2.0, 0.5], [0.3, 0.1, 0.5], [1.0, 1.0, 1.0]])
    # smallest loss per sample: model 0, model 1, model 0 (a tie goes to the first); model 2 never
    np.testing.assert_allclose(fedsoft.importance(losses, 1e-4), [2 / 3, 1 / 3, 1e-4])


def test_aggregation_weights_by_hand():
    v = fedsoft.aggregation_weights({0: np.array([0.5, 0.5]), 1: np.array([1.0, 1e-4])}, {0: 10, 1: 30})
    # cluster 0: masses 5 and 30; cluster 1: 5 and 0.003
    np.testing.assert_allclose(v[0], [5 / 35, 5 / 5.003])
    np.testing.assert_allclose(v[1], [30 / 35, 0.003 / 5.003])


def test_selection_draws_per_cluster_without_replacement():
    v = {0: np.array([0.0, 0.5]), 1: np.array([0.5, 0.5]), 2: np.array([0.5, 0.0])}
    chosen = fedsoft.select(v, 2, np.random.default_rng(0))
    assert chosen == [[1, 2], [0, 1]]  # a client with v_kc = 0 is never drawn for cluster k
    assert fedsoft.select(v, 5, np.random.default_rng(0)) == [[1, 2], [0, 1]]  # at most the possible ones


def test_anchor_is_the_importance_weighted_mean():
    models = [{"w": np.array([0.0, 2.0], np.float32)}, {"w": np.array([4.0, 2.0], np.float32)}]
    np.testing.assert_allclose(fedsoft.anchor(models, np.array([0.75, 0.25]))["w"], [1.0, 2.0])


def test_no_pull_and_one_cluster_is_local_training(tmp_path):
    cfg = small_config(
        tmp_path, algorithm="fedsoft", hp={"num_clusters": 1, "lam": 0.0}, participation=1.0, rounds=3
    )
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    alg = ALGORITHMS["fedsoft"]
    hp = alg.make_hparams(cfg.hp)
    state = alg.init(fed, hp)
    start = state.models[0]
    for rnd in range(3):
        state, _ = alg.round(state, fed, hp, rnd)
    cid = fed.client_ids[2]
    client = fed.host.client(cid)
    params = start
    for rnd in range(3):
        params = train_update(client, LocalUpdate(params, rnd)).params
    personal = fed.host.get_state(cid)
    for name, p in params.items():
        np.testing.assert_array_equal(personal[name], p, err_msg=name)


def test_fedsoft_records_soft_assignments_and_personal_accuracy(tmp_path):
    cfg = small_config(
        tmp_path, algorithm="fedsoft", hp={"num_clusters": 2, "tau": 2}, rounds=3, client_test_fraction=0.2
    )
    m = run_metrics(cfg)
    a = load_assignments(cfg.output)
    assert sorted(a["round"].unique()) == [1, 3]  # estimated at rounds 0 and 2 (tau = 2)
    assert a.groupby(["round", "client"])["weight"].sum().ge(1.0).all()  # u sums to 1 (plus sigma)
    assert len(m[(m["metric"] == "local_accuracy") & (m["scope"] == "global")]) == 3
    with pytest.raises(Exception, match="'hp.tau'"):
        small_config(tmp_path, algorithm="fedsoft", hp={"tau": 0})
