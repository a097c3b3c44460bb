"""The same numbers on Ray as in-process, fractional-GPU placement, relays and errors through actors."""

from __future__ import annotations

import gc
import time
from types import SimpleNamespace

import numpy as np
import pytest

from fedray.data import build_federated_data
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import execute
from fedray.federation import ClientError
from fedray.federation.placement import PlacementError
from tests.conftest import small_config
from tests.helpers import (
    ALGORITHM_HP,
    CONFIG_OVER,
    count_calls,
    fail_from_two,
    fail_on_three,
    round_metrics,
    stamp_big,
)

pytestmark = pytest.mark.ray


def _run(cfg, factory):
    return list(execute(cfg, factory))


@pytest.mark.parametrize(
    "alg",
    [
        {},
        # each client's SGD buffers kept across rounds: state that lives in the client's actor
        {"algorithm": "fedavg", "momentum": 0.9, "hp": {"persistent_optimizer": True, "drop_last": True}},
    ],
    ids=["fedavg", "fedavg-kept-optimizer"],
)
def test_local_and_ray_with_1_and_3_actors_give_identical_metrics(ray_session, tmp_path, alg):
    from actors.federation import make_ray_federation

    over = dict(participation=0.5, client_test_fraction=0.2, rounds=3, seed=7, **alg)
    local = small_config(tmp_path / "local", **over)
    _run(local, make_local_federation)
    ref = round_metrics(local.output)
    assert {"accuracy", "loss", "local_accuracy", "train_accuracy", "bytes_down", "bytes_up"} <= set(
        ref["metric"]
    )
    # kept optimizer state lives in the actors: one actor holding every client, and three; plain
    # FedAvg on three (every algorithm is also compared on three actors below)
    for n in (1, 3) if alg else (3,):
        cfg = small_config(tmp_path / f"ray{n}", num_actors=n, **over)
        events = _run(cfg, make_ray_federation)
        assert events[0].placement["actors"] == n
        got = round_metrics(cfg.output)
        # Bit-identical: exact equality of every value, bytes counted included.
        assert got.equals(ref), f"{n} actors differ from --local:\n{got.compare(ref)}"


def test_fractional_gpus_put_two_actors_on_each_logical_gpu(ray_session, tmp_path):
    from actors.federation import RayFederation

    cfg = small_config(tmp_path, num_gpus_per_actor=0.5, num_cpus_per_actor=1, num_clients=6)
    fed = RayFederation(cfg, build_federated_data(cfg))
    try:
        # 2 logical GPUs / 0.5 = 4 actors (4 CPUs allow 4 too)
        assert len(fed.actors) == 4
        for info in fed.actor_info:
            assert info["resources"] == {"CPU": 1.0, "GPU": 0.5}
            assert len(info["gpu_ids"]) == 1
            assert info["device"] == "cpu"  # logical GPUs, no CUDA: the actor trains on the CPU
            assert info["torch_threads"] == 1
        gpus = [i["gpu_ids"][0] for i in fed.actor_info]
        assert sorted(gpus.count(g) for g in set(gpus)) == [2, 2]
        assert sorted(c for i in fed.actor_info for c in i["clients"]) == list(range(6))
    finally:
        fed.close()


def _assert_calls_follow_budgets(fed, fits: list[int]) -> None:
    """``fed``'s actors given budgets of ``fits`` replies: a folded call over every client sends
    each actor its clients in calls of its own budget, folded in client order as ever."""
    size, calls = 1000, []

    class Spy:  # an actor handle whose calls are noted
        def __init__(self, actor):
            self.run_groups = SimpleNamespace(remote=lambda fn, groups: self.note(actor, fn, groups))

        def note(self, actor, fn, groups):
            calls.append(list(groups[0][0]))
            return actor.run_groups.remote(fn, groups)

    spies = {a: Spy(a) for a in fed.actors}
    owners, budgets = fed._actor_of, fed.fold_bytes
    fed._actor_of = {c: spies[a] for c, a in owners.items()}
    fed.fold_bytes = {spies[a]: fit * size for a, fit in zip(fed.actors, fits, strict=True)}
    try:
        cids = sorted(owners)
        got = fed.map_fold(count_calls, cids, "w", lambda acc, c, r: [*acc, r["cid"]], [], reply_bytes=size)
    finally:
        fed._actor_of, fed.fold_bytes = owners, budgets
    assert got == cids
    want = []
    for a, fit in zip(fed.actors, fits, strict=True):
        mine = [c for c in cids if owners[c] is a]
        assert len(mine) >= 2  # each actor's share splits (or not) by its budget
        want += [mine[i : i + fit] for i in range(0, len(mine), fit)]
    assert sorted(calls) == sorted(want)


def test_ray_relay_state_and_client_errors(ray_session, tmp_path, capfd):
    from actors.federation import RayFederation

    cfg = small_config(tmp_path, num_actors=3)
    fed = RayFederation(cfg, build_federated_data(cfg))
    try:
        # Relay: 1 MB carries go actor to actor for three rounds; the coordinator gets them once.
        fed.take_traffic()
        hops = fed.relay(stamp_big, [(0, np.zeros(125_000)), (1, np.zeros(125_000))], None)
        for cids in ([2, 3], [4, 5]):
            hops = fed.relay(stamp_big, [(c, b) for c, (b, _) in zip(cids, hops, strict=True)], None)
        in_cycle = fed.take_traffic()
        assert in_cycle.down > 6_000_000 and in_cycle.up > 6_000_000  # six hops, 1 MB each way
        assert in_cycle.received < 10_000  # infos and metas only
        a, b = fed.fetch([h for h, _ in hops])
        assert np.flatnonzero(a).tolist() == [0, 2, 4] and np.flatnonzero(b).tolist() == [1, 3, 5]
        assert 2_000_000 < fed.take_traffic().received < 2_010_000
        grouped = fed.map_groups(count_calls, [([5, 0, 3], "x"), ([1], "y")])  # spread over the 3 actors
        assert {c: r["msg"] for c, r in grouped.items()} == {0: "x", 1: "y", 3: "x", 5: "x"}
        fed.map(count_calls, [0, 1], "a")
        assert fed.map(count_calls, [1, 3], "b")[1]["calls"] == 3  # its third call (map_groups above)
        # map_fold: replies from three actors folded in client order, whatever order they finish in.
        order = fed.map_fold(count_calls, [5, 1, 4, 0], "f", lambda acc, c, r: [*acc, (c, r["cid"])], [])
        assert order == [(0, 0), (1, 1), (4, 4), (5, 5)]
        with pytest.raises(ClientError, match="client 3: ValueError: bad batch"):
            fed.map_fold(fail_on_three, [0, 3, 4], None, lambda acc, c, r: acc, None)
        assert fed.map(count_calls, [1], "c")[1]["calls"] == 5  # its third call (map_groups above)
        with pytest.raises(ClientError, match="client 3: ValueError: bad batch") as info:
            fed.map(fail_on_three, [0, 3], None)
        assert "fail_on_three" in info.value.remote_traceback
        # several actors' clients fail at once: the lowest failing client is named, as in-process
        # (which runs clients in order and stops at the first), and every actor's failure is read,
        # so Ray prints no "Unhandled error" for the others (once: client 5, and two such blocks)
        capfd.readouterr()
        for call in (
            lambda: fed.map(fail_from_two, [5, 4, 3, 2, 1, 0], None),
            lambda: fed.map_fold(fail_from_two, [5, 4, 3, 2, 1, 0], None, lambda acc, c, r: acc, None),
        ):
            with pytest.raises(ClientError, match=r"^client 2: ValueError: bad batch of client 2$"):
                call()
        gc.collect()
        time.sleep(1.0)  # Ray reports an error nobody read when its reference goes
        assert "Unhandled error" not in capfd.readouterr().err
        # given a reply's size, each actor takes as many clients a call as its own replies at a time
        # hold (fold_bytes, reported at setup: 64 MB on these CPU actors; on a GPU its share of the
        # device), whatever the others hold: budgets of 1, 2 and 100 replies seen in its calls
        assert fed.fold_bytes == dict.fromkeys(fed.actors, 64 << 20)
        _assert_calls_follow_budgets(fed, [1, 2, 100])
    finally:
        fed.close()
    local, _ = make_local_federation(cfg, build_federated_data(cfg))
    with pytest.raises(ClientError, match=r"^client 2: ValueError: bad batch of client 2$"):
        local.map(fail_from_two, [5, 4, 3, 2, 1, 0], None)


def test_failed_run_is_recorded_with_the_client_error(ray_session, tmp_path):
    from actors.driver import run_on_ray
    from analysis import load_runs

    # lr so large the MLP diverges to non-finite values: a failure that comes from inside the run.
    cfg = small_config(tmp_path, lr=1e30, rounds=2, num_actors=1)
    with pytest.raises(FloatingPointError, match="non-finite"):
        list(run_on_ray(cfg))
    runs = load_runs(cfg.output)
    assert runs["status"].tolist() == ["failed"] and "FloatingPointError" in runs["error"][0]


def test_actors_that_cannot_be_placed_fail_loudly_instead_of_hanging(ray_session, tmp_path):
    from actors.federation import RayFederation

    # 3 actors with a whole GPU each, but the session has 2 logical GPUs.
    cfg = small_config(tmp_path, num_actors=3, num_gpus_per_actor=1, placement_timeout_s=2)
    with pytest.raises(PlacementError, match=r"could not place 3 client actors.*GPU.*placement_timeout_s=2"):
        RayFederation(cfg, build_federated_data(cfg))


def test_actors_beyond_a_ray_that_cannot_grow_fail_at_once_naming_the_keys(ray_session, tmp_path):
    """A Ray fedray started on this machine has no autoscaler: no waiting placement_timeout_s."""

    import ray

    from actors.launch import launch_actors

    cfg = small_config(tmp_path, num_actors=3, num_gpus_per_actor=1, placement_timeout_s=300)
    with pytest.raises(
        PlacementError, match=r"num_actors=3 client actors .*2 GPUs: at most 2 such actors.*cannot grow"
    ):
        launch_actors(cfg.to_dict(), fixed=True)
    # at once, not after the 300 s placement timeout: nothing was asked of Ray
    assert not ray.util.placement_group_table() or all(
        pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values()
    )


def test_a_dead_client_actor_is_an_error_not_a_hang(ray_session, tmp_path):
    import ray

    from actors.federation import RayFederation

    cfg = small_config(tmp_path, num_actors=2)
    fed = RayFederation(cfg, build_federated_data(cfg))
    try:
        ray.kill(fed.actors[0])  # what a lost node or an OOM kill looks like from the coordinator
        with pytest.raises(RuntimeError, match="client actor died"):
            fed.map(count_calls, fed.client_ids, "x")
    finally:
        fed.close()


def test_run_that_fits_no_actor_names_the_keys(ray_session, tmp_path):
    from actors.driver import run_on_ray

    cfg = small_config(tmp_path, num_gpus_per_actor=4)  # the session has 2 logical GPUs
    with pytest.raises(PlacementError, match=r"num_gpus_per_actor=4.*2 GPUs"):
        list(run_on_ray(cfg))
    assert ray_session.is_initialized()  # we attached to the session; it is not ours to stop


def test_the_shared_rays_tests_run_on_one_xdist_worker(request):
    # `--dist loadgroup` keeps this file's tests and every other test of the shared Ray on one
    # worker (tests/conftest.py), so the suite starts one Ray; a pytest/xdist pair under which
    # it silently groups nothing (pyproject.toml's pin) fails here instead of slowing the suite
    if hasattr(request.config, "workerinput"):  # an xdist worker (under -n 0 there is one process)
        assert getattr(request.config.option, "loadgroup", False), "the suite runs with --dist loadgroup"
        assert request.node.nodeid.endswith("@ray"), request.node.nodeid


def test_every_registered_algorithm_is_in_the_identity_test():
    from fedray.algorithms import ALGORITHMS

    assert set(ALGORITHMS) == {"fedavg", *ALGORITHM_HP}


@pytest.fixture(scope="class")
def three_actors(_ray, tmp_path_factory):
    """Three client actors every algorithm's run below uses in turn, as a sweep hands a finished
    run's actors to its next run (each run sets them up afresh: its own clients, data and state)."""
    from actors.launch import launch_actors

    group = launch_actors(small_config(tmp_path_factory.mktemp("actors"), num_actors=3).to_dict())
    group.wait_ready()
    yield group
    group.close()


class TestEveryAlgorithm:
    @pytest.mark.parametrize("algorithm", sorted(ALGORITHM_HP))
    def test_every_algorithm_gives_identical_metrics_in_process_and_on_3_actors(
        self, three_actors, tmp_path, algorithm
    ):
        every_algorithm_on_3_actors(three_actors, tmp_path, algorithm)


def every_algorithm_on_3_actors(group, tmp_path, algorithm):
    from functools import partial

    from actors.federation import make_ray_federation
    from analysis import load_assignments

    over = dict(
        algorithm=algorithm,
        hp=ALGORITHM_HP[algorithm],
        rounds=4,
        participation=0.5,
        client_test_fraction=0.2,
        seed=3,
    )
    over.update(CONFIG_OVER.get(algorithm, {}))
    local = small_config(tmp_path / "local", **over)
    _run(local, make_local_federation)
    ref, ref_assign = (
        round_metrics(local.output),
        load_assignments(local.output)[["round", "client", "cluster"]],
    )
    # 3 actors: clients spread over actors, every message serialized. One actor holding every client
    # (in-process host, Ray's serialization) is tested for FedAvg above and for SCAFFOLD's client state
    # in test_baselines; it is not run again for every algorithm (CI time).
    cfg = small_config(tmp_path / "ray3", num_actors=3, **over)
    _run(cfg, partial(make_ray_federation, group=group))
    got = round_metrics(cfg.output)
    assert got.equals(ref), f"{algorithm}, 3 actors differ from --local:\n{got.compare(ref)}"
    assert load_assignments(cfg.output)[["round", "client", "cluster"]].equals(ref_assign)
