"""IFCA and FeSEM: K = 1 is FedAvg, an empty cluster keeps its model (or is zeroed, the FedRC
code's option), FeSEM's distance by hand, its first-round choice, and the FedRC code's options for a
mover's contribution and the first round's loss."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import load_assignments
from fedray.algorithms import ALGORITHMS
from fedray.algorithms.clustered import fesem, ifca
from fedray.algorithms.evaluation import member_eval
from fedray.data import build_federated_data
from fedray.experiment.local import make_local_federation
from tests.conftest import small_config
from tests.helpers import run_metrics

MSG = {
    "round": 1,
    "persistent_optimizer": False,
    "drop_last": False,
    "switch": "trained",
    "first_round": "full",
}
OVER = dict(rounds=3, participation=0.5, client_test_fraction=0.2, seed=6)


@pytest.mark.parametrize("algorithm", ["ifca", "fesem"])
def test_one_cluster_is_fedavg(tmp_path, algorithm):
    ref = run_metrics(small_config(tmp_path / "fedavg", **OVER))
    got = run_metrics(small_config(tmp_path / algorithm, algorithm=algorithm, hp={"num_clusters": 1}, **OVER))
    for name, scope in [
        ("accuracy", "cluster"),
        ("loss", "cluster"),
        ("local_accuracy", "global"),
        ("train_loss", "global"),
        ("train_accuracy", "global"),
        ("sgd_loss", "global"),
        ("sgd_accuracy", "global"),
    ]:
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


def test_empty_cluster_zero_overwrites_the_unpicked_model_with_zeros(tmp_path):
    """The FedRC code's average of no models: every float tensor 0, then served as a model."""
    fed, alg, hp = local(tmp_path, algorithm="ifca", hp={"num_clusters": 2, "empty_cluster": "zero"})
    state = alg.init(fed, hp)
    bad = {k: v.copy() for k, v in state.models[1].items()}
    bad["head.bias"] = np.zeros_like(bad["head.bias"])
    bad["head.bias"][0] = 1e4
    new, records = alg.round(ifca.State([state.models[0], bad]), fed, hp, 0)
    assert all(new.models[1][k].dtype == bad[k].dtype and not new.models[1][k].any() for k in bad)
    assert {"metric": "empty_cluster", "value": 1.0, "scope": "cluster", "entity": 1, "stage": ""} in records
    # a zeroed model's logits are 0 for every input: its mean loss is ln C on any client
    cid = fed.client_ids[0]
    loss = fed.map(member_eval, [cid], {"params": new.models[1]})[cid]
    assert loss["loss_sum"] / loss["samples"] == pytest.approx(np.log(fed.task.spec.num_classes), rel=1e-6)


def test_ifca_records_each_participants_choice(tmp_path):
    cfg = small_config(
        tmp_path, algorithm="ifca", hp={"num_clusters": 2}, partition="dominant", partition_clusters=2, **OVER
    )
    m = run_metrics(cfg)
    a = load_assignments(cfg.output)
    assert (a.groupby("round").size() == 3).all() and set(a["weight"]) == {1.0}
    assert len(m[m["metric"] == "purity"]) == 3


def test_fesem_distance_by_hand():
    local_ = {"w": np.array([3.0, 4.0], np.float32), "b": np.array([1.0], np.float32), "n": np.array(5)}
    center = {"w": np.array([0.0, 0.0], np.float32), "b": np.array([-1.0], np.float32), "n": np.array(0)}
    # integers are no tensor to compare
    assert fesem.center_distance(local_, center) == pytest.approx(5.0 + 2.0)


def test_fesem_first_round_tries_every_centre_then_follows_distances(tmp_path):
    fed, alg, hp = local(tmp_path, algorithm="fesem", hp={"num_clusters": 2}, participation=1.0)
    state = alg.init(fed, hp)
    s1, _ = alg.round(state, fed, hp, 0)
    assert sorted(s1.assigned) == fed.client_ids
    s2, records = alg.round(s1, fed, hp, 1)
    # round 2: each client trained its centre and moved to the nearest: check one client by hand
    cid = fed.client_ids[0]
    k = s1.assigned[cid]
    reply = fed.map(fesem.fesem_update, [cid], {**MSG, "models": s1.models, "assigned": k})[cid]
    d = [fesem.center_distance(reply["params"], m) for m in s1.models]
    assert s2.assigned[cid] == int(np.argmin(d))


def test_fesem_switch_untrained_gives_the_new_centre_its_own_copy(tmp_path):
    """The FedRC code's quirk: a client that moves from k to k' contributes the k' it received.
    Centre 1 is put halfway between centre 0 and client's trained centre 0, so by the per-tensor
    L2 distance (half the distance to centre 0) the client moves to 1."""
    fed, alg, hp = local(tmp_path, algorithm="fesem", hp={"num_clusters": 2})
    m0 = alg.init(fed, hp).models[0]
    cid = fed.client_ids[0]

    def reply(models, switch):
        msg = {**MSG, "models": models, "assigned": 0, "switch": switch}
        return fed.map(fesem.fesem_update, [cid], msg)[cid]

    trained = reply([m0, m0], "trained")["params"]
    half = {k: ((m0[k] + trained[k]) / 2).astype(m0[k].dtype) for k in m0}
    assert fesem.center_distance(trained, half) == pytest.approx(
        fesem.center_distance(trained, m0) / 2, rel=1e-5
    )
    paper, code = reply([m0, half], "trained"), reply([m0, half], "untrained")
    assert paper["cluster"] == code["cluster"] == 1
    assert all(np.array_equal(paper["params"][k], trained[k]) for k in m0)
    assert all(np.array_equal(code["params"][k], half[k]) for k in m0)
    assert code["num_examples"] == paper["num_examples"]


def test_fesem_first_round_split_is_the_loss_over_k(tmp_path):
    """first_round: split weighs each copy's loss 1/K (the code's uniform sample weights): with no
    weight decay, SGD with momentum on loss/K at lr eta is SGD on the loss at lr eta/K."""
    over = dict(algorithm="fesem", weight_decay=0.0, momentum=0.9)
    fed, alg, hp = local(tmp_path / "a", hp={"num_clusters": 2}, lr=0.1, **over)
    fed2, _, _ = local(tmp_path / "b", hp={"num_clusters": 2}, lr=0.05, **over)
    models = alg.init(fed, hp).models
    cid = fed.client_ids[0]
    msg = {**MSG, "models": models, "assigned": None, "round": 0}
    split = fed.map(fesem.fesem_update, [cid], {**msg, "first_round": "split"})[cid]
    half_lr = fed2.map(fesem.fesem_update, [cid], msg)[cid]
    full = fed.map(fesem.fesem_update, [cid], msg)[cid]
    assert split["cluster"] == half_lr["cluster"]
    for k in models[0]:
        np.testing.assert_allclose(split["params"][k], half_lr["params"][k], rtol=1e-4, atol=1e-6)
    assert not all(np.allclose(split["params"][k], full["params"][k]) for k in models[0])
