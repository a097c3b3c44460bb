"""Cluster-wise FedAvg: K = 1 is FedAvg; each cluster is a FedAvg of its own clients; the groups."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import load_assignments, load_metrics
from fedray.algorithms import ALGORITHMS
from fedray.algorithms.baselines import fedavg
from fedray.algorithms.clustered import clusterfedavg
from fedray.config.keys import ConfigError
from fedray.data import build_federated_data
from fedray.experiment.local import make_local_federation, task_for
from fedray.experiment.loop import execute
from fedray.federation.local import LocalFederation
from tests.conftest import small_config
from tests.helpers import TIMING


def metrics(out, drop=()):
    df = load_metrics(out)
    df = df[~df["metric"].isin(TIMING | set(drop))]
    return df.sort_values(["round", "metric", "scope", "entity"])[
        ["round", "metric", "scope", "entity", "value"]
    ]


def test_one_cluster_is_fedavg_exactly(tmp_path):
    over = dict(participation=0.5, rounds=3, seed=4)
    a = small_config(tmp_path / "a", **over)
    b = small_config(tmp_path / "b", algorithm="clusterfedavg", hp={"num_clusters": 1}, **over)
    list(execute(a, make_local_federation))
    list(execute(b, make_local_federation))
    fa, fb = metrics(a.output), metrics(b.output, drop={"num_clusters", "cluster_size", "global_model"})
    # FedAvg's global accuracy and loss are the single cluster's (its cluster rows, and its global rows
    # by the lowest-loss rule); training rows and bytes are identical
    single = fb[(fb.metric.isin(["accuracy", "loss"])) & (fb.scope == "cluster")]
    glob = fb[(fb.metric.isin(["accuracy", "loss"])) & (fb.scope == "global")]
    assert single["value"].tolist() == glob["value"].tolist() and len(glob) == 2 * 3
    fb = fb[fb.scope != "cluster"]
    pd_sorted = [
        f.sort_values(["round", "metric", "scope", "entity"]).reset_index(drop=True) for f in (fa, fb)
    ]
    assert pd_sorted[0].equals(pd_sorted[1])
    assert load_assignments(b.output)["cluster"].tolist() == [0] * 6


def test_each_cluster_is_a_fedavg_of_its_own_clients(tmp_path):
    cfg = small_config(
        tmp_path,
        partition="dominant",
        partition_clusters=2,
        partition_beta=0.8,
        num_clients=6,
        algorithm="clusterfedavg",
        hp={"num_clusters": 2, "groups": "oracle"},
    )
    data = build_federated_data(cfg)
    fed, _ = make_local_federation(cfg, data)
    hp = ALGORITHMS["clusterfedavg"].make_hparams(cfg.hp)
    state = clusterfedavg.init(fed, hp)
    for rnd in range(2):
        state, _ = clusterfedavg.round(state, fed, hp, rnd)
    assert state.assignment == {c: int(g) for c, g in enumerate(data.groups)}
    for k in range(2):
        members = [c for c, g in state.assignment.items() if g == k]
        task = task_for(cfg, data.dataset.spec)
        alone = LocalFederation(
            task, data.dataset.train, data.dataset.test, {c: data.clients[c] for c in members}
        )
        ref = fedavg.init(alone, fedavg.Hparams())
        for rnd in range(2):
            ref, _ = fedavg.round(ref, alone, fedavg.Hparams(), rnd)
        for name in ref.params:
            np.testing.assert_array_equal(state.models[k][name], ref.params[name])


def test_kmeans_groups_follow_the_label_distributions(tmp_path):
    # dominant: 3 groups, each with its own dominant class (80%): the label distributions tell them apart
    cfg = small_config(
        tmp_path,
        partition="dominant",
        partition_clusters=3,
        partition_beta=0.8,
        num_clients=9,
        algorithm="clusterfedavg",
        hp={"num_clusters": 3},
        rounds=1,
    )
    list(execute(cfg, make_local_federation))
    got = load_assignments(cfg.output).set_index("client")["cluster"]
    truth = build_federated_data(cfg).groups
    assert len(set(zip(got.sort_index(), truth, strict=True))) == 3  # the same partition up to renaming
    m = load_metrics(cfg.output)
    acc = m[(m.metric == "accuracy") & (m.scope == "cluster")]
    assert sorted(acc["entity"]) == [0, 1, 2]


@pytest.mark.parametrize(
    "over, pattern",
    [
        (
            dict(hp={"groups": "oracle", "num_clusters": 2}),
            r"hp.groups': oracle needs a partition with ground-truth groups \(dominant, rotation\)",
        ),
        (
            dict(partition="dominant", partition_clusters=3, hp={"groups": "oracle", "num_clusters": 2}),
            r"oracle has partition_clusters=3 groups; set hp.num_clusters: 3",
        ),
        (dict(hp={"num_clusters": 7}), r"7 clusters but only 6 clients"),
        (dict(hp={"groups": "kmean"}), r"hp.groups': must be one of kmeans, oracle"),
    ],
)
def test_config_errors_name_the_keys(tmp_path, over, pattern):
    with pytest.raises(ConfigError, match=pattern):
        small_config(tmp_path, algorithm="clusterfedavg", **over)
