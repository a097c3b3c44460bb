"""Actor counts from resources, clients spread over actors, and which sweep runs start when (pure)."""

from __future__ import annotations

import os

import pytest

from fedray.experiment.local import task_for
from fedray.federation.placement import (
    Need,
    PlacementError,
    actor_slots,
    assign_clients,
    auto_gpus_per_actor,
    plan_actor_count,
    plan_launches,
)


def test_plan_actor_count_from_resources():
    assert plan_actor_count(300, 0, 1, 0, cluster_cpus=2, cluster_gpus=0) == 2
    assert plan_actor_count(40, 0, 1, 0.1, cluster_cpus=64, cluster_gpus=4) == 40  # 10 actors per GPU
    assert plan_actor_count(100, 0, 0.5, 0.25, cluster_cpus=4, cluster_gpus=8) == 8  # CPU-bound
    assert plan_actor_count(3, 0, 1, 0, cluster_cpus=16, cluster_gpus=0) == 3  # never more than clients
    assert plan_actor_count(10, 7, 1, 0, cluster_cpus=2, cluster_gpus=0) == 7  # explicit num_actors wins
    with pytest.raises(PlacementError, match="num_gpus_per_actor=0.5.*0 GPUs"):
        plan_actor_count(10, 0, 1, 0.5, cluster_cpus=8, cluster_gpus=0)


def test_auto_gpus_share_each_gpu_between_the_actors_its_nodes_cpus_hold_at_most_four():
    # (CPUs, GPUs) of each live node; the rule's numbers worked out by hand
    assert auto_gpus_per_actor(1, [(64, 0), (2, 0)]) == 0.0  # no GPU: client actors on CPUs
    assert auto_gpus_per_actor(2, [(16, 1)]) == 0.25  # 8 actors' CPUs for one GPU: capped at 4
    assert auto_gpus_per_actor(1, [(4, 2)]) == 0.5  # 4 actors' CPUs over 2 GPUs: 2 a GPU
    assert auto_gpus_per_actor(2, [(16, 8)]) == 1.0  # 8 actors, 8 GPUs: one each
    assert auto_gpus_per_actor(2, [(3, 2)]) == 1.0  # one actor's CPUs for two GPUs: still a whole GPU
    assert auto_gpus_per_actor(4, [(2, 1)]) == 0.0  # no GPU node can hold an actor: as without GPUs
    # a GPU head started with --num-cpus=0 holds no actor: it does not force a GPU an actor elsewhere
    assert auto_gpus_per_actor(1, [(0, 1), (16, 1)]) == 0.25
    # the GPU node with the fewest CPUs a GPU decides; CPU-only nodes do not count
    assert auto_gpus_per_actor(2, [(128, 0), (16, 1), (4, 1)]) == 0.5
    assert auto_gpus_per_actor(1, [(3, 1)]) == pytest.approx(1 / 3)


def test_what_auto_chose_is_said_with_why():
    from fedray.progress import auto_gpus_line

    assert auto_gpus_line(0.0, 1, local=True).endswith(
        "(in this process, --local: client training on the CPU)"
    )
    assert "0 (no GPU in the Ray cluster: client actors train on CPUs)" in auto_gpus_line(0.0, 1)
    assert "0 (no GPU node of the Ray cluster holds a client actor of 4 CPU(s)" in auto_gpus_line(
        0.0, 4, cluster_gpus=1
    )
    assert auto_gpus_line(0.25, 2, cluster_gpus=1) == (
        "num_gpus_per_actor auto: 0.25 (the Ray cluster has GPUs: 4 client actor(s) of 2 CPU(s) a GPU)"
    )


def test_assign_clients_balances_samples():
    sizes = {0: 100, 1: 90, 2: 10, 3: 10, 4: 10, 5: 80}
    groups = assign_clients(sizes, 2)
    loads = [sum(sizes[c] for c in g) for g in groups]
    assert sorted(c for g in groups for c in g) == list(range(6))
    assert sorted(loads) == [130, 170]  # {100, 10, 10, 10} and {90, 80}: the best split there is
    assert assign_clients({0: 5, 1: 5}, 2) == [[0], [1]]


def test_fractional_gpus_are_packed_per_gpu():
    # Ray packs fractions inside one GPU: 0.3 fits 3 per GPU (0.1 stranded), 0.4 fits 2.
    assert actor_slots(1, 0.3, cpus=64, gpus=4) == 12
    assert actor_slots(1, 0.4, cpus=64, gpus=4) == 8
    assert actor_slots(1, 0.25, cpus=64, gpus=4) == 16
    assert actor_slots(1, 2, cpus=64, gpus=5) == 2  # whole GPUs
    assert actor_slots(0.5, 0, cpus=3, gpus=0) == 6
    assert plan_actor_count(100, 0, 1, 0.3, cluster_cpus=64, cluster_gpus=4) == 12


def need(num_actors=0, cpus=1.0, gpus=0.0, clients=10):
    return Need(cpus=cpus, gpus=gpus, num_actors=num_actors, num_clients=clients)


def test_sweep_runs_share_free_slots_evenly_and_use_them_all():
    # 2 CPUs, 4 runs, no limit: two runs at once, one actor each.
    assert plan_launches([need()] * 4, 2, 0, running=0, max_concurrent=0) == [(0, 1), (1, 1)]
    # 16 slots (4 GPUs x 0.25), 12 runs: all start; the first 4 take 2 actors so no slot idles.
    launches = plan_launches([need(gpus=0.25)] * 12, 64, 4, running=0, max_concurrent=0)
    assert [a for _, a in launches] == [2, 2, 2, 2] + [1] * 8
    # 4 runs on 16 slots: 4 actors each.
    assert plan_launches([need(gpus=0.25)] * 4, 64, 4, 0, 0) == [(0, 4), (1, 4), (2, 4), (3, 4)]
    # max_concurrent_runs: 2 at once out of 12 -> 8 actors each; with 1 running, only 1 more starts.
    assert plan_launches([need(gpus=0.25)] * 12, 64, 4, 0, 2) == [(0, 8), (1, 8)]
    assert plan_launches([need(gpus=0.25)] * 12, 64, 2, 1, 2) == [(0, 8)]
    # never more actors than clients; what a small run leaves goes to the next
    assert plan_launches([need(clients=3), need(clients=40)], 16, 0, 0, 0) == [(0, 3), (1, 13)]
    # nothing free: nothing starts
    assert plan_launches([need()] * 3, 0, 0, 2, 0) == []


def test_a_run_with_its_own_actor_count_waits_until_it_fits_and_others_go_first():
    pending = [need(num_actors=4), need(), need(num_actors=2)]
    assert plan_launches(pending, 3, 0, running=1, max_concurrent=0) == [(1, 1), (2, 2)]
    assert plan_launches(pending, 8, 0, running=0, max_concurrent=0) == [(0, 4), (1, 2), (2, 2)]
    assert plan_launches([need(num_actors=50, clients=5)], 8, 0, 0, 0) == [(0, 5)]  # capped at clients


def test_clients_on_a_gpu_get_deterministic_cuda_kernels_unless_the_config_says_not(tmp_path, monkeypatch):
    """cuda_deterministic (default true) reaches the client host through the Task; a host on a CUDA
    device switches torch to deterministic kernels with a fixed cuBLAS workspace; false switches them
    off. Hosts on the CPU leave torch's settings alone."""
    import torch

    from fedray.data import build_federated_data
    from fedray.federation.host import ClientHost
    from tests.conftest import small_config

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic)
    cfg = small_config(tmp_path)
    data = build_federated_data(cfg)
    try:
        assert cfg.cuda_deterministic and "cuda_deterministic" not in cfg.run_id()
        task = task_for(cfg, data.dataset.spec)
        ClientHost(task, data.dataset.train, {}, device="cpu")
        assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic) == before
        ClientHost(task, data.dataset.train, {}, device="cuda")  # no CUDA call is made before a client trains
        assert (
            torch.are_deterministic_algorithms_enabled()
            and torch.is_deterministic_algorithms_warn_only_enabled()
        )
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        # torch's default, as before
        assert torch.backends.cudnn.allow_tf32 and "cuda_tf32" not in cfg.run_id()
        off = task_for(small_config(tmp_path, cuda_deterministic=False), data.dataset.spec)
        ClientHost(off, data.dataset.train, {}, device="cuda")
        assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic
        no_tf32 = small_config(tmp_path, cuda_tf32=False)
        assert "cuda_tf32" in no_tf32.run_id() or no_tf32.run_id() != cfg.run_id()
        ClientHost(task_for(no_tf32, data.dataset.spec), data.dataset.train, {}, device="cuda")
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic = before[1]
        torch.backends.cudnn.allow_tf32 = True
