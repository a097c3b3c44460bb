from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedray.config import Config, from_dict

ROOT = Path(__file__).resolve().parents[1]


def small_config(tmp_path: Path, **over) -> Config:
    """A fast, learnable run: synthetic 8x8 data, MLP, a few clients and rounds."""
    base = dict(
        dataset="synthetic", synthetic_size=600, model="mlp", num_clients=6, partition="dirichlet", partition_beta=0.5,
        rounds=3, local_epochs=1, batch_size=32, lr=0.05, output=str(tmp_path / "out"), partition_min_size=10,
    )  # fmt: skip
    base.update(over)
    return from_dict(base)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole suite: 4 logical CPUs and 2 logical GPUs (placement tests)."""
    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        # address="local": always a private Ray, even where a developer's `ray start` cluster (or
        # RAY_ADDRESS) would otherwise be joined, and asking it for logical CPUs/GPUs would fail.
        ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
