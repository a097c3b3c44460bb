"""Cross-device runs: clients made on demand (`fedray.data.SourcedClients`), the fixed sample of
clients an evaluation walks (``eval_clients``), and what the coordinator keeps per client."""

from __future__ import annotations

import numpy as np
import pytest

from fedray.algorithms import ALGORITHMS
from fedray.data import ArrayDataset, ClientSource, SourcedClients, build_federated_data
from fedray.engine.evaluation import evaluate
from fedray.experiment.local import make_local_federation, task_for
from fedray.experiment.loop import RoundDone, execute
from fedray.federation.host import ClientHost
from fedray.storage.checkpoint import Checkpoints
from tests.conftest import small_config
from tests.helpers import round_metrics, run_metrics


def _cfg(tmp_path, **over):
    base = dict(
        dataset="fedprox_synthetic",
        model="logreg",
        num_clients=40,
        batch_size=10,
        lr=0.05,
        momentum=0.0,
        weight_decay=0.0,
        local_epochs=1,
        rounds=3,
        participation=0.1,
    )
    return small_config(tmp_path, **{**base, **over})


class _Counting(ClientSource):
    """Client k: k + 3 samples of value k (the first k + 1 for training), counting what is made."""

    def __init__(self, n: int) -> None:
        self.num_clients, self.made = n, []

    def split(self, cid):
        return cid + 1, 2

    def samples(self, cid):
        self.made.append(cid)
        n = cid + 3
        return ArrayDataset(np.full((n, 2), cid, np.float32), np.arange(n) % 2)


def test_a_host_makes_a_client_when_it_is_used_and_keeps_a_few(tmp_path, monkeypatch):
    from fedray.federation import host as host_module

    task = task_for(small_config(tmp_path), build_federated_data(small_config(tmp_path)).dataset.spec)
    src = _Counting(10**6)
    host = ClientHost(task, ArrayDataset(np.zeros((0, 2)), np.zeros(0, np.int64)), SourcedClients(src))
    assert src.made == [] and host.client_ids == range(10**6)
    client = host.client(999)
    assert src.made == [999] and client.num_examples == 1000 and client.num_test_examples == 2
    np.testing.assert_array_equal(client.train_labels(), np.arange(1000) % 2)
    assert (client._data.x[client.test_idx] == 999).all()
    host.client(999)
    assert src.made == [999]  # kept: a training call and the evaluation after it make it once
    monkeypatch.setattr(host_module, "MADE_BYTES", 100)  # room for one small client only
    host.client(3), host.client(4), host.client(3)
    assert src.made == [999, 3, 4, 3]  # the least recently used went
    ids, train, test = host.sizes()
    assert len(ids) == 10**6 and train[7] == 8 and test[7] == 2


def test_clients_made_on_demand_give_the_same_numbers_on_ray_with_1_and_3_actors(ray_session, tmp_path):
    """Ray hosts every A-th client on actor A; the numbers do not depend on it (SCAFFOLD: state
    kept on the actors), and the clients' states come back through a checkpoint."""
    from actors.federation import make_ray_federation

    over = dict(algorithm="scaffold", rounds=3, eval_clients=12)
    local = _cfg(tmp_path / "local", **over)
    ref = run_metrics(local)
    fed, _ = make_local_federation(local, build_federated_data(local))
    sampled = {c for rnd in range(3) for c in fed.sample(0.1, fed.task.rng("sample", rnd=rnd))}
    assert {"accuracy", "local_accuracy", "train_accuracy"} <= set(ref["metric"])
    for n in (1, 3):
        cfg = _cfg(tmp_path / f"ray{n}", num_actors=n, **over)
        events = list(execute(cfg, make_ray_federation))
        assert events[0].placement["actors"] == n and events[0].num_clients == 40
        got = round_metrics(cfg.output)
        assert got.equals(ref), got.compare(ref)
        ckpt = Checkpoints(cfg.output, cfg.run_id(), 1).latest()
        saved = sorted(int(f[8:14]) for f in ckpt.files if f.startswith("clients/"))
        assert saved == sorted(sampled)  # exactly the clients that trained hold a control variate


def test_evaluation_walks_only_the_eval_clients(tmp_path):
    """local_accuracy and train_accuracy pool over the drawn eval clients alone; with fedprox_synthetic
    the global test set is their test splits; the draw is fixed by the seed."""
    cfg = _cfg(tmp_path, eval_clients=5, rounds=1)
    data = build_federated_data(cfg)
    assert data.eval_clients == build_federated_data(cfg).eval_clients and len(data.eval_clients) == 5
    fed, _ = make_local_federation(cfg, data)
    assert fed.eval_client_ids == data.eval_clients and len(fed.client_ids) == 40
    alg = ALGORITHMS["fedavg"]
    hp = alg.make_hparams({})
    state = alg.init(fed, hp)
    got = {r["metric"]: r["value"] for r in alg.evaluate(state, fed, hp, 0) if r["scope"] == "global"}
    test, train = [], []
    for cid in data.eval_clients:
        c = fed.host.client(cid)
        test.append(evaluate(c.model(state.params), c.test_batches()))
        train.append(evaluate(c.model(state.params), c.eval_train_batches()))
    assert got["local_accuracy"] == pytest.approx(sum(t.correct for t in test) / sum(t.samples for t in test))
    assert got["accuracy"] == pytest.approx(got["local_accuracy"])  # the pooled test splits: the same samples
    assert len(data.dataset.test) == sum(t.samples for t in test)
    assert got["train_accuracy"] == pytest.approx(
        sum(t.correct for t in train) / sum(t.samples for t in train)
    )


def test_an_indexed_data_sets_eval_clients_are_drawn_from_its_training_clients(tmp_path):
    cfg = small_config(tmp_path, num_clients=10, eval_clients=3, client_test_fraction=0.2)
    data = build_federated_data(cfg)
    assert len(data.eval_clients) == 3 and set(data.eval_clients) <= set(range(10))
    every = run_metrics(small_config(tmp_path / "all", num_clients=10, client_test_fraction=0.2))
    some = run_metrics(cfg)
    # training is the same; the evaluation over 3 clients differs from the one over all 10
    train = ~some["metric"].isin(["local_accuracy", "train_accuracy", "train_loss"])
    assert (
        some[train]
        .reset_index(drop=True)
        .equals(
            every[~every["metric"].isin(["local_accuracy", "train_accuracy", "train_loss"])].reset_index(
                drop=True
            )
        )
    )
    assert not some.equals(every)


def test_a_round_records_its_clients_seconds(tmp_path):
    cfg = _cfg(tmp_path, rounds=2)
    events = list(execute(cfg, make_local_federation))
    from analysis import load_metrics

    m = load_metrics(cfg.output)
    for rnd in (1, 2):
        row = m[m["round"] == rnd].set_index("metric")["value"]
        assert 0 < row["client_seconds"] <= row["seconds"]
    assert sum(isinstance(e, RoundDone) for e in events) == 2


def test_an_average_built_one_state_at_a_time_is_the_average_of_all_bit_for_bit():
    from fedray.params import OrderedAverage, weighted_average

    g = np.random.default_rng(0)
    states = [
        {"w": g.normal(size=(7, 3)).astype(np.float32), "n": np.array(g.integers(0, 9))} for _ in range(5)
    ]
    weights = [3, 0, 11, 5, 2]
    avg = OrderedAverage(weights)
    for s in states:
        avg.add(s)
    got, want = avg.result(), weighted_average(states, weights)
    assert all(np.array_equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)
    with pytest.raises(ValueError, match="4 states but 5"):
        short = OrderedAverage(weights)
        for s in states[:4]:
            short.add(s)
        short.result()


@pytest.mark.parametrize(
    "algorithm, hp, holds",
    [
        (
            "clusamp",
            {},
            r"keeps every drawn client's last update \([\d,]+ values\) and builds the N x N distances each round",
        ),
        ("clusamp", {"similarity": "none"}, "builds m x N strata each round"),
        ("fedcat", {}, "keeps an N x K table of counts"),
    ],
)
def test_a_cross_silo_method_too_big_for_this_machine_is_refused_before_anything_starts(
    tmp_path, monkeypatch, algorithm, hp, holds
):
    from fedray.algorithms import scale
    from fedray.config.coercion import ConfigError

    # rounds: FedCat's runs are whole cycles of its K = 200 groups
    over = dict(
        algorithm=algorithm,
        hp=hp,
        num_clients=2000,
        participation=0.1,
        partition_min_size=1,
        synthetic_size=4000,
        rounds=200,
    )
    monkeypatch.setattr(scale, "machine_memory", lambda: 1 << 20)  # a 1 MiB machine
    with pytest.raises(
        ConfigError,
        match=rf"config key 'num_clients': {algorithm} {holds}: about [\d.]+ GB, more "
        r"than half .* cross-silo method .* fits at most about [\d,]+ clients",
    ):
        small_config(tmp_path, **over)
    monkeypatch.setattr(scale, "machine_memory", lambda: 1 << 34)
    assert small_config(tmp_path, **over).num_clients == 2000
    most = scale.most_clients(lambda n: 8 * n * n, 800)
    assert (most, 8 * most * most <= 800 < 8 * (most + 1) ** 2) == (10, True)


def test_a_source_that_fails_to_make_a_client_names_the_client(tmp_path):
    """A ClientSource's error while making a client is the run's error, with the client's id."""
    from fedray.federation import ClientError

    class Broken(_Counting):
        def samples(self, cid):
            if cid == 7:
                raise OSError("the shard of client 7 is unreadable")
            return super().samples(cid)

    task = task_for(small_config(tmp_path), build_federated_data(small_config(tmp_path)).dataset.spec)
    host = ClientHost(task, ArrayDataset(np.zeros((0, 2)), np.zeros(0, np.int64)), SourcedClients(Broken(10)))
    with pytest.raises(
        ClientError, match="client 7: making its data or reading its state: OSError: the shard of client 7"
    ) as e:
        host.run_many(lambda c, s, m: (c.num_examples, s), [3, 7], None)
    assert e.value.cid == 7 and "samples" in e.value.remote_traceback
    assert host.run(lambda c, s, m: (c.num_examples, s), 3, None)[0] == 4
