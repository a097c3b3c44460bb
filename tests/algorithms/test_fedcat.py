"""FedCat (docs/algorithms/fedcat.md#fedcat-and-clustered-sampling): DevSelect by hand, the Latin-square schedule, eq. 3, the reduction to
FedAvg, the ablations and the config checks."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import load_assignments, load_metrics
from fedray.algorithms import ALGORITHMS
from fedray.algorithms.relay import fedcat
from fedray.algorithms.relay.selection import dev_select, equal_groups, latin_square, selection_probabilities
from fedray.config.keys import ConfigError
from fedray.data import build_federated_data
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import execute
from fedray.params import weighted_average
from tests.conftest import small_config
from tests.helpers import run_metrics

# ------------------------------------------------------------------------------------------------
# DevSelect (Alg. 3, eqs. 4-5, docs/algorithms/fedcat.md#edge-cases) on a 2-group example worked by hand
# ------------------------------------------------------------------------------------------------


def test_selection_probabilities_follow_eq_5_and_the_zero_count_rule():
    # w = 1/sqrt(1), 1/sqrt(4) = 1, 1/2 -> P = 2/3, 1/3
    np.testing.assert_allclose(selection_probabilities([1, 4]), [2 / 3, 1 / 3])
    # w = 1, 1/2, 1/3 -> sum 11/6 -> P = 6/11, 3/11, 2/11
    np.testing.assert_allclose(selection_probabilities([1, 4, 9]), [6 / 11, 3 / 11, 2 / 11])
    # never chosen at this position: infinite bonus, shared by the zero-count devices only
    np.testing.assert_array_equal(selection_probabilities([0, 3, 0]), [0.5, 0.0, 0.5])
    assert not np.isnan(selection_probabilities([0, 0])).any()


def test_dev_select_counts_greedy_and_sampling_on_two_groups():
    groups = [[0, 1], [2, 3]]
    counts = np.array([[1, 0], [4, 0], [9, 0], [1, 0]])  # N = 4 devices x K = 2 positions
    # greedy (epsilon = 1): group 0 -> device 0 (w 1 > 1/2), group 1 -> device 3 (w 1 > 1/3)
    chosen = dev_select(groups, counts, 0, 1.0, np.random.default_rng(0))
    assert chosen == [0, 3]
    np.testing.assert_array_equal(counts[:, 0], [2, 4, 9, 2])  # M[d][o] += 1 for the chosen
    np.testing.assert_array_equal(counts[:, 1], [0, 0, 0, 0])  # other positions untouched
    # sampling (epsilon = 0) from M = [[1, 4], [9, 1]] at column 0: P(0) = 2/3 in group 0, P(3) = 3/4 in group 1
    picks = []
    rng = np.random.default_rng(1)
    for _ in range(6000):
        c = np.array([[1, 0], [4, 0], [9, 0], [1, 0]])
        picks.append(dev_select(groups, c, 0, 0.0, rng))
    picks = np.array(picks)
    assert abs((picks[:, 0] == 0).mean() - 2 / 3) < 0.02
    assert abs((picks[:, 1] == 3).mean() - 3 / 4) < 0.02
    # zero counts come first in both branches; position 1 has never been used
    for eps in (0.0, 1.0):
        for seed in range(20):
            c = np.array([[0, 5], [0, 0], [0, 2], [0, 7]])
            assert dev_select(groups, c, 1, eps, np.random.default_rng(seed))[0] == 1
            c = np.array([[0, 5], [0, 0], [0, 0], [0, 7]])
            assert dev_select(groups, c, 1, eps, np.random.default_rng(seed)) == [1, 2]


def test_equal_groups_and_the_latin_square():
    groups = equal_groups(10, 3, np.random.default_rng(0))
    assert sorted(len(g) for g in groups) == [3, 3, 4]
    assert sorted(c for g in groups for c in g) == list(range(10))
    assert latin_square([7, 8, 9], 0) == [7, 8, 9]
    assert latin_square([7, 8, 9], 1) == [8, 9, 7]  # copy 0 -> the device of group 1
    assert latin_square([7, 8, 9], 2) == [9, 7, 8]


# ------------------------------------------------------------------------------------------------
# The algorithm
# ------------------------------------------------------------------------------------------------


def fedcat_config(tmp_path, **over):
    base = dict(
        algorithm="fedcat",
        num_clients=9,
        participation=0.34,
        rounds=6,
        eval_every=100,
        seed=4,
        partition="iid",
        hp={"regroup_cycles": 1},
    )
    base.update(over)
    return small_config(tmp_path, **base)


def test_each_copy_meets_one_device_of_every_group_per_cycle(tmp_path):
    cfg = fedcat_config(tmp_path)  # N = 9, K = 3, two cycles, regrouped every cycle
    list(execute(cfg, make_local_federation))
    a = load_assignments(cfg.output)
    m = load_metrics(cfg.output)
    groups = m[m["metric"] == "group"]
    assert sorted(groups["round"].unique()) == [1, 4]  # drawn at the start of each cycle
    for start in (1, 4):
        drawn = groups[groups["round"] == start]
        group_of = dict(zip(drawn["entity"], drawn["value"], strict=True))
        assert sorted(np.bincount(list(map(int, group_of.values())))) == [3, 3, 3]  # equal groups
        cycle = a[a["round"].between(start, start + 2)]
        # K copies a round
        assert cycle.groupby("round")["cluster"].apply(lambda s: sorted(s) == [0, 1, 2]).all()
        for copy, rows in cycle.groupby("cluster"):
            met = sorted(int(group_of[c]) for c in rows["client"])
            assert met == [0, 1, 2], f"copy {copy} met groups {met}"
        for _, rows in cycle.groupby("round"):
            assert sorted(int(group_of[c]) for c in rows["client"]) == [0, 1, 2]  # one device per group
    # accuracy after each aggregation (rounds 3 and 6), though eval_every is 100
    assert sorted(m[m["metric"] == "accuracy"]["round"]) == [3, 6]
    assert (m[m["metric"] == "participants"]["value"] == 3).all()


def test_a_cycle_is_the_hand_off_of_copies_and_eq_3(tmp_path):
    cfg = fedcat_config(tmp_path, num_clients=4, participation=0.5, rounds=2, partition="dirichlet")  # K = 2
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    hp = ALGORITHMS["fedcat"].make_hparams(cfg.hp)
    s0 = fedcat.init(fed, hp)
    s1, rec1 = fedcat.round(s0, fed, hp, 0)
    s2, rec2 = fedcat.round(s1, fed, hp, 1)
    route = [[r["client"] for r in recs if r.get("kind") == "assignment"] for recs in (rec1, rec2)]
    group_of = {c: g for g, members in enumerate(s1.groups) for c in members}
    assert [group_of[c] for c in route[0]] == [0, 1]  # offset 0: copy i -> the device of group i
    assert [group_of[c] for c in route[1]] == [1, 0]  # offset 1: copy i -> the device of group i + 1
    n = fed.num_examples()
    assert s1.sizes == [n[route[0][0]], n[route[0][1]]] and len(s1.copies) == 2
    assert s2.copies == [] and s2.sizes == []
    np.testing.assert_array_equal(s2.counts.sum(axis=0), [2, 2])  # two devices chosen at each position
    # By hand: each copy trained on its round-0 device, then on its round-1 device; eq. 3 by size.
    copies = []
    for i in range(2):
        p = s0.params
        for rnd in range(2):
            (p, _info), _meta = fed.host.run(fedcat.train_copy, route[rnd][i], (p, {"round": rnd}))
        copies.append(p)
    d = [n[route[0][i]] + n[route[1][i]] for i in range(2)]
    expect = weighted_average(copies, d)
    for k in expect:
        np.testing.assert_array_equal(s2.params[k], expect[k])
    assert not all(np.array_equal(s2.params[k], s0.params[k]) for k in expect)


def independent_chain(fed, start, devices, momentum_carried=False):
    """One copy's cycle written out by hand, apart from FedCat's relay: for each round's device a
    model loaded with the copy, plain torch SGD over the device's shuffled batches (a fresh optimizer
    per device, or one optimizer whose momentum goes on from device to device), the model handed on."""
    import torch

    params, opt_state = start, None
    for rnd, cid in enumerate(devices):
        client = fed.host.client(cid)
        model = client.model(params)
        t = client.task
        opt = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
        if momentum_carried and opt_state is not None:
            for p, buf in zip(model.parameters(), opt_state, strict=True):
                opt.state[p]["momentum_buffer"] = buf.clone()
        model.train()
        for epoch in range(t.local_epochs):
            for x, y in client.train_batches(rnd, epoch):
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        opt_state = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
        params = {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}
    return params


@pytest.mark.parametrize("optimizer_state", ["fresh", "carried"])
def test_a_k10_cycle_is_ten_independent_chains_and_eq_3_bit_for_bit(tmp_path, optimizer_state):
    """K = 10: one whole cycle of FedCat (10 rounds, 10 copies, each through 10 devices, one of every
    group) equals, bit for bit, ten chains of local trainings written out by hand and eq. 3 over them."""
    cfg = fedcat_config(
        tmp_path,
        num_clients=20,
        participation=0.5,
        rounds=10,
        local_epochs=2,
        hp={"optimizer_state": optimizer_state},
    )
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    hp = ALGORITHMS["fedcat"].make_hparams(cfg.hp)
    state = s0 = fedcat.init(fed, hp)
    routes = []
    for rnd in range(10):
        state, recs = fedcat.round(state, fed, hp, rnd)
        routes.append(
            [
                r["client"]
                for r in sorted(
                    (r for r in recs if r.get("kind") == "assignment"), key=lambda r: r["cluster"]
                )
            ]
        )
        if rnd < 9:
            assert len(state.copies) == 10
    assert state.copies == [] and np.array_equal(state.counts.sum(axis=0), [10] * 10)
    group_of = {c: g for g, members in enumerate(state.groups) for c in members}
    for i in range(10):  # copy i meets the device of group (o + i) mod K at offset o: all ten groups
        assert [group_of[routes[o][i]] for o in range(10)] == [(o + i) % 10 for o in range(10)]
    n = fed.num_examples()
    chains = [
        independent_chain(fed, s0.params, [routes[o][i] for o in range(10)], optimizer_state == "carried")
        for i in range(10)
    ]
    expect = weighted_average(chains, [sum(n[routes[o][i]] for o in range(10)) for i in range(10)])
    for k in expect:
        np.testing.assert_array_equal(state.params[k], expect[k])


def test_carried_momentum_changes_the_cycle_and_needs_the_hand_offs(tmp_path):
    out = {}
    for mode in ("fresh", "carried"):
        cfg = fedcat_config(tmp_path / mode, hp={"regroup_cycles": 1, "optimizer_state": mode})
        list(execute(cfg, make_local_federation))
        out[mode] = load_metrics(cfg.output)
    acc = {k: m[m["metric"] == "loss"]["value"].tolist() for k, m in out.items()}
    assert acc["fresh"] != acc["carried"]
    with pytest.raises(ConfigError, match="hp.optimizer_state.*concatenation"):
        fedcat_config(tmp_path, hp={"concatenation": False, "optimizer_state": "carried"})


def test_chains_of_length_1_with_random_devices_are_fedavg_exactly(tmp_path):
    # w/ DC (FedAvg's sampling) and w/ GC (aggregate every round): FedAvg, value for value
    over = dict(rounds=3, participation=0.5, client_test_fraction=0.2, seed=5)
    keep = [
        "accuracy",
        "loss",
        "local_accuracy",
        "train_loss",
        "train_accuracy",
        "sgd_loss",
        "sgd_accuracy",
        "participants",
    ]
    ref = run_metrics(small_config(tmp_path / "fedavg", **over))
    got = run_metrics(
        small_config(
            tmp_path / "fedcat", algorithm="fedcat", hp={"grouping": False, "concatenation": False}, **over
        )
    )
    ref, got = (df[df["metric"].isin(keep)].reset_index(drop=True) for df in (ref, got))
    assert len(ref) and got.equals(ref), got.compare(ref)


def test_ablations_change_the_schedule(tmp_path):
    out = {}
    for name, hp in {"fedcat": {}, "gc": {"concatenation": False}, "dc": {"grouping": False}}.items():
        cfg = fedcat_config(tmp_path / name, hp=hp)
        list(execute(cfg, make_local_federation))
        m = load_metrics(cfg.output)
        out[name] = (m, load_assignments(cfg.output))
    # GC evaluates like FedCat (every K rounds) but aggregates every round: different numbers
    acc = {k: m[m["metric"] == "accuracy"]["value"].tolist() for k, (m, _) in out.items()}
    assert acc["fedcat"] != acc["gc"] and acc["fedcat"] != acc["dc"]
    # DC draws no groups; FedCat and GC do
    assert not (out["dc"][0]["metric"] == "group").any() and (out["gc"][0]["metric"] == "group").any()
    # every variant trains K = 3 devices per round and moves K models each way
    for _, a in out.values():
        assert (a.groupby("round").size() == 3).all()


def test_the_coordinator_receives_the_copies_only_when_it_aggregates(tmp_path):
    cfg = fedcat_config(tmp_path, model="mlp")
    list(execute(cfg, make_local_federation))
    m = load_metrics(cfg.output)
    by = m.pivot_table(index="round", columns="metric", values="value")
    model_bytes = by["bytes_up"].iloc[0] / 3  # three copies go up per round
    mid = by.loc[[1, 2, 4, 5], "bytes_received"]
    end = by.loc[[3, 6], "bytes_received"]
    assert (mid < 0.01 * model_bytes).all()  # infos and metas only
    assert (end > 3 * model_bytes).all() and (end < 3.05 * model_bytes).all()  # the K copies, once
    assert (by["bytes_down"] > 3 * model_bytes * 0.95).all()  # every round K models go down, as FedAvg


@pytest.mark.parametrize(
    "over, match",
    [
        (dict(rounds=5), r"'rounds'.*cycle of K = 3 rounds.*Set rounds: 6 \(or 3\)$"),
        (dict(rounds=2), r"'rounds'.*cycle of K = 3 rounds.*Set rounds: 3$"),  # not '3 (or 3)'
        (dict(hp={"num_groups": 4}), r"'hp.num_groups'.*participation=0.34 of 9 clients is 3"),
        (dict(hp={"epsilon": 1.5}), r"'hp.epsilon'"),
        (dict(hp={"regroup_cycles": 0}), r"'hp.regroup_cycles'"),
    ],
)
def test_bad_fedcat_settings_name_the_key(tmp_path, over, match):
    with pytest.raises(ConfigError, match=match):
        fedcat_config(tmp_path, **over)


def test_groups_are_redrawn_every_lambda_cycles_and_kept_in_between(tmp_path):
    # lambda = 2, K = 3: groups drawn at rounds 1 and 7 (the starts of cycles 1 and 3), the same
    # groups used through cycle 2 (rounds 4-6): each round's K devices come one from each group.
    cfg = fedcat_config(tmp_path, rounds=9, hp={"regroup_cycles": 2})
    list(execute(cfg, make_local_federation))
    m = load_metrics(cfg.output)
    groups = m[m["metric"] == "group"]
    assert sorted(groups["round"].unique()) == [1, 7]
    first = dict(
        zip(groups[groups["round"] == 1]["entity"], groups[groups["round"] == 1]["value"], strict=True)
    )
    a = load_assignments(cfg.output)
    for rnd in range(1, 7):  # cycles 1 and 2 both draw from the groups of round 1
        assert sorted(int(first[c]) for c in a[a["round"] == rnd]["client"]) == [0, 1, 2]


def test_mid_cycle_rounds_are_not_evaluated(tmp_path):
    # Between aggregations m_glb is the last aggregated model; evaluated mid-cycle it would look like
    # the current one. eval_every 1 still evaluates FedCat only where a cycle ends (rounds 3 and 6);
    # the w/ GC ablation aggregates every round, so every round is evaluated.
    cfg = fedcat_config(tmp_path / "cat", eval_every=1)
    list(execute(cfg, make_local_federation))
    m = load_metrics(cfg.output, scope="global")
    assert sorted(m[m["metric"] == "accuracy"]["round"]) == [3, 6]
    gc = fedcat_config(tmp_path / "gc", eval_every=1, hp={"regroup_cycles": 1, "concatenation": False})
    list(execute(gc, make_local_federation))
    m = load_metrics(gc.output, scope="global")
    assert sorted(m[m["metric"] == "accuracy"]["round"]) == [1, 2, 3, 4, 5, 6]
