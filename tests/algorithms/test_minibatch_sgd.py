"""LEAF's minibatch SGD (fedray/algorithms/baselines/minibatch_sgd.py): its draw, its update rule by
hand, FedAvg exactly at fraction 1, the same numbers on Ray and stacked."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import load_runs
from fedray.algorithms import ALGORITHMS
from fedray.algorithms.baselines import minibatch_sgd
from fedray.config import seeding
from fedray.config.coercion import ConfigError
from fedray.data import ArrayDataset, ClientIndices, DataSpec, build_federated_data
from fedray.engine.client import Task
from fedray.engine.update import LocalUpdate
from fedray.experiment.checks import from_dict
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import execute
from fedray.federation.local import LocalFederation
from tests.conftest import small_config
from tests.helpers import round_metrics, run_metrics

HP = ALGORITHMS["minibatch_sgd"].make_hparams


@pytest.mark.parametrize(
    "n, fraction, k",
    [
        (30, 0.1, 3),
        (9, 0.1, 1),  # int(0.9) = 0: at least one sample
        (100, 0.29, 28),  # int() of 28.999...: LEAF's truncation, float round-off included
        (7, 1.0, 7),
        (1, 0.5, 1),
        (0, 0.5, 0),  # a client without training samples draws none
    ],
)
def test_the_draw_is_max_1_int_fraction_n_samples_without_replacement(n, fraction, k):
    assert minibatch_sgd.draw_size(n, fraction) == k
    drawn = minibatch_sgd.draw(n, fraction, np.random.default_rng(0))
    if k == n:
        assert drawn is None  # the whole split: no weights
        return
    assert len(drawn) == k == len(set(drawn.tolist())) and 0 <= drawn.min() and drawn.max() < n
    w = minibatch_sgd.draw_weights(n, drawn)
    # (1/n) sum_b w_b ce_b is the draw's mean: n / k on the drawn samples, 0 elsewhere
    assert np.flatnonzero(w).tolist() == sorted(drawn.tolist()) and w.sum() == pytest.approx(n)


def test_the_client_draws_from_its_own_stream_for_the_round(tmp_path):
    cfg = small_config(tmp_path, algorithm="minibatch_sgd", hp={"fraction": 0.3}, batch_size=256, seed=4)
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    params = minibatch_sgd.init(fed, HP(cfg.hp)).params

    def asked(cid, rnd):
        gen = minibatch_sgd.minibatch_update(
            fed.host.client(cid), None, {"params": params, "round": rnd}, 0.3
        )
        update = next(gen)
        gen.close()
        assert isinstance(update, LocalUpdate) and update.epochs == 1 and update.max_steps == 1
        return np.flatnonzero(update.weights)

    n = fed.num_examples()
    for cid, rnd in [(0, 0), (0, 1), (2, 0)]:
        want = minibatch_sgd.draw(n[cid], 0.3, seeding.rng(4, "minibatch", cid, rnd))
        assert asked(cid, rnd).tolist() == want.tolist() == asked(cid, rnd).tolist()
        assert len(want) == int(0.3 * n[cid])
    assert asked(0, 0).tolist() != asked(0, 1).tolist()  # another round, another draw


DIGITS = dict(
    dataset="digits",
    num_clients=10,
    partition="dirichlet",
    participation=0.5,
    client_test_fraction=0.2,
    rounds=3,
    local_epochs=1,
    batch_size=256,  # the largest client holds 180 samples: one batch each
    lr=0.1,
    momentum=0.0,
    weight_decay=0.0,
    seed=5,
)


def test_fraction_1_is_fedavg_with_one_full_batch_epoch_exactly(tmp_path):
    ref = run_metrics(small_config(tmp_path / "fedavg", **DIGITS))
    got = run_metrics(
        small_config(tmp_path / "mb", algorithm="minibatch_sgd", hp={"fraction": 1.0}, **DIGITS)
    )
    assert got.equals(ref), got.compare(ref)  # every value, bytes included
    part = run_metrics(
        small_config(tmp_path / "mb01", algorithm="minibatch_sgd", hp={"fraction": 0.1}, **DIGITS)
    )
    acc = part[part.metric == "accuracy"]["value"].to_numpy()
    assert not np.array_equal(acc, ref[ref.metric == "accuracy"]["value"].to_numpy())  # the draw matters


def _hand_federation() -> LocalFederation:
    """Logistic regression on 2 features, 2 classes. Client 0: x = (1, 0) and (0, 1), both class 0;
    client 1: x = (0, 2), class 1."""
    x = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 2.0]], np.float32)
    y = np.array([0, 0, 1], np.int64)
    task = Task(
        seed=0,
        model="logreg",
        spec=DataSpec((2,), 2, scale=1.0),
        local_epochs=1,
        batch_size=8,
        lr=0.1,
        momentum=0.0,
        weight_decay=0.0,
        participation=1.0,
        eval_batch_size=8,
    )
    none = np.zeros(0, np.int64)
    clients = {0: ClientIndices(np.array([0, 1]), none), 1: ClientIndices(np.array([2]), none)}
    return LocalFederation(task, ArrayDataset(x, y), ArrayDataset(x, y), clients)


def test_the_update_rule_by_hand():
    """From W = 0, b = 0 every softmax is (1/2, 1/2), so a sample's gradient is (p - e_y) x^T for W and
    p - e_y for b. fraction 0.5: client 0 draws k_0 = 1 of its 2 samples, client 1 its one (k_1 = 1).
      client 0, drew (1, 0): g_W = [[-.5, 0], [.5, 0]], g_b = (-.5, .5): W_0 = [[.05, 0], [-.05, 0]], b_0 = (.05, -.05)
      client 0, drew (0, 1): g_W = [[0, -.5], [0, .5]], g_b = (-.5, .5): W_0 = [[0, .05], [0, -.05]], b_0 = (.05, -.05)
      client 1: g_W = (.5, -.5)^T (0, 2) = [[0, 1], [0, -1]], g_b = (.5, -.5): W_1 = [[0, -.1], [0, .1]], b_1 = (-.05, .05)
    The server averages by k (1 : 1), not by the splits' sizes (2 : 1, which would give b = (1/60, -1/60)),
    and takes the average as it is (no server step). Client 0's whole split instead of its draw
    would give W_0 = [[.025, .025], [-.025, -.025]]: neither answer below."""
    hand = {
        "drew (1, 0)": np.array([[0.025, -0.05], [-0.025, 0.05]]),
        "drew (0, 1)": np.array([[0.0, -0.025], [0.0, 0.025]]),
    }
    fed = _hand_federation()
    hp = minibatch_sgd.Hparams(fraction=0.5)
    zero = {k: np.zeros_like(v) for k, v in minibatch_sgd.init(fed, hp).params.items()}
    assert set(zero) == {"head.weight", "head.bias"}
    seen = set()
    for rnd in range(8):  # each round's own draw: both of client 0's samples come up
        new, records = minibatch_sgd.round(minibatch_sgd.State(zero), fed, hp, rnd)
        np.testing.assert_allclose(new.params["head.bias"], [0.0, 0.0], rtol=0, atol=1e-8)
        (which,) = [
            k for k, w in hand.items() if np.allclose(new.params["head.weight"], w, rtol=0, atol=1e-7)
        ]
        seen.add(which)
        assert {r["metric"]: r["value"] for r in records}["participants"] == 2
    assert seen == set(hand)


def test_one_batch_of_the_whole_split_local_epochs_and_drop_last_are_required(tmp_path):
    with pytest.raises(ConfigError, match="config key 'local_epochs': minibatch_sgd takes one step"):
        small_config(tmp_path, algorithm="minibatch_sgd", local_epochs=2)
    with pytest.raises(ConfigError, match="config key 'drop_last': minibatch_sgd's one batch"):
        small_config(tmp_path, algorithm="minibatch_sgd", drop_last=True)
    for bad in (0.0, 1.5):
        with pytest.raises(ConfigError, match=r"config key 'hp.fraction': must be in \(0, 1\]"):
            small_config(tmp_path, algorithm="minibatch_sgd", hp={"fraction": bad})
    with pytest.raises(ConfigError, match="did you mean 'hp.fraction' \\(a hyperparameter of minibatch_sgd"):
        from_dict({"algorithm": "minibatch_sgd", "fraction": 0.1})
    cfg = small_config(tmp_path, algorithm="minibatch_sgd", batch_size=32)
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    n = fed.num_examples()
    largest = max(n.values())
    with pytest.raises(ValueError, match=f"config key 'batch_size'.* set batch_size >= {largest}, got 32"):
        minibatch_sgd.init(fed, HP({}))


SMALL = dict(
    algorithm="minibatch_sgd",
    hp={"fraction": 0.3},
    participation=0.5,
    client_test_fraction=0.2,
    rounds=3,
    local_epochs=1,
    batch_size=128,
    seed=7,
)


@pytest.mark.ray
def test_local_and_ray_with_1_and_3_actors_give_identical_metrics(ray_session, tmp_path):
    from actors.federation import make_ray_federation

    local = small_config(tmp_path / "local", **SMALL)
    list(execute(local, make_local_federation))
    ref = round_metrics(local.output)
    assert {"accuracy", "local_accuracy", "sgd_loss", "bytes_up"} <= set(ref["metric"])
    for n in (1, 3):
        cfg = small_config(tmp_path / f"ray{n}", num_actors=n, **SMALL)
        events = list(execute(cfg, make_ray_federation))
        assert events[0].placement["actors"] == n
        got = round_metrics(cfg.output)
        assert got.equals(ref), f"{n} actors differ from --local:\n{got.compare(ref)}"


def test_stacked_clients_give_the_per_client_numbers(tmp_path):
    # a CNN whose clients stack (digits' 8x8 images), clients of unequal sizes: drawn and whole splits
    over = {**DIGITS, "model": "mcmahan_cnn", "num_clients": 8, "lr": 0.05, "weight_decay": 1e-4}
    runs, calls = {}, {}
    for mode in ("off", "on"):
        cfg = small_config(
            tmp_path / mode, algorithm="minibatch_sgd", hp={"fraction": 0.3}, batched_clients=mode, **over
        )
        calls[mode] = list(execute(cfg, make_local_federation))[-1].summary["batched_calls"]
        assert load_runs(cfg.output)["summary"].iloc[0]["batched_calls"] == calls[mode]
        runs[mode] = round_metrics(cfg.output)
    assert calls["off"] == 0 and calls["on"] > 0
    m = runs["off"].merge(runs["on"], on=["round", "metric", "scope", "entity"], suffixes=("_off", "_on"))
    assert len(m) == len(runs["off"]) == len(runs["on"])
    acc, loss = m[m.metric.str.endswith("accuracy")], m[m.metric.str.endswith("loss")]
    assert len(acc) and len(loss)
    assert (acc.value_off - acc.value_on).abs().max() <= 1e-3
    assert ((loss.value_off - loss.value_on).abs() / loss.value_off.abs()).max() <= 1e-4
