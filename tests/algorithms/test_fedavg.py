"""FedAvg's update rule, checked against numbers worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedray.algorithms.baselines import fedavg
from fedray.algorithms.rounds import fedavg_aggregate
from fedray.data import ArrayDataset, ClientIndices, DataSpec
from fedray.engine.client import Task
from fedray.federation import sample_clients
from fedray.federation.local import LocalFederation
from fedray.params import WeightedSum, get_params, set_params, weighted_average


def test_weighted_average_by_hand():
    # n1 = 10, n2 = 30: w = (10 * w1 + 30 * w2) / 40
    w1 = {"w": np.array([1.0, 2.0], np.float32), "count": np.array(4, np.int64)}
    w2 = {"w": np.array([4.0, -1.0], np.float32), "count": np.array(8, np.int64)}
    out = weighted_average([w1, w2], [10, 30])
    np.testing.assert_array_equal(out["w"], np.array([3.25, -0.25], np.float32))  # (10+120)/40, (20-30)/40
    assert out["w"].dtype == np.float32
    assert out["count"] == 7 and out["count"].dtype == np.int64  # (40 + 240) / 40 = 7


def test_weighted_sum_by_hand_one_state_at_a_time():
    acc = WeightedSum()
    acc.add({"w": np.array([1.0, 2.0], np.float32), "count": np.array(4, np.int64)}, 10)
    acc.add({"w": np.array([4.0, -1.0], np.float32), "count": np.array(8, np.int64)}, 30)
    out = acc.result()  # (10 * w1 + 30 * w2) / 40, as weighted_average's hand case
    np.testing.assert_array_equal(out["w"], np.array([3.25, -0.25], np.float32))
    assert out["w"].dtype == np.float32 and out["count"] == 7 and out["count"].dtype == np.int64
    assert acc.count == 2 and acc.total == 40
    with pytest.raises(KeyError, match="differ"):
        acc.add({"v": np.zeros(2)}, 1)
    with pytest.raises(ValueError, match="weight sum 0"):
        WeightedSum().result()


def test_aggregate_is_order_independent_and_rejects_bad_weights():
    replies = {
        3: {"params": {"w": np.array([1.0])}, "num_examples": 1},
        1: {"params": {"w": np.array([3.0])}, "num_examples": 3},
    }
    assert fedavg_aggregate(replies)["w"].tolist() == [2.5]  # (1*1 + 3*3) / 4
    with pytest.raises(ValueError, match="positive sum"):
        weighted_average([{"w": np.zeros(1)}], [0])


def test_server_lr_step_by_hand():
    cur = {"w": np.array([0.0, 2.0], np.float32)}
    avg = {"w": np.array([3.25, -0.25], np.float32)}
    np.testing.assert_array_equal(fedavg.server_step(cur, avg, 0.5)["w"], [1.625, 0.875])  # w + 0.5 (avg - w)
    assert fedavg.server_step(cur, avg, 1.0) is avg


def _two_client_data() -> tuple[np.ndarray, np.ndarray]:
    """30 samples: client 0 holds the first 10, client 1 the other 20."""
    g = np.random.default_rng(0)
    return g.normal(size=(30, 4)).astype(np.float32), g.integers(0, 3, size=30).astype(np.int64)


def _two_client_federation(
    local_epochs: int, batch_size: int, momentum: float = 0.0, drop_last: bool = False
) -> LocalFederation:
    x, y = _two_client_data()
    task = Task(
        seed=0,
        model="mlp",
        spec=DataSpec((4,), 3, scale=1.0),
        local_epochs=local_epochs,
        batch_size=batch_size,
        lr=0.1,
        momentum=momentum,
        weight_decay=0.0,
        participation=1.0,
        eval_batch_size=64,
        drop_last=drop_last,
    )
    clients = {
        0: ClientIndices(np.arange(0, 10), np.zeros(0, np.int64)),
        1: ClientIndices(np.arange(10, 30), np.zeros(0, np.int64)),
    }
    return LocalFederation(task, ArrayDataset(x, y), ArrayDataset(x, y), clients)


def test_one_full_batch_step_equals_one_centralised_gradient_step():
    """With one epoch of one full-batch SGD step per client, FedAvg's weighted average is exactly
    w - lr * sum_i (n_i/n) grad L_i(w) = w - lr * grad L(w): one gradient step on the union."""
    fed = _two_client_federation(local_epochs=1, batch_size=1000)
    state = fedavg.init(fed, fedavg.Hparams())
    new, records = fedavg.round(state, fed, fedavg.Hparams(), rnd=0)

    model = fed.task.build_model()
    set_params(model, state.params)
    x, y = (torch.from_numpy(a) for a in _two_client_data())
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    expected = get_params(model)
    for k in expected:
        np.testing.assert_allclose(new.params[k], expected[k], rtol=1e-5, atol=1e-6)
    recorded = {r["metric"]: r["value"] for r in records}
    assert recorded["participants"] == 2
    # the same loss, sample-weighted
    assert recorded["sgd_loss"] == pytest.approx(float(loss.detach()), rel=1e-5)


def test_partial_participation_samples_first_floor_n_p_of_a_permutation():
    fed = _two_client_federation(local_epochs=1, batch_size=8)
    ids = list(range(10))
    picks = [tuple(sample_clients(ids, 0.35, np.random.default_rng(s))) for s in range(20)]
    assert all(len(p) == 3 and list(p) == sorted(p) for p in picks)  # floor(10 * 0.35) = 3, sorted
    assert len(set(picks)) > 5
    for s in range(5):  # a federation samples its sorted id array the same way: the same draws
        rng = np.random.default_rng(s)
        assert fed.sample(0.5, rng) == sample_clients(fed.client_ids, 0.5, np.random.default_rng(s))
    assert fed.sample(0.01, np.random.default_rng(0)) in ([0], [1])  # at least one client


def test_traffic_counts_each_participant_download_and_upload():
    fed = _two_client_federation(local_epochs=1, batch_size=8)
    state = fedavg.init(fed, fedavg.Hparams())
    fed.take_traffic()
    fedavg.round(state, fed, fedavg.Hparams(), rnd=0)
    down, up, _ = fed.take_traffic()
    model_bytes = sum(v.nbytes for v in state.params.values())
    # two clients received the model (+ pickle framing)
    assert 2 * model_bytes < down < 2 * model_bytes + 4000
    assert 2 * model_bytes < up < 2 * model_bytes + 4000
    assert fed.take_traffic() == (0, 0, 0)


def _one_client_federation(momentum: float) -> LocalFederation:
    x, y = _two_client_data()
    task = Task(
        seed=0,
        model="mlp",
        spec=DataSpec((4,), 3, scale=1.0),
        local_epochs=1,
        batch_size=1000,
        lr=0.1,
        momentum=momentum,
        weight_decay=0.0,
        participation=1.0,
        eval_batch_size=64,
    )
    return LocalFederation(
        task, ArrayDataset(x, y), ArrayDataset(x, y), {0: ClientIndices(np.arange(30), np.zeros(0, np.int64))}
    )


@pytest.mark.parametrize("persistent", [True, False])
def test_the_fedrc_codes_kept_optimizer_carries_momentum_across_rounds(persistent):
    """One client, one full-batch step a round, momentum 0.9: with the client's optimizer kept (the
    FedRC code's FedAvg) two rounds are two steps of one SGD, v2 = 0.9 g1 + g2; with a fresh one
    (the paper, the default) the second round's step is lr * g2 alone."""
    fed = _one_client_federation(momentum=0.9)
    hp = fedavg.Hparams(persistent_optimizer=persistent)
    state = fedavg.init(fed, hp)
    model = fed.task.build_model()
    set_params(model, state.params)
    x, y = (torch.from_numpy(a) for a in _two_client_data())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for rnd in range(2):
        state, _ = fedavg.round(state, fed, hp, rnd=rnd)
        if not persistent:
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    expected = get_params(model)
    for k in expected:
        np.testing.assert_allclose(state.params[k], expected[k], rtol=1e-5, atol=1e-6)


def test_the_fedrc_codes_loaders_drop_the_last_partial_batch():
    steps = {}
    for drop in (False, True):  # the run's drop_last (hp.drop_last or the config key), in its Task
        fed = _two_client_federation(local_epochs=1, batch_size=8, drop_last=drop)  # clients of 10 and 20
        state = fedavg.init(fed, fedavg.Hparams())
        msg = {"params": state.params, "round": 0, "persistent_optimizer": False}
        replies = fed.map(fedavg.kept_update, [0, 1], msg)
        steps[drop] = [replies[c]["steps"] for c in (0, 1)]
    assert steps == {False: [2, 3], True: [1, 2]}  # 10 = 8 + 2, 20 = 8 + 8 + 4
    # the default round is NIID-Bench's: no kept buffers, every batch
    assert fedavg.Hparams().persistent_optimizer is False and fedavg.Hparams().drop_last is False
