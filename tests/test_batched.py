"""Batched client training (fedray/batched.py): the per-client path's numbers, for every client
function it covers, in-process and on Ray; which models and devices use it; its errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from fedray import batched
from fedray.algorithms.rounds import local_update
from fedray.client import Task
from fedray.coercion import ConfigError
from fedray.data import ArrayDataset, ClientIndices, DataSpec
from fedray.experiment import execute
from fedray.federation import ClientError
from fedray.host import ClientHost
from fedray.local import make_local_federation
from fedray.params import get_params
from fedray.train import load_optimizer_state, local_train, optimizer_state, sgd
from fedray.validation import from_dict
from tests.conftest import small_config
from tests.helpers import ALGORITHM_HP, CONFIG_OVER, round_metrics


def _host(augment: str = "none", sizes=(37, 64, 5, 0, 90), momentum=0.9, wd=1e-3) -> ClientHost:
    """Clients of unequal sizes (one with no data, one a single partial batch) on 3x6x6 images."""
    g = np.random.default_rng(0)
    n = sum(sizes)
    data = ArrayDataset(g.random((n, 3, 6, 6)).astype(np.float32), g.integers(0, 4, n))
    spec = DataSpec((3, 6, 6), 4, 1.0, mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.4), augment=augment)
    cfg = small_config(Path("/tmp/unused"), model="mlp", batch_size=16, local_epochs=2, lr=0.05, momentum=momentum,
                       weight_decay=wd, channels_last=False)  # fmt: skip
    task = Task.from_config(cfg, spec)
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


# the resident feeder shrinking the stack as clients finish (CPU), the same with a fixed stack
# (CUDA's, whose steps replay as one graph), and the streamed feeder (augmented data)
@pytest.mark.parametrize("augment,fixed", [("none", False), ("none", True), ("crop_flip", False)])
@pytest.mark.parametrize("case", ["plain", "prox", "correction", "buffers", "weights"])
def test_each_client_trains_as_local_train_trains_it_alone(augment, fixed, case):
    host = _host(augment)
    cids = host.client_ids
    starts = _starts(host, len(cids))
    rnd, mu = 3, 0.3
    g = np.random.default_rng(1)
    corrections = [{k: g.normal(0, 0.01, v.shape).astype(np.float32) for k, v in s.items()} for s in starts]
    buffers = []
    for c, s in zip(cids, starts, strict=True):  # real SGD buffers: one step's worth on the client's data
        m = host.client(c).model(s)
        opt = sgd(m.parameters(), host.client(c))
        m(torch.zeros(1, 3, 6, 6)).sum().backward()
        opt.step()
        buffers.append(optimizer_state(opt, m))
    weights = [g.random(host.client(c).num_examples) for c in cids]

    got = batched.train_stacked(
        [host.client(c) for c in cids], starts, rnd,
        prox_mu=mu if case == "prox" else 0.0,
        corrections=corrections if case == "correction" else None,
        buffers=buffers if case == "buffers" else None, keep=case == "buffers",
        weights=weights if case == "weights" else None, drop_last=case == "weights", fixed=fixed,
    )  # fmt: skip
    for i, c in enumerate(cids):
        client = host.client(c)
        model = client.model(starts[i])
        anchor = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = sgd(model.parameters(), client)
        if case == "buffers":
            load_optimizer_state(opt, model, buffers[i])
        kw = {}
        if case == "prox":
            from fedray.train import proximal

            kw["objective"] = proximal(mu, anchor)
        if case == "correction":
            entries = model.state_dict()

            def correct(m, i=i, entries=entries, client=client):
                with torch.no_grad():
                    for k, v in corrections[i].items():
                        entries[k].sub_(torch.from_numpy(v) * client.task.lr)

            kw["after_step"] = correct
        if case == "weights":
            kw.update(weights=weights[i], drop_last=True)
        stats = local_train(model, client, rnd, optimizer=opt, **kw)
        _close(get_params(model), got[i].params)
        assert (got[i].stats.steps, got[i].stats.samples, got[i].stats.correct) == (
            stats.steps,
            stats.samples,
            stats.correct,
        )
        assert got[i].stats.loss_sum == pytest.approx(stats.loss_sum, rel=1e-5, abs=1e-6)
        if case == "buffers":
            _close(optimizer_state(opt, model), got[i].buffers)
        else:
            assert got[i].buffers is None
    assert got[3].stats.steps == 0 and got[3].params.keys() == starts[3].keys()  # the client without data
    _close(got[3].params, starts[3], atol=0)


def test_a_client_that_keeps_its_optimizer_without_momentum_keeps_no_buffers():
    host = _host(momentum=0.0)
    got = batched.train_stacked([host.client(c) for c in (0, 1)], _starts(host, 2), 0, keep=True)
    assert [t.buffers for t in got] == [{}, {}]  # as optimizer_state of an SGD without momentum


# Every algorithm whose client function has a batched version (local_update: FedAvg, FedNova,
# CluSamp, cluster-wise FedAvg, FedConcat's encoder stage; FedAvg's kept optimizer; FedProx;
# SCAFFOLD; IFCA; FedRS; FedLC; FedEM's and FedRC's K models of a client), on a CNN, momentum and weight decay on, clients of unequal sizes.
COVERED = {
    "fedavg": {},
    "fedavg-kept": {"algorithm": "fedavg", "hp": {"persistent_optimizer": True, "drop_last": True}},
    **{a: {"algorithm": a, "hp": ALGORITHM_HP[a], **CONFIG_OVER.get(a, {})}
       for a in ("fedprox", "scaffold", "fednova", "clusamp", "clusterfedavg", "fedconcat", "ifca", "fedrs", "fedlc",
                 "fedem", "fedrc")},
    **{a: {"algorithm": a, "hp": {**ALGORITHM_HP[a], "persistent_optimizer": True}, **CONFIG_OVER.get(a, {})}
       for a in ("cfl", "layercfl")},
    "fedem-kept": {"algorithm": "fedem", "hp": {**ALGORITHM_HP["fedem"], "persistent_optimizer": True, "drop_last": True}},
}  # fmt: skip


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


@pytest.mark.parametrize("name", list(COVERED))
def test_batched_runs_give_the_per_client_numbers(tmp_path, name):
    over = {**dict(dataset="digits", model="mcmahan_cnn", num_clients=8, participation=0.5, rounds=3, local_epochs=2,
                   lr=0.02, momentum=0.9, weight_decay=1e-4, seed=3, algorithm="fedavg"), **COVERED[name]}  # fmt: skip
    _off_and_on_agree(tmp_path, over)


def _off_and_on_agree(tmp_path, over):
    """``over`` run per client and batched: `_compare`'s agreement, and batched for real (the SGD
    losses differ in the last bits; the same bits would mean it never ran)."""
    runs = {}
    for mode in ("off", "on"):
        cfg = small_config(tmp_path / mode, batched_clients=mode, **over)
        list(execute(cfg, make_local_federation))
        runs[mode] = round_metrics(cfg.output)
    m = _compare(runs["off"], runs["on"])
    sgd = m[m.metric == "sgd_loss"]
    assert (sgd.value_off != sgd.value_on).any()


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
    model = host.task.build_model()
    assert batched.enabled("auto", torch.device("cuda"), model)  # a GPU and a model it can do
    assert not batched.enabled("off", torch.device("cuda"), model)
    from fedray.models import build_model

    resnet = build_model("resnet18", (3, 32, 32), 10)
    assert not batched.enabled("auto", torch.device("cuda"), resnet)  # BatchNorm: per client instead


def test_batched_on_ray_gives_the_per_client_numbers(ray_session, tmp_path):
    from actors.federation import make_ray_federation

    over = dict(algorithm="scaffold", num_clients=8, participation=0.75, rounds=3, momentum=0.9, seed=5)
    off = small_config(tmp_path / "off", batched_clients="off", **over)
    list(execute(off, make_local_federation))
    on = small_config(tmp_path / "on", batched_clients="on", num_actors=2, **over)
    list(execute(on, make_ray_federation))
    _compare(round_metrics(off.output), round_metrics(on.output))


def test_a_model_that_cannot_train_batched_is_refused_before_the_run(tmp_path):
    base = dict(dataset="synthetic", synthetic_size=200, synthetic_shape=[3, 16, 16], model="resnet18",
                num_clients=4, output=str(tmp_path))  # fmt: skip
    with pytest.raises(ConfigError, match=r"config key 'batched_clients': on: model resnet18 cannot train batched: "
                                          r"layer '.*' is BatchNorm2d"):  # fmt: skip
        from_dict({**base, "batched_clients": "on"})
    assert from_dict({**base, "batched_clients": "auto"}).batched_clients == "auto"
    with pytest.raises(ConfigError, match="batched_clients"):
        from_dict({**base, "batched_clients": "always"})


def test_yaml_reads_a_bare_on_and_off_as_the_words(tmp_path):
    from fedray.validation import load_config

    path = tmp_path / "c.yaml"
    for word in ("on", "off"):
        path.write_text(f"dataset: digits\nbatched_clients: {word}\noutput: {tmp_path}\n")
        assert load_config(path).batched_clients == word


def _fails(client, cstate, msg):
    return {"n": client.num_examples}, cstate


def test_a_failing_batched_function_names_its_clients():
    def broken(clients, states, msgs):
        raise RuntimeError("out of memory")

    batched.register_batched(_fails)(broken)
    try:
        host = _host()
        host = ClientHost(dataclasses.replace(host.task, batched_clients="on"), host._data, host._indices)
        with pytest.raises(
            ClientError,
            match=r"client 0: batched training of clients \[0, 1, 2\]: RuntimeError: out of memory",
        ):
            host.run_groups(_fails, [([0, 1], {}), ([2], {})])
        assert [r for r, _ in host.run_groups(_fails, [([1], {})])] == [{"n": 64}]  # one client: no batch
    finally:
        batched._BATCHED.pop(_fails)


def test_every_covered_client_function_is_named_in_the_docs():
    from pathlib import Path

    import fedray.algorithms  # noqa: F401 - registers the built-in batched versions

    page = (Path(__file__).resolve().parents[1] / "docs" / "batched.md").read_text()
    assert batched.covered()
    for name in batched.covered():
        assert f"`{name}`" in page, name
    assert local_update in batched._BATCHED


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_clients_made_on_demand_train_batched_to_the_per_client_numbers(tmp_path, algorithm):
    """fedprox_synthetic's clients are made when used (a ClientSource): stacked from their own
    samples, they give the per-client numbers (SCAFFOLD: folded in chunks, each chunk a stack)."""
    over = dict(dataset="fedprox_synthetic", model="mlp", num_clients=30, participation=0.3, rounds=3, local_epochs=2,
                batch_size=10, lr=0.02, momentum=0.9, weight_decay=0.0, seed=5, algorithm=algorithm, eval_clients=10)  # fmt: skip
    _off_and_on_agree(tmp_path, over)
