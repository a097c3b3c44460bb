"""The stacked engine (fedray/engine/batched.py): the per-client engine's numbers for every kind of local
update and every algorithm, in-process and on Ray; which models and devices use it; its errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis import load_runs
from fedray.algorithms import rounds
from fedray.config.coercion import ConfigError
from fedray.data import ArrayDataset, ClientIndices, DataSpec, build_federated_data
from fedray.engine import batched, choice, step_options
from fedray.engine import evaluation as evaluation_module
from fedray.engine.client import Task
from fedray.engine.evaluation import evaluate_requests
from fedray.engine.stats import EvalStats
from fedray.engine.train import optimizer_state, sgd, train_update
from fedray.engine.update import Evaluation, Frozen, LocalUpdate, Step, cross_entropy, proximal
from fedray.experiment.checks import from_dict
from fedray.experiment.local import make_local_federation, task_for
from fedray.experiment.loop import execute
from fedray.federation import ClientError
from fedray.federation import host as host_module
from fedray.federation.host import ClientHost
from fedray.models import Arch
from fedray.params import get_params
from tests.conftest import small_config
from tests.helpers import ALGORITHM_HP, CONFIG_OVER, round_metrics


def _host(augment: str = "none", sizes=(37, 64, 5, 0, 90), momentum=0.9, wd=1e-3, lr=0.05) -> ClientHost:
    """Clients of unequal sizes (one with no data, one a single partial batch) on 3x6x6 images."""
    g = np.random.default_rng(0)
    n = sum(sizes)
    data = ArrayDataset(g.random((n, 3, 6, 6)).astype(np.float32), g.integers(0, 4, n))
    spec = DataSpec((3, 6, 6), 4, 1.0, mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.4), augment=augment)
    cfg = small_config(
        Path("/tmp/unused"),
        model="mlp",
        batch_size=16,
        local_epochs=2,
        lr=lr,
        momentum=momentum,
        weight_decay=wd,
        channels_last=False,
    )
    task = task_for(cfg, spec)
    bounds = np.cumsum((0, *sizes))
    clients = {
        i: ClientIndices(np.arange(bounds[i], bounds[i + 1]), np.zeros(0, np.int64))
        for i in range(len(sizes))
    }
    return ClientHost(task, data, clients)


def _starts(host: ClientHost, k: int):
    return [get_params(host.task.build_model(f"init/{i}")) for i in range(k)]


def _close(a, b, atol=2e-6):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=atol, err_msg=k)


def _contrastive(model, batch, context):
    """MOON's form on the MLP: CE + mu * a cross-entropy over cosine similarities of the encoder's
    features with a frozen shared model's and a frozen per-client model's."""
    z = model.encoder(batch.x)
    logits = model.head(z)
    ce = batch.cross_entropy(logits)
    with torch.no_grad():
        others = [context["glob"].encoder(batch.x), context["prev"].encoder(batch.x)]
    sims = torch.stack([torch.nn.functional.cosine_similarity(z, o, dim=1) for o in others], dim=1)
    target = torch.zeros(len(batch.y), dtype=torch.long, device=batch.y.device)
    return Step(logits, ce, ce + context["mu"] * batch.cross_entropy(sims / 0.5, target))


def _offsets(model, batch, context):
    """FedLC's form: the loss on the logits minus a per-client vector."""
    out = model(batch.x)
    ce = batch.cross_entropy(out - context["per_class"])
    return Step(out, ce, ce)


def _updates(host, case, starts, rnd):
    """One update per client of ``host`` for ``case``, with real SGD buffers and per-client values."""
    cids = host.client_ids
    g = np.random.default_rng(1)
    updates = []
    for i, c in enumerate(cids):
        client, start = host.client(c), starts[i]
        kw = {}
        if case == "prox":
            kw.update(objective=proximal, context={"anchor": start, "mu": 0.3 if i % 2 else 0.1})
        elif case == "correction":
            kw["correction"] = {k: g.normal(0, 0.01, v.shape).astype(np.float32) for k, v in start.items()}
        elif case == "buffers":  # one step's worth on the client's data
            m = client.model(start)
            opt = sgd(m.parameters(), client)
            m(torch.zeros(1, 3, 6, 6)).sum().backward()
            opt.step()
            kw.update(buffers=optimizer_state(opt, m), keep_buffers=True)
        elif case == "weights":
            kw.update(weights=g.random(client.num_examples), drop_last=True)
        elif case == "epochs":  # a straggler's fewer epochs, a cap on steps
            kw.update(epochs=1 + i % 2, max_steps=None if i % 3 else 3)
        elif case == "trainable":
            kw["trainable"] = ["head.weight", "head.bias"]
        elif case == "frozen":
            glob = Frozen(starts[0])  # one model shared by every client, one of its own each
            kw.update(
                objective=_contrastive, context={"mu": 0.5, "glob": glob, "prev": Frozen(starts[-1 - i])}
            )
        elif case == "per_class":
            kw.update(objective=_offsets, context={"per_class": g.random(4).astype(np.float32)})
        updates.append(LocalUpdate(start, rnd, **kw))
    return updates


# the resident feeder shrinking the stack as clients finish (CPU), the same with a fixed stack
# (CUDA's, whose steps replay as one graph), and the streamed feeder (augmented data)
@pytest.mark.parametrize("augment,fixed", [("none", False), ("none", True), ("crop_flip", False)])
@pytest.mark.parametrize(
    "case",
    ["plain", "prox", "correction", "buffers", "weights", "epochs", "trainable", "frozen", "per_class"],
)
def test_each_update_trains_in_the_stack_as_the_per_client_engine_trains_it(augment, fixed, case):
    host = _host(augment)
    cids = host.client_ids
    starts = _starts(host, len(cids))
    updates = _updates(host, case, starts, 3)
    got = batched.train_stacked([host.client(c) for c in cids], updates, fixed=fixed)
    for i, c in enumerate(cids):
        alone = train_update(host.client(c), updates[i])
        _close(alone.params, got[i].params)
        assert (got[i].stats.steps, got[i].stats.samples, got[i].stats.correct) == (
            alone.stats.steps,
            alone.stats.samples,
            alone.stats.correct,
        )
        assert got[i].stats.loss_sum == pytest.approx(alone.stats.loss_sum, rel=1e-5, abs=1e-6)
        if case == "buffers":
            _close(alone.buffers, got[i].buffers)
        else:
            assert got[i].buffers is None
        if case == "trainable":
            assert all(
                np.array_equal(got[i].params[k], starts[i][k]) for k in starts[i] if k.startswith("encoder.")
            )
    assert got[3].stats.steps == 0 and got[3].params.keys() == starts[3].keys()  # the client without data
    _close(got[3].params, starts[3], atol=0)
    steps = [t.stats.steps for t in got]
    stepped = sum(t.stats.stacked for t in got)
    if fixed:  # lanes: fewer rows than updates, each as long as the longest update
        lanes = batched.lanes_of(steps)
        assert len(lanes) < len(cids) and any(len(lane) > 1 for lane in lanes)
        assert stepped == 16 * len(lanes) * max(steps)
    else:  # a shrinking stack steps each update's own batches
        assert stepped == 16 * sum(steps)


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("case", ["plain", "correction", "buffers"])
def test_updates_of_clients_with_their_own_learning_rates_train_in_one_stack(fixed, case):
    """Two runs' clients with different learning rates (packed runs, fedray/sweeps/pack.py) in one stack:
    each update as the per-client engine trains it at its client's rate (SCAFFOLD's correction
    scaled by it too, momentum buffers kept); in a fixed stack the rate follows an update into its
    lane."""
    hosts = [_host(lr=0.05), _host(lr=0.2, sizes=(20, 70, 33))]
    clients, updates = [], []
    for h in hosts:
        starts = _starts(h, len(h.client_ids))
        clients += [h.client(c) for c in h.client_ids]
        updates += _updates(h, case, starts, 3)
    assert choice.stack_key(hosts[0].task) == choice.stack_key(hosts[1].task)
    got = batched.train_stacked(clients, updates, fixed=fixed)
    for client, update, trained in zip(clients, updates, got, strict=True):
        alone = train_update(client, update)
        _close(alone.params, trained.params)
        if case == "buffers":
            _close(alone.buffers, trained.buffers)
    # not the same rate for all: the second run's clients moved further
    moved = [
        max(float(np.abs(t.params[k] - u.params[k]).max()) for k in u.params)
        for t, u in zip(got, updates, strict=True)
    ]
    assert max(moved[5:]) > max(moved[:5])


@pytest.mark.parametrize("case", ["buffers", "frozen"])
def test_a_compiled_stack_trains_each_update_as_the_per_client_engine_trains_it(monkeypatch, case):
    # the compiled step being measured on GPUs (fedray.engine.step_options), in a fixed stack as
    # on CUDA: SGD with kept momentum buffers and weight decay; MOON's form with frozen models. The
    # step is traced whole (fullgraph: what could break is fedray's, the closures, vmap and grad)
    # and run by AOT autograd's eager backend: inductor's code generation is torch's own, and
    # costs 35 s here on a cold cache (its numbers: docs/benchmark.md).
    compiled = []
    compile_ = torch.compile
    monkeypatch.setattr(step_options, "_options", step_options.StepOptions(compile=True))
    monkeypatch.setattr(
        torch, "compile", lambda fn, **kw: compiled.append(kw) or compile_(fn, backend="aot_eager", **kw)
    )
    host = _host()
    cids = host.client_ids
    updates = _updates(host, case, _starts(host, len(cids)), 3)
    got = batched.train_stacked([host.client(c) for c in cids], updates, fixed=True)
    assert compiled == [{"fullgraph": True}]
    for i, c in enumerate(cids):
        alone = train_update(host.client(c), updates[i])
        _close(alone.params, got[i].params, atol=1e-5)
        assert got[i].stats.correct == alone.stats.correct
        assert got[i].stats.loss_sum == pytest.approx(alone.stats.loss_sum, rel=1e-5, abs=1e-6)
        if case == "buffers":
            _close(alone.buffers, got[i].buffers, atol=1e-5)


def test_lanes_run_the_updates_one_after_another_none_longer_than_the_longest():
    # first-fit decreasing, worked by hand: capacity 5; 0 (5) opens lane 0, 5 (4) lane 1, 2 (3)
    # lane 2; 3 (2) fits only lane 2 (3 + 2), 1 (1) lane 1 (4 + 1), 4 (0 steps) lane 0
    assert batched.lanes_of([5, 1, 3, 2, 0, 4]) == [[0, 4], [5, 1], [2, 3]]
    assert batched.lanes_of([3, 3, 3]) == [[0], [1], [2]]  # nothing to share
    assert batched.lanes_of([]) == []


def test_the_k_models_of_one_client_and_features_in_place_of_images_stack_too():
    host = _host()
    client = host.client(4)
    starts = _starts(host, 3)
    width = host.task.build_model(arch=Arch(1, head_only=True)).in_features
    feats = np.random.default_rng(2).random((client.num_examples, width)).astype(np.float32)
    head = [
        {"weight": np.full((4, width), 0.01 * k, np.float32), "bias": np.zeros(4, np.float32)}
        for k in range(3)
    ]
    cases = [
        [LocalUpdate(s, 1, weights=np.full(client.num_examples, 0.5 + k)) for k, s in enumerate(starts)],
        [LocalUpdate(h, 1, arch=Arch(1, head_only=True), inputs=feats, epochs=1, max_steps=4) for h in head],
    ]
    for updates in cases:
        got = batched.train_stacked([client] * 3, updates)
        for u, t in zip(updates, got, strict=True):
            _close(train_update(client, u).params, t.params)


def test_evaluation_on_a_split_kept_on_the_device_gives_the_hosts_batches():
    # On CUDA batched training keeps each client's training split on the device; evaluating on it
    # slices that copy instead of converting and moving the split from the host again. Played here
    # by keeping the split as CUDA would (the values must be the host path's, bit for bit).
    from fedray.engine.client import iterate
    from fedray.engine.evaluation import evaluate

    host = _host(sizes=(37, 64, 5))
    host.task = dataclasses.replace(host.task, eval_batch_size=16)
    client = host.client(1)
    model = client.model(_starts(host, 1)[0])
    from_host = list(iterate(client._data, client.train_idx, client.task, client.device))
    before = evaluate(model, client.eval_train_batches())
    client._model_cache[("train_tensors", client.cid)] = client.train_tensors()
    kept = list(client.eval_train_batches())
    assert [len(y) for _, y in kept] == [len(y) for _, y in from_host] == [16, 16, 16, 16]
    for (xa, ya), (xb, yb) in zip(kept, from_host, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert evaluate(model, client.eval_train_batches()) == before


def test_a_test_split_kept_on_the_device_gives_the_hosts_batches_for_clients_and_test_shards():
    # On CUDA a client's test split, and each global test shard, is kept on the device after its
    # first evaluation. Played here by keeping them as CUDA would: the host path's values, bit for bit.
    from fedray.algorithms.evaluation import eval_batches
    from fedray.engine.client import Client, iterate
    from fedray.engine.evaluation import evaluate
    from fedray.federation import TEST_SHARD

    base = _host()
    task = dataclasses.replace(base.task, eval_batch_size=8)
    g = np.random.default_rng(1)
    test = ArrayDataset(g.random((45, 3, 6, 6)).astype(np.float32), g.integers(0, 4, 45))
    own = {0: ClientIndices(np.arange(0, 30), np.arange(30, 50))}  # a client with its own test split
    host = ClientHost(task, base._data, own, test=test)
    client = host.client(0)
    model = client.model(_starts(host, 1)[0])
    from_host = list(iterate(client._data, client.test_idx, task, client.device))
    before = evaluate(model, client.test_batches())
    stored = host._model_cache[client._test_key()] = client.test_tensors()
    kept = list(client.test_batches())
    # slices of the kept copy, not batches made again from the host's arrays
    assert all(x.untyped_storage().data_ptr() == stored[0].untyped_storage().data_ptr() for x, _ in kept)
    assert [len(y) for _, y in kept] == [len(y) for _, y in from_host] == [8, 8, 4]
    for (xa, ya), (xb, yb) in zip(kept, from_host, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert evaluate(model, client.test_batches()) == before
    # global test shards: a copy each, by its range
    msg = {"params": _starts(host, 1)[0]}
    shards = [(0, 20), (20, 45)]
    plain = [host.run_test(eval_batches, a, b, msg) for a, b in shards]
    for a, b in shards:
        shard = Client(
            TEST_SHARD, task, test, np.zeros(0, np.int64), np.arange(a, b), client.device, host._model_cache
        )
        host._model_cache[shard._test_key()] = shard.test_tensors()
    assert sum(k[:2] == ("test_tensors", TEST_SHARD) for k in host._model_cache) == 2
    assert [host.run_test(eval_batches, a, b, msg) for a, b in shards] == plain


def test_splits_are_kept_on_the_device_within_their_budget_and_past_it_nothing_is_moved(monkeypatch):
    # The budget (a share of the device's free memory when the first split is kept) is counted per
    # kind: test splits never crowd out training splits, and a split past it is neither made nor moved.
    host = _host(sizes=(37, 64, 5))
    a, b = host.client(0), host.client(1)
    per_sample = 4 * 3 * 6 * 6 + 8  # float32 3x6x6 inputs, an int64 label
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 * 100 * per_sample, 1 << 40))
    made = []

    def make(client):
        return lambda: made.append(client.cid) or client.train_tensors()

    key = lambda c: ("train_tensors", c.cid)  # noqa: E731
    assert a._kept_on_device(key(a), a.train_idx, make(a), share=8) is not None  # 37 of 100 samples
    assert b._kept_on_device(key(b), b.train_idx, make(b), share=8) is None  # 64 more: past it
    assert made == [0] and key(b) not in host._model_cache
    assert host._model_cache[("train_tensors_budget",)] == [(100 - 37) * per_sample]
    # test splits count against their own budget
    assert b._kept_on_device(("test_tensors", 1, 0, 64), b.train_idx, make(b), share=8) is not None
    assert made == [0, 1]


def _evaluates(client, cstate, msg):
    """Every model of the message on both splits, then the first again beside a training update."""
    stats = yield [Evaluation(m, split) for m in msg["models"] for split in ("train", "test")]
    again, trained = yield [Evaluation(msg["models"][0]), LocalUpdate(msg["models"][0], 0)]
    return [(s.samples, s.loss_sum, s.correct) for s in [*stats, again]] + [trained.stats.steps], cstate


def _trains_with_plain(client, cstate, msg):
    trained = yield LocalUpdate(msg["models"][0], 0)
    return trained.stats.steps, cstate


def _with_test_splits(mode: str) -> ClientHost:
    base = _host()
    task = dataclasses.replace(base.task, eval_batch_size=16, batched_clients=mode)
    own = {
        c: ClientIndices(ix.train[: len(ix.train) * 2 // 3], ix.train[len(ix.train) * 2 // 3 :])
        for c, ix in base._indices.items()
    }
    return ClientHost(task, base._data, own)


def test_evaluations_run_together_each_model_loaded_once_with_each_clients_own_numbers(monkeypatch):
    # What each client gets is `evaluate` of the model on its split alone, bit for bit, on either
    # engine; run together, each model is loaded once for all the clients evaluating it (one
    # group's message is one object), where one client at a time loads it for each client.
    from fedray.engine.client import Client
    from fedray.engine.evaluation import evaluate

    loads = []
    model = Client.model
    monkeypatch.setattr(
        Client,
        "model",
        lambda self, params=None, *a, **k: loads.append(self.cid) or model(self, params, *a, **k),
    )
    off, on = _with_test_splits("off"), _with_test_splits("on")
    msg = {"models": _starts(off, 2)}
    cids = off.client_ids
    expected = {}
    for cid in cids:
        client = off.client(cid)
        stats = [
            evaluate(
                client.model(m), client.eval_train_batches() if split == "train" else client.test_batches()
            )
            for m in msg["models"]
            for split in ("train", "test")
        ]
        expected[cid] = [(s.samples, s.loss_sum, s.correct) for s in [*stats, stats[0]]]
    assert sum(e[0][0] for e in expected.values()) > 0 and sum(e[1][0] for e in expected.values()) > 0
    for host in (off, on):
        loads.clear()
        host.run_many(_trains_with_plain, cids, msg)
        training = len(loads)
        loads.clear()
        replies = dict(zip(cids, [r for r, _ in host.run_many(_evaluates, cids, msg)], strict=True))
        assert {c: r[:-1] for c, r in replies.items()} == expected
        # each model once a yield: one client at a time, for each client (its two splits share
        # the load); together, once for all the clients
        assert len(loads) - training == 3 * (len(cids) if host is off else 1)


def _per_sample(client, cstate, msg):
    got = yield [
        Evaluation(m, split, per_sample=kind)
        for m in msg["models"]
        for split in ("train", "test")
        for kind in ("loss", "proba", "loss_proba")
    ]
    return got, cstate


def test_per_sample_evaluations_give_each_samples_loss_and_probabilities_in_split_order():
    # The E-steps' per-sample losses (float64) and the ensembles' probabilities (float32): each
    # the model's own on the client's batches, in order, on either engine; both from one pass
    # (loss_proba, what a mixture's evaluation keeps for the next E-step) are the same values.
    off, on = _with_test_splits("off"), _with_test_splits("on")
    msg = {"models": _starts(off, 2)}
    cids = off.client_ids
    for host in (off, on):
        replies = dict(zip(cids, [r for r, _ in host.run_many(_per_sample, cids, msg)], strict=True))
        for cid in cids:
            client = off.client(cid)
            got = iter(replies[cid])
            for m in msg["models"]:
                model = client.model(m).eval()
                for batches in (client.eval_train_batches, client.test_batches):
                    with torch.no_grad():
                        logits = [(model(x), y) for x, y in batches()]
                    loss, proba, (both_loss, both_proba) = next(got), next(got), next(got)
                    assert both_loss.dtype == loss.dtype and np.array_equal(both_loss, loss)
                    assert both_proba.dtype == proba.dtype and np.array_equal(both_proba, proba)
                    n = sum(len(y) for _, y in logits)
                    assert loss.dtype == np.float64 and loss.shape == (n,)
                    assert proba.dtype == np.float32 and proba.shape == (n, 4)
                    if n:
                        ce = torch.cat(
                            [torch.nn.functional.cross_entropy(z, y, reduction="none") for z, y in logits]
                        )
                        assert np.array_equal(loss, ce.double().numpy())
                        assert np.array_equal(
                            proba, torch.cat([torch.softmax(z, 1) for z, _ in logits]).numpy()
                        )


def test_a_failing_evaluation_names_its_client(monkeypatch):
    from fedray.engine.client import Client

    host = _with_test_splits("on")
    batches = Client.eval_train_batches

    def broken(self):
        if self.cid == 4:
            raise OSError("split unreadable")
        return batches(self)

    monkeypatch.setattr(Client, "eval_train_batches", broken)
    msg = {"params": _starts(host, 1)[0]}
    from fedray.algorithms.evaluation import member_eval

    with pytest.raises(
        ClientError, match=r"client 4: evaluating on its train split: OSError: split unreadable"
    ):
        host.run_many(member_eval, host.client_ids, msg)
    with pytest.raises(
        ClientError, match="client 0: TypeError: a client function yields a fedray.LocalUpdate or"
    ):
        host.run_many(_yields_nonsense, [0], msg)
    with pytest.raises(ValueError, match="split must be one of"):
        Evaluation(msg["params"], "validation")
    with pytest.raises(ValueError, match="per_sample must be one of"):
        Evaluation(msg["params"], per_sample="logits")
    with pytest.raises(ValueError, match="a head-only Arch takes features"):
        Evaluation(msg["params"], arch=Arch(concat=2, head_only=True))


def _yields_nonsense(client, cstate, msg):
    yield "evaluate me"
    return None, cstate


def test_updates_of_different_shapes_have_different_signatures():
    host = _host()
    s = _starts(host, 1)[0]
    plain = batched.signature(LocalUpdate(s, 0))
    assert batched.signature(LocalUpdate(s, 1, epochs=3)) == plain  # per-update values stack
    assert batched.signature(LocalUpdate(s, 0, objective=proximal, context={"anchor": s, "mu": 1.0})) != plain
    assert batched.signature(LocalUpdate(s, 0, weights=np.ones(3))) != plain
    assert batched.signature(LocalUpdate(s, 0, context={"prev": None})) != batched.signature(
        LocalUpdate(s, 0, context={"prev": Frozen(s)})
    )


# Every algorithm (FedAvg's two local updates; IFCA, FeSEM and CFL with kept buffers; FedEM with
# its kept buffers and dropped batches too), on a CNN with weight decay, clients of unequal sizes,
# momentum 0 (the stable setting: momentum amplifies round-off into whole runs on some cells).
ALL = {
    "fedavg": {},
    "fedavg-kept": {"algorithm": "fedavg", "hp": {"persistent_optimizer": True, "drop_last": True}},
    **{a: {"algorithm": a, "hp": hp, **CONFIG_OVER.get(a, {})} for a, hp in ALGORITHM_HP.items()},
    "fedem-kept": {
        "algorithm": "fedem",
        "hp": {**ALGORITHM_HP["fedem"], "persistent_optimizer": True, "drop_last": True},
    },
    "fedconcat-uncached": {
        "algorithm": "fedconcat",
        "hp": {**ALGORITHM_HP["fedconcat"], "cache_features": False},
    },
    "fedcat-carried": {
        "algorithm": "fedcat",
        "hp": {**ALGORITHM_HP["fedcat"], "optimizer_state": "carried"},
        **CONFIG_OVER["fedcat"],
    },
}
ALL = {
    name: {**over, "rounds": 4} if over.get("algorithm") == "fedcat" else over for name, over in ALL.items()
}


def _compare(off, on):
    """Every round's accuracy within 1e-3 and loss within 1e-4 (relative) of the per-client path's."""
    m = off.merge(on, on=["round", "metric", "scope", "entity"], suffixes=("_off", "_on"))
    assert len(m) == len(off) == len(on)
    acc = m[m.metric.str.endswith("accuracy")]
    loss = m[m.metric.str.endswith("loss")]
    assert len(acc) and len(loss)
    assert (acc.value_off - acc.value_on).abs().max() <= 1e-3
    assert ((loss.value_off - loss.value_on).abs() / loss.value_off.abs()).max() <= 1e-4
    return m


BASE = dict(
    dataset="digits",
    model="mcmahan_cnn",
    num_clients=8,
    participation=0.5,
    rounds=3,
    local_epochs=2,
    lr=0.05,
    momentum=0.0,
    weight_decay=1e-4,
    seed=3,
    algorithm="fedavg",
)


@pytest.mark.parametrize("name", list(ALL))
def test_batched_runs_give_the_per_client_numbers(tmp_path, name):
    _off_and_on_agree(tmp_path, {**BASE, **ALL[name]})


@pytest.mark.parametrize("name", ["fedavg", "moon"])
def test_stacked_convolutions_as_im2col_give_the_per_client_numbers(tmp_path, monkeypatch, name):
    # the convolution being measured on GPUs (fedray.engine.step_options): McMahan's CNN's "same"
    # convolutions (padding 2), MOON's frozen models too
    calls = []
    im2col = step_options.conv2d_im2col
    monkeypatch.setattr(step_options, "_options", step_options.StepOptions(conv="im2col"))
    monkeypatch.setattr(step_options, "conv2d_im2col", lambda *a, **k: calls.append(1) or im2col(*a, **k))
    _off_and_on_agree(tmp_path, {**BASE, **ALL[name]})
    assert calls


def test_the_step_options_are_checked_and_put_back():
    before = step_options.use(conv="im2col", compile=True, stacked_eval="off")
    try:
        assert step_options.current() == step_options.StepOptions("im2col", True, "off")
        with pytest.raises(ValueError, match="convolution must be one of grouped, im2col, got 'fft'"):
            step_options.use(conv="fft")
        with pytest.raises(ValueError, match="stacked evaluation must be one of auto, on, off, got 'yes'"):
            step_options.use(stacked_eval="yes")
        assert step_options.current().conv == "im2col"  # a refused option changes nothing
        assert not step_options.stacks_evaluations(torch.device("cuda", 0))
    finally:
        step_options.use(before.conv, before.compile, before.stacked_eval)
    assert step_options.current() == step_options.StepOptions() == before  # off by default
    # a client's models evaluated stacked where it pays: on a GPU, not on the CPU (whose numbers
    # stay the per-client engine's to the bit)
    assert step_options.stacks_evaluations(torch.device("cuda", 0))
    assert not step_options.stacks_evaluations(torch.device("cpu"))


def test_an_engine_carries_the_step_options_it_was_decided_under():
    # the options ride with the engine decision to every stacked call, not read from the process
    # deep inside the step: a later change of the process's options leaves a decided engine as it was
    from fedray.engine.choice import choose

    before = step_options.use(conv="im2col", stacked_eval="on")
    try:
        engine = choose("on", "cpu", lambda: torch.nn.Linear(4, 2))
    finally:
        step_options.use(before.conv, before.compile, before.stacked_eval)
    assert engine.options == step_options.StepOptions("im2col", False, "on") != step_options.current()
    assert step_options.stacks_evaluations(torch.device("cpu"), engine.options)
    assert not step_options.stacks_evaluations(torch.device("cpu"))
    assert isinstance(step_options.conv_mode(engine.options), step_options._Im2col)
    assert not isinstance(step_options.conv_mode(), step_options._Im2col)


def test_a_clients_models_evaluate_stacked_as_each_alone():
    # FedRC's E-step and ensemble: K models on one client's split, as one stacked forward a batch;
    # beside them one model alone and another client's evaluation, answered in the order asked
    host = _host(sizes=(37, 64, 5))
    models = _starts(host, 3)
    a, b = host.client(0), host.client(1)
    asked = [
        (a, Evaluation(models[0], per_sample="loss")),
        (b, Evaluation(models[2])),
        (a, Evaluation(models[1], per_sample="loss")),
        (a, Evaluation(models[2], per_sample="loss")),
        (a, Evaluation(models[0], split="test", per_sample="loss_proba")),
        (b, Evaluation(models[1], split="test", per_sample="loss_proba")),
        (b, Evaluation(models[0], split="test", per_sample="loss_proba")),
        (b, Evaluation(models[0], split="train")),
    ]
    clients, evals = [c for c, _ in asked], [e for _, e in asked]
    alone = [evaluate_requests([c], [e])[0] for c, e in asked]
    stacked_forwards = []
    real = evaluation_module._queue_stacked
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            evaluation_module,
            "_queue_stacked",
            lambda c, es, *r: stacked_forwards.append(len(es)) or real(c, es, *r),
        )
        for stack in (False, True):
            got = evaluate_requests(clients, evals, stack_models=stack)
            for g, w in zip(got, alone, strict=True):
                if isinstance(w, EvalStats):
                    assert (g.samples, g.correct) == (w.samples, w.correct)
                    assert g.loss_sum == pytest.approx(w.loss_sum, rel=1e-6)
                    assert g == w or stack  # each alone's numbers to the bit, unstacked
                else:
                    for gv, wv in zip(
                        g if isinstance(g, tuple) else [g], w if isinstance(w, tuple) else [w], strict=True
                    ):
                        assert gv.shape == wv.shape and gv.dtype == wv.dtype
                        np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=1e-6)
                        assert stack or np.array_equal(gv, wv)
    # client 1's accuracy of two models on its training split, its two test-split models, client 0's
    # three losses (client 0's test-split model alone: by itself)
    assert sorted(stacked_forwards) == [2, 2, 3]


def test_im2col_is_the_convolution():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 11, 9, generator=g)
    w, b = torch.randn(5, 4, 3, 2, generator=g), torch.randn(5, generator=g)
    for kw in ({}, {"stride": 2}, {"padding": (1, 2)}, {"dilation": 2, "stride": (1, 2)}):
        assert torch.allclose(
            step_options.conv2d_im2col(x, w, b, **kw), torch.nn.functional.conv2d(x, w, b, **kw), atol=1e-5
        )
    assert torch.allclose(step_options.conv2d_im2col(x, w), torch.nn.functional.conv2d(x, w), atol=1e-5)


def _off_and_on_agree(tmp_path, over):
    """``over`` run per client and batched: `_compare`'s agreement, and batched for real (the runs'
    summaries count stacked calls, and the SGD losses differ in the last bits)."""
    runs, calls = {}, {}
    for mode in ("off", "on"):
        cfg = small_config(tmp_path / mode, batched_clients=mode, **over)
        calls[mode] = [ev for ev in execute(cfg, make_local_federation)][-1].summary["batched_calls"]
        runs[mode] = round_metrics(cfg.output)
        assert load_runs(cfg.output)["summary"].iloc[0]["batched_calls"] == calls[mode]  # the runs/ table
    m = _compare(runs["off"], runs["on"])
    sgd = m[m.metric == "sgd_loss"]
    assert (sgd.value_off != sgd.value_on).any()
    assert calls["off"] == 0 and calls["on"] > 0


@pytest.mark.parametrize("name", ["fedem", "fedrc"])
def test_a_mixture_rounds_participants_train_in_one_stack_not_one_client_a_call(tmp_path, monkeypatch, name):
    # FedEM and FedRC fold each reply as it arrives (300 clients x 3 models would be gigabytes at
    # once); a worker still takes its clients 64 MB of replies at a time, so where it trains batched their
    # K models train together: here the 4 participants' K models, one stack a round.
    widths = []
    real = batched.train_stacked

    def counted(clients, updates, fixed=None, options=None):
        widths.append(len(updates))
        return real(clients, updates, fixed, options)

    monkeypatch.setattr(batched, "train_stacked", counted)
    cfg = small_config(tmp_path, batched_clients="on", **{**BASE, **ALL[name]})
    list(execute(cfg, make_local_federation))
    k = ALL[name]["hp"]["num_clusters"]
    assert widths == [4 * k] * cfg.rounds  # one client a call was 4 stacks of K a round


@pytest.mark.parametrize("fit", [1, 3])
def test_a_folded_rounds_stacks_are_as_wide_as_the_workers_replies_at_a_time(tmp_path, monkeypatch, fit):
    # A worker takes as many clients a call as its replies at a time hold (on a GPU a share of the
    # device's memory, fedray.federation.host.fold_bytes; faked here as `fit` FedRC replies of K = 3
    # models): its 4 participants' models train in stacks of 3 x fit, the last one narrower.
    cfg = small_config(tmp_path, batched_clients="on", **{**BASE, **ALL["fedrc"], "rounds": 1})
    task = task_for(cfg, build_federated_data(cfg).dataset.spec)
    one = rounds.reply_bytes(get_params(task.build_model()), copies=3)
    monkeypatch.setattr(host_module, "fold_bytes", lambda *_, **__: fit * one)
    widths = []
    real = batched.train_stacked
    monkeypatch.setattr(
        batched,
        "train_stacked",
        lambda c, u, f=None, options=None: widths.append(len(u)) or real(c, u, f, options),
    )
    list(execute(cfg, make_local_federation))
    assert widths == {1: [3, 3, 3, 3], 3: [9, 3]}[fit] * cfg.rounds


@pytest.mark.parametrize("name", ["fedem", "fedrc"])
def test_stacked_evaluation_gives_the_per_client_numbers(tmp_path, monkeypatch, name):
    # a mixture's E-step and ensemble evaluations with each client's K models stacked (a GPU's
    # default, fedray.engine.step_options), here on the CPU
    stacks = []
    real = evaluation_module._queue_stacked
    monkeypatch.setattr(step_options, "_options", step_options.StepOptions(stacked_eval="on"))
    monkeypatch.setattr(
        evaluation_module, "_queue_stacked", lambda c, es, *r: stacks.append(len(es)) or real(c, es, *r)
    )
    _off_and_on_agree(tmp_path, {**BASE, **ALL[name]})
    assert stacks and set(stacks) == {ALL[name]["hp"]["num_clusters"]}


def test_auto_trains_one_client_at_a_time_on_the_cpu_and_on_means_on(tmp_path):
    cfg = small_config(tmp_path, model="mlp")
    host = _host()
    assert not ClientHost(
        dataclasses.replace(host.task, batched_clients="auto"), host._data, host._indices
    ).trains_batched()
    assert ClientHost(
        dataclasses.replace(host.task, batched_clients="on"), host._data, host._indices
    ).trains_batched()
    assert cfg.batched_clients == "auto"
    model = host.task.build_model
    assert choice.choose("auto", "cuda", model).stacked  # a GPU and a model it can do
    assert not choice.choose("off", "cuda", model).stacked
    from fedray.models import build_model

    resnet = lambda: build_model("resnet18", (3, 32, 32), 10)  # noqa: E731
    assert not choice.choose("auto", "cuda", resnet).stacked  # BatchNorm: per client instead


def test_one_place_decides_the_engine_and_says_why():
    # the host, the config's checks, packing and the in-process launcher all ask fedray.engine.choice
    from fedray.models import build_model

    built = []
    mlp = lambda: built.append("mlp") or build_model("mlp", (1, 8, 8), 10)  # noqa: E731
    resnet = lambda: build_model("resnet18", (3, 32, 32), 10)  # noqa: E731
    off, cpu = choice.choose("off", "cuda", mlp), choice.choose("auto", "cpu", mlp)
    assert (off.stacked, off.required, off.why) == (False, False, "batched_clients is off")
    assert (cpu.stacked, cpu.why) == (False, "on the CPU, batched_clients auto trains one client at a time")
    assert not built  # the model is built only where the answer depends on it
    gpu, on = choice.choose("auto", "cuda", mlp), choice.choose("on", "cpu", mlp)
    assert (gpu.stacked, gpu.required, on.stacked, on.required) == (True, False, True, True)
    bn = choice.choose("on", "cuda", resnet)
    assert not bn.stacked and bn.required and "BatchNorm2d" in bn.model_refusal and bn.model_refusal in bn.why
    with pytest.raises(ValueError, match="batched_clients must be one of off, on, auto, got 'yes'"):
        choice.choose("yes", "cpu", mlp)


def test_the_settings_a_stack_shares_are_declared_once_and_key_stacks_and_packs():
    from fedray.config.keys import PACK_KEYS, STACK_KEYS, Config

    task_fields = {f.name for f in dataclasses.fields(Task)}
    config_keys = {f.name for f in dataclasses.fields(Config)}
    # drop_last too: the run's (the config key or the algorithm's hp.drop_last), which the Task carries
    assert set(STACK_KEYS) == {
        "batch_size",
        "momentum",
        "weight_decay",
        "local_epochs",
        "channels_last",
        "drop_last",
    }
    assert set(STACK_KEYS) <= task_fields & config_keys & set(PACK_KEYS)
    task = _host().task
    assert choice.stack_key(task) == (*(getattr(task, k) for k in STACK_KEYS), task.spec.augment)
    for name in STACK_KEYS:  # each one splits a stack
        changed = dataclasses.replace(
            task, **{name: not getattr(task, name) if isinstance(getattr(task, name), bool) else 7}
        )
        assert choice.stack_key(changed) != choice.stack_key(task), name


def test_batched_on_ray_gives_the_per_client_numbers(ray_session, tmp_path):
    from actors.federation import make_ray_federation

    over = dict(algorithm="scaffold", num_clients=8, participation=0.75, rounds=3, momentum=0.9, seed=5)
    off = small_config(tmp_path / "off", batched_clients="off", **over)
    list(execute(off, make_local_federation))
    on = small_config(tmp_path / "on", batched_clients="on", num_actors=2, **over)
    list(execute(on, make_ray_federation))
    _compare(round_metrics(off.output), round_metrics(on.output))


def test_a_model_that_cannot_train_batched_is_refused_before_the_run(tmp_path):
    base = dict(
        dataset="synthetic",
        synthetic_size=200,
        synthetic_shape=[3, 16, 16],
        model="resnet18",
        num_clients=4,
        output=str(tmp_path),
    )
    with pytest.raises(
        ConfigError,
        match=r"config key 'batched_clients': on: model resnet18 cannot train batched: "
        r"layer '.*' is BatchNorm2d",
    ):
        from_dict({**base, "batched_clients": "on"})
    assert from_dict({**base, "batched_clients": "auto"}).batched_clients == "auto"
    with pytest.raises(ConfigError, match="batched_clients"):
        from_dict({**base, "batched_clients": "always"})


def test_yaml_reads_a_bare_on_and_off_as_the_words(tmp_path):
    from fedray.experiment.checks import load_config

    path = tmp_path / "c.yaml"
    for word in ("on", "off"):
        path.write_text(f"dataset: digits\nbatched_clients: {word}\noutput: {tmp_path}\n")
        assert load_config(path).batched_clients == word


def _raises_when_stacked(model, batch, context):
    if not isinstance(model, torch.nn.Module):  # the stacked engine's view
        raise RuntimeError("out of memory")
    return cross_entropy(model, batch, context)


def _trains_with(client, cstate, msg):
    trained = yield LocalUpdate(msg["params"], 0, objective=_raises_when_stacked)
    return {"steps": trained.stats.steps}, cstate


def _on_host(mode: str) -> ClientHost:
    host = _host()
    return ClientHost(dataclasses.replace(host.task, batched_clients=mode), host._data, host._indices)


def test_a_failing_stacked_training_names_its_clients():
    host = _on_host("on")
    msg = {"params": _starts(host, 1)[0]}
    with pytest.raises(
        ClientError, match=r"client 0: batched training of clients \[0, 1, 2\]: RuntimeError: out of memory"
    ):
        host.run_groups(_trains_with, [([0, 1], msg), ([2], msg)])
    assert [r for r, _ in host.run_groups(_trains_with, [([1], msg)])] == [{"steps": 8}]  # alone: per client


def _trains_by_itself(client, cstate, msg):
    """A client function that runs its own optimizer: nothing the stacked engine can stack."""
    model = client.model(msg["params"])
    opt = torch.optim.SGD(model.parameters(), lr=client.task.lr)
    for x, y in client.train_batches(0, 0):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return {"params": get_params(model)}, cstate


def test_a_function_that_trains_by_itself_is_named_under_on_and_runs_per_client_under_auto(capfd):
    msg = {"params": _starts(_host(), 1)[0]}
    with pytest.raises(
        ClientError,
        match=r"client 0: Unstackable: client function (tests\.)?test_batched\._trains_by_itself "
        r"trains a model itself .* batched_clients: on cannot stack",
    ):
        _on_host("on").run_groups(_trains_by_itself, [([0, 1], msg)])
    auto = _on_host("auto")
    auto._engine = choice.Engine(True, False, "batched_clients auto on a GPU")  # as on a GPU
    got = [r for r, _ in auto.run_groups(_trains_by_itself, [([0, 1], msg)])]
    again = [r for r, _ in auto.run_groups(_trains_by_itself, [([0, 1], msg)])]
    alone = [r for r, _ in _on_host("off").run_groups(_trains_by_itself, [([0, 1], msg)])]
    for a, b, c in zip(got, again, alone, strict=True):
        _close(a["params"], c["params"], atol=0)
        _close(b["params"], c["params"], atol=0)
    err = capfd.readouterr().err
    assert err.count("test_batched._trains_by_itself trains a model itself") == 1


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_clients_made_on_demand_train_batched_to_the_per_client_numbers(tmp_path, algorithm):
    """fedprox_synthetic's clients are made when used (a ClientSource): stacked from their own
    samples, they give the per-client numbers (SCAFFOLD: folded in chunks, each chunk a stack)."""
    over = dict(
        dataset="fedprox_synthetic",
        model="mlp",
        num_clients=30,
        participation=0.3,
        rounds=3,
        local_epochs=2,
        batch_size=10,
        lr=0.02,
        momentum=0.9,
        weight_decay=0.0,
        seed=5,
        algorithm=algorithm,
        eval_clients=10,
    )
    _off_and_on_agree(tmp_path, over)
