"""FedProx, SCAFFOLD, FedNova, MOON, FedRS, FedLC: reduces-to FedAvg exactly, and each update rule
checked against numbers worked out by hand."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
import torch

from fedray.algorithms import ALGORITHMS
from fedray.algorithms.baselines import fedlc, fednova, fedrs, moon, scaffold
from fedray.data import build_federated_data
from fedray.engine.drive import run_one
from fedray.engine.update import Batch
from fedray.experiment.local import make_local_federation
from fedray.models import EncoderHead
from fedray.params import get_params, set_params
from tests.conftest import small_config
from tests.helpers import run_metrics


@pytest.mark.parametrize(
    "algorithm, hp",
    [
        ("fedprox", {"mu": 0.0}),
        ("moon", {"mu": 0.0, "out_dim": 0}),
        ("fedrs", {"alpha": 1.0}),
        ("fedlc", {"tau": 0.0}),
        ("fednova", {}),
    ],
)
def test_reduces_to_fedavg_exactly(tmp_path, algorithm, hp):
    # iid over 600 samples: 6 clients of 100, so equal local steps (FedNova); momentum 0 (FedNova's rho)
    over = dict(partition="iid", momentum=0.0, rounds=3, participation=0.5, client_test_fraction=0.2, seed=5)
    ref = run_metrics(small_config(tmp_path / "fedavg", **over))
    got = run_metrics(small_config(tmp_path / algorithm, algorithm=algorithm, hp=hp, **over))
    assert got.equals(ref), got.compare(ref)  # every value, bytes included


def test_the_variants_do_change_the_training(tmp_path):
    over = dict(partition="labels", partition_k=2, rounds=2, seed=1)
    ref = run_metrics(small_config(tmp_path / "fedavg", **over))["value"]
    for algorithm, hp in (
        ("fedprox", {"mu": 0.5}),
        ("moon", {"mu": 1.0, "out_dim": 0}),
        ("fedrs", {"alpha": 0.5}),
        ("fedlc", {"tau": 1.0}),
        ("scaffold", {}),
    ):
        got = run_metrics(small_config(tmp_path / algorithm, algorithm=algorithm, hp=hp, **over))["value"]
        assert len(got) != len(ref) or not np.allclose(got, ref), algorithm


# ------------------------------------------------------------------------------------------------
# SCAFFOLD: two clients, two rounds, one full-batch SGD step each, by hand
# ------------------------------------------------------------------------------------------------


def full_gradient(fed, cid, params):
    """g_i(w): the gradient of client cid's mean cross-entropy over all its data at w."""
    client = fed.host.client(cid) if hasattr(fed, "host") else None
    model = fed.task.build_model()
    set_params(model, params)
    x, y = next(client.train_batches(0, 0, batch_size=10_000))
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return {k: p.grad.numpy().astype(np.float64) for k, p in model.named_parameters()}


def scaffold_config(tmp_path, **over):
    # one full-batch step per round: lr 0.1, no momentum, no weight decay
    return small_config(
        tmp_path,
        **{
            **dict(
                algorithm="scaffold",
                num_clients=2,
                partition="iid",
                batch_size=10_000,
                local_epochs=1,
                momentum=0.0,
                weight_decay=0.0,
                lr=0.1,
            ),
            **over,
        },
    )


def run_two_rounds(fed, cfg):
    hp = ALGORITHMS["scaffold"].make_hparams(cfg.hp)
    state = scaffold.init(fed, hp)
    w0 = state.params
    for rnd in range(2):
        state, _ = scaffold.round(state, fed, hp, rnd)
    return w0, state


def test_scaffold_control_variates_round_trip_by_hand(tmp_path):
    """With one full-batch step, c_i+ = g_i(w): round 1 gives c_i = g_i(w0); round 2 must use it:
    w2 = sum p_i (w1 - lr (g_i(w1) + c1 - g_i(w0))), c1 = mean g_i(w0), c2 = c1 + mean(g_i(w1) - g_i(w0)).
    A client whose c_i is lost between rounds (the bug several implementations had) gives another w2."""
    cfg = scaffold_config(tmp_path)
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    n = fed.num_examples()
    p = {c: n[c] / sum(n.values()) for c in n}
    lr = 0.1
    w0, state = run_two_rounds(fed, cfg)
    g0 = {c: full_gradient(fed, c, w0) for c in (0, 1)}
    w1 = {k: sum(p[c] * (w0[k] - lr * g0[c][k]) for c in (0, 1)) for k in g0[0]}
    c1 = {k: (g0[0][k] + g0[1][k]) / 2 for k in g0[0]}
    w1_f32 = {k: v.astype(np.float32) for k, v in w1.items()}
    g1 = {c: full_gradient(fed, c, w1_f32) for c in (0, 1)}
    w2 = {k: sum(p[c] * (w1[k] - lr * (g1[c][k] + c1[k] - g0[c][k])) for c in (0, 1)) for k in g0[0]}
    c2 = {k: c1[k] + ((g1[0][k] - g0[0][k]) + (g1[1][k] - g0[1][k])) / 2 for k in g0[0]}
    for k in w2:
        np.testing.assert_allclose(state.params[k], w2[k], rtol=0, atol=2e-6)
        np.testing.assert_allclose(state.c[k], c2[k], rtol=0, atol=1e-4)
        for c in (0, 1):  # each client keeps c_i = g_i(w1) for its next round
            np.testing.assert_allclose(fed.host.get_state(c)[k], g1[c][k], rtol=0, atol=1e-4)
    lost = {k: sum(p[c] * (w1[k] - lr * (g1[c][k] + c1[k])) for c in (0, 1)) for k in g0[0]}
    assert max(np.abs(lost[k] - w2[k]).max() for k in w2) > 1e-4  # the test would catch a lost c_i


@pytest.mark.ray
def test_scaffold_on_one_actor_holding_every_client_keeps_each_clients_control_variate(ray_session, tmp_path):
    """Every client's c_i on one actor, compared as arrays (three actors: test_ray.py's identity test)."""
    from actors.federation import RayFederation

    actors = 1
    cfg = scaffold_config(tmp_path / "local")
    _, local = run_two_rounds(make_local_federation(cfg, build_federated_data(cfg))[0], cfg)
    cfg = scaffold_config(tmp_path / "ray", num_actors=actors)
    fed = RayFederation(cfg, build_federated_data(cfg))
    try:
        assert len(fed.actors) == actors
        _, got = run_two_rounds(fed, cfg)
    finally:
        fed.close()
    for k in local.params:
        np.testing.assert_array_equal(got.params[k], local.params[k])
        np.testing.assert_array_equal(got.c[k], local.c[k])


def test_scaffold_control_variates_travel_and_the_server_update_options(tmp_path):
    over = dict(rounds=2, participation=0.5, seed=2)
    fedavg_bytes = run_metrics(small_config(tmp_path / "a", **over))
    paper = run_metrics(small_config(tmp_path / "b", algorithm="scaffold", **over))
    code = run_metrics(
        small_config(tmp_path / "c", algorithm="scaffold", hp={"server_update": "code"}, **over)
    )

    def total(df, metric):
        return df[df["metric"] == metric]["value"].sum()

    # c goes down with w and Delta c_i comes up with w_i: about twice FedAvg's traffic each way
    for metric in ("bytes_down", "bytes_up"):
        assert 1.9 < total(paper, metric) / total(fedavg_bytes, metric) < 2.1
    # half the clients take part: the paper's c moves by sum/N, the code's by the mean (2x): round 2 differs
    acc = lambda df: df[(df["metric"] == "accuracy") & (df["round"] == 2)]["value"].item()  # noqa: E731
    assert acc(paper) != acc(code)


# ------------------------------------------------------------------------------------------------
# FedNova, MOON, FedRS, FedLC: the formulas on hand-made numbers
# ------------------------------------------------------------------------------------------------


def test_fednova_normalised_average_by_hand():
    # w = 0; w_1 = 1 after 1 step on 1 sample, w_2 = 3 after 2 steps on 3 samples: p = (1/4, 3/4),
    # a_eff = 1/4 + 3/4 * 2 = 1.75; d = (-1, -1.5); w <- 0 - 1.75 * (-1/4 - 3/4 * 1.5) = 2.40625 (FedAvg: 2.5)
    out = fednova.nova_average(
        {"w": np.zeros(1, np.float32), "n": np.array(2, np.int64)},
        [
            {"w": np.ones(1, np.float32), "n": np.array(3, np.int64)},
            {"w": np.full(1, 3.0, np.float32), "n": np.array(5, np.int64)},
        ],
        [1, 3],
        [1.0, 2.0],
    )
    assert out["w"].tolist() == [2.40625] and out["w"].dtype == np.float32
    # integer entries by the same rule, rounded: 2 + 1.75 * (1/4 * (3 - 2) / 1 + 3/4 * (5 - 2) / 2) = 4.40625
    assert out["n"] == 4 and out["n"].dtype == np.int64
    # a_i with momentum: tau = 3, rho = 0.5: (3 - 0.5 * (1 - 0.125) / 0.5) / 0.5 = 4.25; rho = 0: tau
    assert fednova.normalizer(3, 0.5) == 4.25 and fednova.normalizer(7, 0.0) == 7.0


def identity_model(weight, bias):
    head = torch.nn.Linear(len(weight[0]), len(weight))
    with torch.no_grad():
        head.weight.copy_(torch.tensor(weight, dtype=torch.float32))
        head.bias.copy_(torch.tensor(bias, dtype=torch.float32))
    return EncoderHead(torch.nn.Identity(), head, len(weight[0]))


def test_moon_contrastive_loss_matches_the_formula():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    y = torch.tensor([0, 1])
    model = identity_model([[1.0, 0.0], [0.0, 1.0]], [0.0, 0.0])
    glob = EncoderHead(torch.nn.Linear(2, 2, bias=False), torch.nn.Identity(), 2)  # z_glob = z @ A^T
    prev = EncoderHead(torch.nn.Linear(2, 2, bias=False), torch.nn.Identity(), 2)
    with torch.no_grad():
        glob.encoder.weight.copy_(torch.tensor([[1.0, 1.0], [1.0, 1.0]]))  # z_glob: (1, 1), (2, 2)
        prev.encoder.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))  # z_prev: (0, 1), (2, 0)
    step = moon.contrastive(model, Batch(z, y), {"mu": 2.0, "temperature": 0.5, "glob": glob, "prev": prev})
    # both samples: cos(z, z_glob) = 1/sqrt(2), cos(z, z_prev) = 0 -> l_con = log(1 + exp(-sqrt(2))) = 0.217 63
    l_con = math.log(1 + math.exp(-math.sqrt(2)))
    ce = torch.nn.functional.cross_entropy(z, y).item()  # logits = z (identity head)
    assert step.ce.item() == pytest.approx(ce)
    assert step.loss.item() == pytest.approx(ce + 2.0 * l_con, rel=1e-6)
    first = moon.contrastive(model, Batch(z, y), {"mu": 2.0, "temperature": 0.5, "glob": glob, "prev": None})
    assert first.loss.item() == pytest.approx(ce)  # no previous model yet: l_con = -log(1) = 0


def test_fedrs_scales_the_logits_of_missing_and_rare_classes():
    s = fedrs.class_scales(np.array([0, 5, 10]), alpha=0.5)
    assert s.tolist() == [0.5, 0.75, 1.0]  # alpha + (1 - alpha) n_c / max n
    model = identity_model([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [0.1, 0.2, 0.3])
    h, y = torch.tensor([[2.0, 4.0]]), torch.tensor([2])
    step = fedrs.restricted_softmax(model, Batch(h, y), {"per_class": torch.tensor(s, dtype=torch.float32)})
    # W h = (2, 4, 6); scaled: (1, 3, 6) + b = (1.1, 3.2, 6.3); reported logits unscaled: (2.1, 4.2, 6.3)
    scaled = np.array([1.1, 3.2, 6.3])
    expected = -scaled[2] + math.log(np.exp(scaled).sum())
    assert step.ce.item() == pytest.approx(expected, rel=1e-6) and step.loss is step.ce
    np.testing.assert_allclose(step.logits.detach().numpy(), [[2.1, 4.2, 6.3]], rtol=1e-6)


def test_fedrs_without_a_head_bias_is_fedrepos_restricted_softmax():
    # head_bias: false (FedRepo's ClassifyNet): logits_c = s_c <w_c, h>, nothing added
    s = fedrs.class_scales(np.array([0, 5, 10]), alpha=0.5)
    model = identity_model([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [0.0, 0.0, 0.0])
    model.head.register_parameter("bias", None)
    h, y = torch.tensor([[2.0, 4.0]]), torch.tensor([0])
    step = fedrs.restricted_softmax(model, Batch(h, y), {"per_class": torch.tensor(s, dtype=torch.float32)})
    scaled = np.array([0.5 * 2.0, 0.75 * 4.0, 1.0 * 6.0])  # W h = (2, 4, 6), scales (0.5, 0.75, 1)
    assert step.ce.item() == pytest.approx(-scaled[0] + math.log(np.exp(scaled).sum()), rel=1e-6)
    np.testing.assert_allclose(step.logits.detach().numpy(), [[2.0, 4.0, 6.0]])


def test_fedlc_calibrates_the_logits_by_the_class_counts():
    offset = fedlc.calibration(np.array([0, 1, 16]), tau=2.0)
    # tau n^(-1/4): an absent class floored at 1e-8 -> 2 * 100; n = 1 -> 2; n = 16 -> 2 * 0.5
    np.testing.assert_allclose(offset, [200.0, 2.0, 1.0])
    model = identity_model([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], [0.0, 0.0, 0.0])
    x, y = torch.tensor([[3.0, 2.0, 1.0]]), torch.tensor([1])
    step = fedlc.calibrated(model, Batch(x, y), {"per_class": torch.tensor(offset, dtype=torch.float32)})
    cal = np.array([3.0 - 200.0, 2.0 - 2.0, 1.0 - 1.0])
    assert step.ce.item() == pytest.approx(-cal[1] + math.log(np.exp(cal).sum()), rel=1e-6)
    np.testing.assert_allclose(step.logits.detach().numpy(), [[3.0, 2.0, 1.0]])  # evaluation sees raw logits


def test_moon_keeps_the_previous_model_on_the_client_and_it_never_travels(tmp_path):
    cfg = small_config(tmp_path, algorithm="moon", hp={"mu": 1.0, "out_dim": 16}, rounds=2)
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    hp = ALGORITHMS["moon"].make_hparams(cfg.hp)
    state = moon.init(fed, hp)
    assert "encoder.projection.l2.weight" in state.params and state.params["head.weight"].shape == (10, 16)
    fed.take_traffic()
    state, _ = moon.round(state, fed, hp, 0)
    first_down, *_ = fed.take_traffic()
    state, _ = moon.round(state, fed, hp, 1)
    second_down, *_ = fed.take_traffic()
    assert first_down == second_down  # the previous model is not sent
    for c in fed.client_ids:  # each client's state is its own last local model
        assert set(fed.host.get_state(c)) == set(state.params)
    model = fed.task.build_model(arch=moon.arch(hp))
    set_params(model, state.params)
    assert get_params(model).keys() == state.params.keys()


def test_moon_negative_of_a_client_that_has_not_taken_part_yet_is_the_initial_model(tmp_path):
    # After round 0 the pool holds every client's model; one that sat out still holds the shared
    # initial model (docs/algorithms/baselines.md#d3-moons-contrastive-term-in-round-0). In round 0 the pool is empty: no negative at all.
    cfg = small_config(tmp_path, algorithm="moon", hp={"mu": 1.0, "out_dim": 16}, seed=3)
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    hp = ALGORITHMS["moon"].make_hparams(cfg.hp)
    w0 = moon.init(fed, hp).params
    rng = np.random.default_rng(0)  # the global model this round: not the initial one
    glob = {k: (v + 0.05 * rng.standard_normal(v.shape)).astype(v.dtype) for k, v in w0.items()}
    client = fed.host.client(0)

    def update(cstate, rnd):
        msg = {"params": glob, "round": rnd}
        update = partial(moon.moon_update, mu=hp.mu, temperature=hp.temperature, arch=moon.arch(hp))
        reply, _ = run_one(update, client, cstate, msg)
        return reply["params"]

    def gap(a, b):
        return max(float(np.abs(a[k] - b[k]).max()) for k in a)

    assert gap(update(None, 1), update(w0, 1)) == 0  # not taken part yet: the initial model is its negative
    assert gap(update(None, 0), update(w0, 0)) > 1e-4  # round 0: no negative (w0 would change the update)


@pytest.mark.parametrize("server_update, divisor", [("paper", 4), ("code", 2)])
def test_scaffold_server_control_variate_by_hand_at_half_participation(tmp_path, server_update, divisor):
    # 4 clients, 2 take part, one full-batch step from c = c_i = 0: Delta c_i = g_i(w0), so the server's
    # c1 = sum_{i in S} g_i(w0) / N (paper, N = 4) or / |S| (code, 2); the model is FedAvg's step.
    cfg = scaffold_config(tmp_path, hp={"server_update": server_update}, participation=0.5, num_clients=4)
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    hp = ALGORITHMS["scaffold"].make_hparams(cfg.hp)
    state = scaffold.init(fed, hp)
    w0 = state.params
    state, _ = scaffold.round(state, fed, hp, 0)
    took_part = sorted(c for c, s in fed.client_states() if s is not None)
    assert len(took_part) == 2
    g = {c: full_gradient(fed, c, w0) for c in took_part}
    n = fed.num_examples()
    p = {c: n[c] / sum(n[i] for i in took_part) for c in took_part}
    for k in g[took_part[0]]:
        np.testing.assert_allclose(state.c[k], sum(g[c][k] for c in took_part) / divisor, rtol=0, atol=1e-5)
        # c = c_i = 0 in the first round: the model step is FedAvg's
        np.testing.assert_allclose(
            state.params[k], sum(p[c] * (w0[k] - 0.1 * g[c][k]) for c in took_part), rtol=0, atol=2e-6
        )


@pytest.mark.parametrize("weights", ["samples", "batches"])
def test_fednova_round_with_momentum_and_unequal_steps_by_hand(tmp_path, weights):
    # Dirichlet sizes give unequal step counts; rho = 0.5: the round must use a_i(tau_i, rho) and
    # p_i = n_i / n over the participants, then w - (sum p a) sum p (w - w_i) / a_i; n_i is the
    # client's samples (the paper) or its batches per epoch, ceil(samples / 16) (NIID-Bench's code).
    import math

    from fedray.algorithms.rounds import local_update

    cfg = small_config(
        tmp_path,
        algorithm="fednova",
        partition="dirichlet",
        partition_beta=0.5,
        momentum=0.5,
        batch_size=16,
        local_epochs=1,
        seed=4,
        hp={"weights": weights},
    )
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    hp = ALGORITHMS["fednova"].make_hparams(cfg.hp)
    w = get_params(fed.task.build_model())
    replies = fed.map(local_update, fed.client_ids, {"params": w, "round": 0})
    steps = {c: r["steps"] for c, r in replies.items()}
    assert len(set(steps.values())) > 1
    n = {c: r["num_examples"] for c, r in replies.items()}
    if weights == "batches":
        n = {c: math.ceil(v / 16) for c, v in n.items()}
        assert n != {c: r["num_examples"] for c, r in replies.items()}
    p = {c: n[c] / sum(n.values()) for c in n}
    a = {c: (steps[c] - 0.5 * (1 - 0.5 ** steps[c]) / 0.5) / 0.5 for c in n}
    a_eff = sum(p[c] * a[c] for c in n)
    state, _ = fednova.round(fednova.State(w), fed, hp, 0)
    for k in w:
        if not np.issubdtype(w[k].dtype, np.floating):
            continue
        d = sum(p[c] * (w[k].astype(np.float64) - replies[c]["params"][k]) / a[c] for c in n)
        np.testing.assert_allclose(state.params[k], w[k] - a_eff * d, rtol=0, atol=1e-6)
