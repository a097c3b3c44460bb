"""FedProx's Synthetic(alpha, beta) data set (fedray/data/fedprox_synthetic.py), the logreg model, and
FedProx's stragglers (FedAvg drops them, FedProx keeps their partial work): the update rules by hand
and the reduces-to cases."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from fedray.algorithms.baselines import fedavg, fedprox
from fedray.config.coercion import ConfigError
from fedray.data import build_federated_data, partition_label
from fedray.data.fedprox_synthetic import DIM, client_arrays, client_size
from fedray.engine.batched import train_stacked
from fedray.engine.train import train_update
from fedray.engine.update import LocalUpdate
from fedray.experiment.checks import from_dict
from fedray.experiment.local import make_local_federation
from fedray.models import build_model
from fedray.params import get_params, weighted_average
from tests.conftest import small_config
from tests.helpers import run_metrics


def _cfg(tmp_path, **over):
    base = dict(
        dataset="fedprox_synthetic",
        model="logreg",
        num_clients=6,
        batch_size=10,
        lr=0.05,
        momentum=0.0,
        weight_decay=0.0,
        local_epochs=3,
        rounds=2,
        participation=1.0,
    )
    return small_config(tmp_path, **{**base, **over})


def test_each_client_is_drawn_from_the_seed_and_its_id_alone(tmp_path):
    few = build_federated_data(_cfg(tmp_path, num_clients=3))
    many = build_federated_data(_cfg(tmp_path, num_clients=7))
    assert few.sourced and len(few.dataset.train) == 0  # nothing made before a client is used
    src = many.clients.source
    for cid in range(3):  # the same client whatever the others: it can be made when it is sampled
        a, b = few.clients.source.samples(cid), src.samples(cid)
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.y, b.y)
        n = len(many.clients[cid].train) + len(many.clients[cid].test)
        assert n == client_size(0, cid) >= 50 and len(many.clients[cid].train) == int(0.9 * n)
        assert src.split(cid) == (len(many.clients[cid].train), len(many.clients[cid].test))
        np.testing.assert_array_equal(many.clients[cid].test, np.arange(int(0.9 * n), n))
    other = build_federated_data(_cfg(tmp_path, num_clients=3, seed=1))
    assert not np.array_equal(other.clients.source.samples(0).x[:10], few.clients.source.samples(0).x[:10])
    # the global test set is every client's test split, pooled in client order
    pooled = [src.samples(c) for c in range(7)]
    x = np.concatenate([p.x[src.split(c)[0] :] for c, p in enumerate(pooled)])
    np.testing.assert_array_equal(many.dataset.test.x, x)
    assert many.dataset.test.x.shape[1:] == (DIM,) and many.dataset.test.x.dtype == np.float32


def test_a_million_clients_cost_a_seed_until_they_are_used(tmp_path):
    """The data of a run over 10^6 clients is a source and a range: building it makes no client
    (beyond the evaluated ones' test splits), its clients pickle in bytes, and any client is made
    on demand, equal to the one a 30-client run makes."""
    import pickle

    cfg = _cfg(tmp_path, num_clients=1_000_000, eval_clients=20, participation=1e-4)
    data = build_federated_data(cfg)
    assert len(data.clients) == 1_000_000 and len(pickle.dumps(data.clients)) < 500
    assert data.eval_clients == sorted(data.eval_clients) and len(data.eval_clients) == 20
    assert len(data.dataset.test) == sum(data.clients.source.split(c)[1] for c in data.eval_clients)
    small = build_federated_data(_cfg(tmp_path, num_clients=30)).clients.source
    np.testing.assert_array_equal(data.clients.source.samples(17).x, small.samples(17).x)
    assert data.clients[999_999].train.shape == (data.clients.source.split(999_999)[0],)
    with pytest.raises(KeyError):
        data.clients[1_000_000]
    with pytest.raises(ConfigError, match="eval_clients"):  # every client's test split pooled: refused
        _cfg(tmp_path, num_clients=20_000)
    with pytest.raises(ConfigError, match="eval_clients"):
        _cfg(tmp_path, num_clients=10, eval_clients=11)


def test_a_clients_labels_are_a_linear_argmax_and_its_inputs_have_the_papers_covariance():
    cid = next(c for c in range(200) if client_size(0, c) >= 2000)
    x, y, _ = client_arrays(0, 1.0, 1.0, cid)
    # y = argmax(W x + b): one client's data is linearly separable, so a logistic regression fits it
    fit = LogisticRegression(C=1e4, max_iter=5000).fit(x, y)
    assert fit.score(x, y) > 0.97
    # x ~ N(v, diag(j^-1.2)), j = 1..60
    var = x.var(axis=0)
    np.testing.assert_allclose(var[:10], np.arange(1, 11) ** -1.2, rtol=0.15)


def test_beta_spreads_the_clients_inputs_and_alpha_moves_no_label():
    def spread(alpha, beta):
        means = [client_arrays(3, alpha, beta, c)[0].mean() for c in range(150)]
        return float(np.std(means))

    # a client's mean input is B_k + O(1/sqrt(60)), B_k ~ N(0, beta)
    assert spread(0.0, 0.0) < 0.3 < 0.7 < spread(0.0, 1.0)
    # alpha is u_k's scale, and u_k is the mean of every entry of W_k and b_k: it adds
    # u_k (1 + sum_j x_j) to every class's logit alike, so (as in FedProx's generator) it moves no
    # label: the same draws give the same labels for any alpha, up to float near-ties
    for c in range(20):
        a, b = client_arrays(3, 0.0, 1.0, c)[1], client_arrays(3, 5.0, 1.0, c)[1]
        assert np.mean(a == b) > 0.99


def test_its_clients_come_with_it_the_config_says_so_and_reports_name_it(tmp_path):
    for bad, key in (
        ({"partition": "labels"}, "partition"),
        ({"shift": "fedrc_code"}, "shift"),
        ({"synthetic_alpha": -1.0}, "synthetic_alpha"),
    ):
        with pytest.raises(ConfigError, match=key):
            _cfg(tmp_path, **bad)
    with pytest.raises(
        ConfigError,
        match=r"'partition_k' is not read by dataset 'fedprox_synthetic' \(it comes with its own clients",
    ):
        _cfg(tmp_path, partition_k=3)
    with pytest.raises(ConfigError, match="synthetic_alpha"):  # another data set's key
        small_config(tmp_path, synthetic_alpha=0.5)
    cfg = _cfg(tmp_path, synthetic_alpha=0.5, synthetic_beta=0.0)
    assert partition_label(cfg.to_dict()) == "Synthetic(0.5,0)"
    net = build_model("logreg", (DIM,), 10)
    assert sum(p.numel() for p in net.parameters()) == DIM * 10 + 10


# ------------------------------------------------------------------------------------------------
# Stragglers
# ------------------------------------------------------------------------------------------------


def _one_round(cfg):
    from fedray.algorithms import ALGORITHMS

    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    alg = ALGORITHMS[cfg.algorithm]
    hp = alg.make_hparams(cfg.hp)
    state = alg.init(fed, hp)
    new, _ = alg.round(state, fed, hp, 0)
    return fed, state, new, hp


def _trained(fed, cid, start, epochs):
    return train_update(fed.host.client(cid), LocalUpdate(start, 0, epochs=epochs)).params


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox"])
def test_fedavg_drops_the_stragglers_and_fedprox_keeps_their_partial_work_by_hand(tmp_path, algorithm):
    hp = {"stragglers": 0.5} if algorithm == "fedavg" else {"stragglers": 0.5, "mu": 0.0}
    cfg = _cfg(tmp_path, algorithm=algorithm, hp=hp)
    fed, state, new, _ = _one_round(cfg)
    slow = fedavg.stragglers(fed, fedavg.Hparams(stragglers=0.5), list(range(6)), 0)
    assert len(slow) == 3 and all(1 <= e <= 2 for e in slow.values())
    n = fed.num_examples()
    kept = [c for c in range(6) if c not in slow] if algorithm == "fedavg" else list(range(6))
    expect = weighted_average(
        [_trained(fed, c, state.params, slow.get(c)) for c in kept], [n[c] for c in kept]
    )
    for k in expect:
        np.testing.assert_allclose(new.params[k], expect[k], rtol=0, atol=1e-6)


def test_the_stragglers_are_the_same_for_every_algorithm_of_a_seed_and_change_by_round(tmp_path):
    cfg = _cfg(tmp_path, num_clients=20)
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    hp = fedavg.Hparams(stragglers=0.9)
    cids = list(range(20))
    assert fedavg.stragglers(fed, hp, cids, 4) == fedavg.stragglers(
        fed, fedprox.Hparams(stragglers=0.9), cids, 4
    )
    assert len(fedavg.stragglers(fed, hp, cids, 4)) == 18
    assert fedavg.stragglers(fed, hp, cids, 4) != fedavg.stragglers(fed, hp, cids, 5)
    assert fedavg.stragglers(fed, fedavg.Hparams(), cids, 4) == {}


def test_stragglers_reduce_to_fedavg(tmp_path):
    # FedProx with mu = 0 that drops its stragglers is FedAvg with the same stragglers, bit for bit;
    # and no stragglers is plain FedAvg (the stragglers' stream draws nothing)
    over = dict(rounds=3, participation=0.5)
    ref = run_metrics(_cfg(tmp_path / "a", algorithm="fedavg", hp={"stragglers": 0.5}, **over))
    got = run_metrics(
        _cfg(
            tmp_path / "b",
            algorithm="fedprox",
            hp={"stragglers": 0.5, "mu": 0.0, "drop_stragglers": True},
            **over,
        )
    )
    assert got.equals(ref), got.compare(ref)
    plain = run_metrics(_cfg(tmp_path / "c", algorithm="fedavg", **over))
    zero = run_metrics(_cfg(tmp_path / "d", algorithm="fedprox", hp={"stragglers": 0.0, "mu": 0.0}, **over))
    assert zero.equals(plain)
    assert not ref["value"].equals(plain["value"])  # the stragglers did change the run


def test_stragglers_are_checked_before_the_run(tmp_path):
    with pytest.raises(ConfigError, match="local_epochs must be 2 or more"):
        _cfg(tmp_path, algorithm="fedprox", local_epochs=1, hp={"stragglers": 0.5})
    with pytest.raises(ConfigError, match="persistent_optimizer"):
        _cfg(tmp_path, algorithm="fedavg", hp={"stragglers": 0.5, "persistent_optimizer": True})
    with pytest.raises(ConfigError, match="stragglers"):
        _cfg(tmp_path, algorithm="fedavg", hp={"stragglers": 1.0})
    with pytest.raises(ConfigError, match="stragglers"):  # not an hp of algorithms that ignore it
        _cfg(tmp_path, algorithm="scaffold", hp={"stragglers": 0.5})


def test_batched_training_gives_a_straggler_its_own_epochs(tmp_path):
    cfg = _cfg(tmp_path, momentum=0.9)
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    start = get_params(fed.task.build_model())
    epochs = [1, None, 2, None, 1, 3]
    updates = [LocalUpdate(start, 0, epochs=e) for e in epochs]
    got = train_stacked([fed.host.client(c) for c in range(6)], updates)
    for c, e in enumerate(epochs):
        want = _trained(fed, c, start, e)
        for k in want:
            np.testing.assert_allclose(got[c].params[k], want[k], rtol=0, atol=2e-6)
    assert [t.stats.steps for t in got] == [
        -(-len(fed.host.client(c).train_idx) // 10) * (e or 3) for c, e in enumerate(epochs)
    ]


def test_validation_accepts_the_papers_config():
    cfg = from_dict(
        {
            "dataset": "fedprox_synthetic",
            "model": "logreg",
            "num_clients": 30,
            "algorithm": "fedprox",
            "hp": {"mu": 1.0, "stragglers": 0.9},
            "local_epochs": 20,
            "batch_size": 10,
            "output": "/tmp/x",
        }
    )
    assert cfg.hp == {"mu": 1.0, "stragglers": 0.9}
