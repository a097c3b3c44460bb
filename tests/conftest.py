from __future__ import annotations

import os
import time
from pathlib import Path

# One thread for OpenMP (PyTorch's CPU kernels), OpenBLAS (numpy) and MKL in every process of the suite:
# its two xdist workers, the Ray they start, and the fedray commands they run already take the
# machine's cores, and a library spreading one small product over every core then spins waiting for
# threads that other processes hold (tests/engine/test_batched.py under -n 2 on 2 cores: 92 CPU-seconds
# this way and 72 with one thread each). Set before anything imports torch or numpy, which read
# these once. fedray itself gives each host the torch threads of its CPUs (`num_cpus_per_actor`).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402

from fedray.config.keys import Config  # noqa: E402
from fedray.experiment.checks import from_dict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def small_config(tmp_path: Path, **over) -> Config:
    """A fast, learnable run: synthetic 8x8 data, MLP, a few clients and rounds."""
    base = dict(
        dataset="synthetic",
        synthetic_size=600,
        model="mlp",
        num_clients=6,
        partition="dirichlet",
        partition_beta=0.5,
        rounds=3,
        local_epochs=1,
        batch_size=32,
        lr=0.05,
        output=str(tmp_path / "out"),
        partition_min_size=10,
    )
    base.update(over)
    if base["dataset"] != "synthetic" and "synthetic_size" not in over:
        del base["synthetic_size"]  # a key only the synthetic dataset reads
    return from_dict(base)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (the suite's default: two workers, `--dist loadgroup`), every test of the
    shared Ray session runs on one worker, so the suite still starts one Ray; the rest share out.

    First among the hooks: xdist's own (in each worker) reads the ``xdist_group`` marks into the
    test ids the scheduler groups by, so marks added after it would group nothing (each worker
    then started a Ray session of its own)."""
    for item in items:
        if "_ray" in getattr(item, "fixturenames", ()) or item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture(scope="session")
def _ray():
    """One local Ray for the whole suite: 4 logical CPUs and 2 logical GPUs (placement tests)."""
    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        # address="local": always a private Ray, even where a developer's `ray start` cluster (or
        # RAY_ADDRESS) would otherwise be joined, and asking it for logical CPUs/GPUs would fail.
        from actors.driver import job_runtime_env

        ray.init(
            address="local",
            num_cpus=4,
            num_gpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env=job_runtime_env(),  # the workers at normal priority, as fedray's own connect
        )
    yield ray
    ray.shutdown()


@pytest.fixture
def ray_session(_ray):
    """The shared Ray, idle: Ray frees the actors and placement groups of the previous test
    asynchronously, and tests that plan against free resources (sweeps) must not see them."""
    deadline = time.monotonic() + 60
    while True:
        total, free = _ray.cluster_resources(), _ray.available_resources()
        held = {
            k: total[k] - free.get(k, 0.0)
            for k in ("CPU", "GPU")
            if total.get(k, 0.0) - free.get(k, 0.0) > 1e-9
        }
        if not held:
            return _ray
        if time.monotonic() > deadline:
            pytest.fail(f"the shared Ray is still busy 60 s after the previous test (held: {held}): a leak")
        time.sleep(0.2)
