"""Client state round-trips, relays hand off in order, and client errors carry the client id."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedray.data import build_federated_data
from fedray.experiment.local import make_local_federation, task_for
from fedray.federation import ClientError, host
from fedray.federation.local import LocalFederation
from tests.conftest import small_config
from tests.helpers import count_calls, fail_on_three


@pytest.fixture
def fed(tmp_path) -> LocalFederation:
    cfg = small_config(tmp_path)
    return make_local_federation(cfg, build_federated_data(cfg))[0]


def test_client_state_persists_per_client(fed):
    fed.map(count_calls, [0, 1, 2], "a")
    out = fed.map(count_calls, [1, 2, 4], "b")
    assert [out[c]["calls"] for c in (1, 2, 4)] == [2, 2, 1]
    assert out[4] == {"cid": 4, "calls": 1, "msg": "b"}


def folded(acc, cid, reply):
    return [*acc, (cid, reply["calls"], reply["msg"])]


def test_map_fold_folds_each_reply_in_client_order_and_counts_traffic_like_map(fed):
    fed.map(count_calls, [2], "warm")
    fed.take_traffic()
    out = fed.map_fold(count_calls, [4, 0, 2], {"w": np.zeros(50)}, folded, [])
    assert out == [(0, 1, {"w": out[0][2]["w"]}), (2, 2, out[1][2]), (4, 1, out[2][2])]
    by_fold = fed.take_traffic()
    fed.map(count_calls, [4, 0, 2], {"w": np.zeros(50)})
    assert by_fold == fed.take_traffic()  # same bytes down, up and received as map
    with pytest.raises(ClientError, match="client 3"):
        fed.map_fold(fail_on_three, [1, 3], None, lambda acc, c, r: acc, None)


def test_client_error_names_the_client_and_keeps_the_traceback(fed):
    with pytest.raises(ClientError, match=r"client 3: ValueError: bad batch") as info:
        fed.map(fail_on_three, [1, 3, 5], None)
    assert info.value.cid == 3 and "fail_on_three" in info.value.remote_traceback


def test_metadata(fed):
    n = fed.num_examples()
    assert sorted(n) == list(range(6)) and sum(n.values()) == 600
    counts = fed.label_counts([0, 1])
    assert counts[0].sum() == n[0] and counts[0].shape == (10,)
    assert isinstance(counts[1], np.ndarray)


def test_test_shards_are_whole_batches_covering_the_test_set():
    from fedray.federation.host import test_shards

    assert test_shards(1000, 300, 2) == [(0, 600), (600, 1000)]
    assert test_shards(1000, 300, 10) == [(0, 300), (300, 600), (600, 900), (900, 1000)]
    assert test_shards(5, 512, 3) == [(0, 5)]


def test_global_evaluation_is_summed_per_batch_in_order(fed):
    from fedray.algorithms.evaluation import eval_batches, evaluate_global
    from fedray.params import get_params

    params = get_params(fed.task.build_model())
    parts = fed.test_map(eval_batches, {"params": params})
    n_test = 150  # synthetic_size 600 -> a quarter for the test set
    assert [p.samples for p in parts] == [min(512, n_test)]
    g = evaluate_global(fed, params)
    assert g.samples == n_test and 0 <= g.accuracy <= 1


def test_model_slots_are_reused_but_never_aliased(fed):
    from fedray.params import get_params

    client = fed.host.client(0)
    p = get_params(fed.task.build_model())
    a = client.model(p)
    assert client.model(p) is a  # reused: no re-initialisation per call
    b = client.model(p, slot="global")
    assert b is not a  # two models alive at once need two slots
    q = {k: v + 1 for k, v in p.items()}
    client.model(q, slot="global")
    assert all((get_params(a)[k] == p[k]).all() for k in p)  # loading one slot leaves the other alone


def test_map_groups_sends_each_message_to_its_clients_and_counts_each_broadcast(fed):
    from fedray.params import payload_nbytes

    fed.take_traffic()
    out = fed.map_groups(count_calls, [([4, 0], "a"), ([], "unused"), ([2], {"big": np.zeros(100)})])
    assert list(out) == [0, 2, 4]  # sorted by client id
    assert out[0]["msg"] == out[4]["msg"] == "a" and out[2]["msg"]["big"].shape == (100,)
    down, up, _ = fed.take_traffic()
    assert down == 2 * payload_nbytes("a") + payload_nbytes({"big": np.zeros(100)})
    assert up == sum(payload_nbytes(r) for r in out.values())
    with pytest.raises(ValueError, match="client 2 is sent more than one message"):
        fed.map_groups(count_calls, [([1, 2], "a"), ([2], "b")])


def test_bytes_counted_depend_on_content_not_on_which_objects_are_shared():
    from fedray.params import payload_nbytes

    model = {"encoder.fc1.weight": np.zeros((3, 2), np.float32), "head.bias": np.ones(2, np.float32)}
    shared = [model, dict(model)]  # the second model reuses the first one's key strings and arrays
    fresh = [
        model,
        {
            "".join(["encoder.", "fc1.weight"]): np.zeros((3, 2), np.float32),
            "head." + "bias": np.ones(2, np.float32),
        },
    ]
    assert payload_nbytes(shared) == payload_nbytes(fresh)
    assert payload_nbytes(shared) > 2 * (24 + 8)  # both models' arrays counted in full


def add_self(client, cstate, msg):
    """Relay client function: appends its id to the carry; reports the carry's length."""
    carry, common = msg
    out = [*carry, client.cid + common]
    return (out, len(out)), cstate


def test_relay_leaves_carries_behind_and_hands_them_on(fed):
    from fedray.federation import Baton
    from fedray.params import payload_nbytes

    fed.take_traffic()
    first = fed.relay(add_self, [(2, []), (4, [])], 100)
    assert [info for _, info in first] == [1, 1]
    assert all(isinstance(b, Baton) for b, _ in first)
    t = fed.take_traffic()
    size = payload_nbytes
    assert t.down == 2 * size([]) + 2 * size(100)
    assert t.up == size(([102], 1)) + size(([104], 1))
    assert t.received < 2 * size(([102], 1)) + 400  # infos and metas only, not the carries

    # Round two: the carries swap clients (a Latin square of two copies), then come back.
    second = fed.relay(add_self, [(4, first[0][0]), (2, first[1][0])], 0)
    assert fed.fetch([b for b, _ in second]) == [[102, 4], [104, 2]]
    t = fed.take_traffic()
    assert t.down == size([102]) + size([104]) + 2 * size(0)
    with pytest.raises(ValueError, match="already used"):
        fed.fetch([second[0][0]])


def test_a_workers_replies_at_a_time_follow_its_device(monkeypatch):
    # A folded round gives a worker as many clients a call as its replies at a time hold: 64 MB on
    # the CPU whatever the machine; on a GPU a 32nd of the device memory it may use, capped by a
    # 32nd of its share of the machine's memory (a device's figures faked: no CUDA here).
    gib, mb = 1 << 30, 1 << 20
    monkeypatch.setattr(host, "device_memory", lambda device: (60 * gib, 80 * gib))
    monkeypatch.setattr(host, "machine_memory", lambda: 256 * gib)
    monkeypatch.setattr(host.os, "cpu_count", lambda: 16)
    cuda = torch.device("cuda", 0)
    assert host.fold_bytes(torch.device("cpu")) == host.fold_bytes(torch.device("cpu"), 0.25, 4) == 64 * mb
    assert host.fold_bytes(cuda) == 60 * gib // 32  # alone: what is free (1.875 GiB; 8 GiB of memory)
    assert host.fold_bytes(cuda, 0.25, 8) == 80 * gib // 4 // 32  # a quarter of the device: 0.625 GiB
    assert host.fold_bytes(cuda, 0.25, 1) == 256 * gib // 16 // 32  # one core of 16: its memory's 0.5 GiB
    assert host.fold_bytes(cuda, 1.0, None, hosts=4) == 60 * gib // 32 // 4  # a pack of 4 shares it
    monkeypatch.setattr(host, "device_memory", lambda device: (gib, 80 * gib))
    assert host.fold_bytes(cuda) == 64 * mb  # never less than the CPU's
    # what a worker does with it: clients a call, by the size of one reply (or the chunk given)
    assert host.clients_a_call(64 * mb, 26 * mb) == 2
    assert host.clients_a_call(60 * gib // 32, 26 * mb) == 73
    assert host.clients_a_call(64 * mb, 100 * mb) == 1
    assert host.clients_a_call(64 * mb, 0, chunk=5) == 5
    # a host asks once, on first use (no CUDA call when it is made), its Ray share of the GPU
    # and its CPUs given
    cfg = small_config(Path("/tmp/unused"))
    data = build_federated_data(cfg)
    task = task_for(cfg, data.dataset.spec)
    asked = []
    monkeypatch.setattr(host, "device_memory", lambda device: asked.append(device) or (60 * gib, 80 * gib))
    h = host.ClientHost(task, data.dataset.train, data.clients, device="cuda", cpus=8, gpu_share=0.25)
    assert not asked
    assert h.fold_bytes == h.fold_bytes == 80 * gib // 4 // 32 and len(asked) == 1
    assert host.ClientHost(task, data.dataset.train, data.clients, cpus=8).fold_bytes == 64 * mb
