"""Clustered sampling (Fraboni et al. 2021): strata by hand, distances by hand, the unbiased weights,
and the reduction to FedAvg."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedray.algorithms import ALGORITHMS
from fedray.algorithms.sampling import clusamp
from fedray.algorithms.sampling.strata import (
    draw_from_strata,
    sample_size_strata,
    similarity_strata,
    update_distances,
)
from fedray.config.keys import ConfigError
from fedray.data import build_federated_data
from fedray.experiment.local import make_local_federation
from tests.conftest import small_config
from tests.helpers import run_metrics


def test_algorithm_1_pours_clients_by_size_into_strata_of_mass_1_over_m():
    # p = .1, .3, .2, .4; m = 2 -> m p = .2, .6, .4, .8 poured largest first into two strata of 1:
    # stratum 0: client 3 (.8) + .2 of client 1; stratum 1: .4 of client 1, client 2 (.4), client 0 (.2)
    r = sample_size_strata([10, 30, 20, 40], 2)
    np.testing.assert_allclose(r, [[0, 0.2, 0, 0.8], [0.2, 0.4, 0.4, 0]])
    np.testing.assert_allclose(r.sum(axis=0), 2 * np.array([0.1, 0.3, 0.2, 0.4]))  # sum_k r_ki = m p_i


def test_distances_by_hand_and_over_chunks():
    g = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    for chunk in (1, 64):
        a = update_distances(g, "arccos", chunk)
        assert a[0, 1] == pytest.approx(math.pi / 2) and a[0, 2] == pytest.approx(math.pi / 4)
        assert a[0, 3] == 0.0 and np.all(np.diag(a) == 0)  # a zero update is at distance 0 (reference code)
        l2 = update_distances(g, "L2", chunk)
        assert l2[0, 1] == pytest.approx(2.0) and l2[2, 3] == pytest.approx(2.0)  # squared, as the reference
        l1 = update_distances(g, "L1", chunk)
        assert l1[0, 1] == 2.0 and l1[0, 2] == 1.0 and l1[2, 3] == 2.0


def test_algorithm_2_puts_similar_clients_in_one_stratum():
    rng = np.random.default_rng(0)
    g = rng.normal(size=(6, 40)) * 0.05
    g[[0, 2, 4]] += 1.0  # two families of updates: clients 0, 2, 4 and 1, 3, 5
    g[[1, 3, 5]] -= 1.0
    r = similarity_strata(update_distances(g, "arccos"), [10] * 6, 2, rng)
    families = sorted(tuple(np.flatnonzero(row)) for row in r)
    assert families == [(0, 2, 4), (1, 3, 5)]  # each family has mass 1/2 = 1/m: one stratum each
    np.testing.assert_allclose(r.sum(axis=1), 1.0)
    # with m = 3 the strata mix families but stay unbiased: sum_k r_ki = m p_i
    r3 = similarity_strata(update_distances(g, "arccos"), [10, 20, 30, 10, 20, 30], 3, rng)
    np.testing.assert_allclose(r3.sum(axis=0), 3 * np.array([10, 20, 30, 10, 20, 30]) / 120)
    # a client heavier than 1/m alone is spread over several strata, still unbiased
    big = similarity_strata(update_distances(g, "L2"), [100, 10, 10, 10, 10, 10], 3, rng)
    np.testing.assert_allclose(big.sum(axis=0), 3 * np.array([100, 10, 10, 10, 10, 10]) / 150)
    np.testing.assert_allclose(big.sum(axis=1), 1.0)
    assert len(draw_from_strata(big, rng)) == 3


def test_one_stratum_per_client_is_fedavg_with_full_participation(tmp_path):
    # iid: 6 clients of 100 samples; m = N strata of one client each, every client drawn once,
    # each weighted 1/m = n_i / n
    over = dict(partition="iid", rounds=3, participation=1.0, client_test_fraction=0.2, seed=2)
    ref = run_metrics(small_config(tmp_path / "fedavg", **over))
    got = run_metrics(
        small_config(
            tmp_path / "clusamp", algorithm="clusamp", hp={"similarity": "none", "num_strata": 6}, **over
        )
    )
    got = got[got["metric"] != "draws"].reset_index(drop=True)
    assert got.equals(ref), got.compare(ref)


def test_a_client_drawn_twice_counts_twice_and_updates_are_kept(tmp_path):
    cfg = small_config(
        tmp_path,
        algorithm="clusamp",
        participation=0.5,
        seed=1,
        partition="iid",
        hp={"similarity": "arccos", "num_strata": 8},
    )
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    hp = ALGORITHMS["clusamp"].make_hparams(cfg.hp)
    s0 = clusamp.init(fed, hp)
    s1, records = clusamp.round(s0, fed, hp, 0)
    draws = [r["client"] for r in records if r.get("kind") == "assignment"]
    assert len(draws) == 8 and len(set(draws)) < 8  # 8 draws from 6 clients: some repeat
    assert sorted(s1.updates) == sorted(set(draws))
    replies = fed.map(clusamp.local_update, sorted(set(draws)), {"params": s0.params, "round": 0})
    for c in set(draws):
        np.testing.assert_array_equal(s1.updates[c], clusamp.flat_update(replies[c]["params"], s0.params))
    # the new model is the mean over the eight draws (a repeated client counts once per draw)
    key = "head.weight"
    expect = sum(replies[c]["params"][key].astype(np.float64) for c in draws) / 8
    np.testing.assert_allclose(s1.params[key], expect, rtol=1e-6, atol=1e-7)


def test_bad_clusamp_settings_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"'hp.similarity'.*arccos, L2, L1, none"):
        small_config(tmp_path, algorithm="clusamp", hp={"similarity": "cosine"})
    with pytest.raises(ConfigError, match=r"'hp.num_strata'"):
        small_config(tmp_path, algorithm="clusamp", hp={"num_strata": -1})
