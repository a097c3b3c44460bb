"""A Ray actor hosting some clients: their data (zero-copy from the object store) and state."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import ray
import torch

from fedray.client import Task
from fedray.data import ArrayDataset, ClientIndices
from fedray.federation import CallMeta, ClientFn, ClientHost, set_torch_threads


def pick_device() -> torch.device:
    """The GPU Ray assigned us (visible as cuda:0 after Ray sets CUDA_VISIBLE_DEVICES), else the CPU."""
    if ray.get_gpu_ids() and torch.cuda.is_available():
        return torch.device("cuda:0")
    return torch.device("cpu")


@ray.remote(max_restarts=0)
class ClientActor:
    """Serves its clients one call at a time (Ray runs an actor's calls in order)."""

    def __init__(
        self, task: Task, train: ArrayDataset, clients: Mapping[int, ClientIndices], num_cpus: float
    ) -> None:
        self.threads = set_torch_threads(num_cpus)
        self.device = pick_device()
        self.host = ClientHost(task, train, clients, self.device)

    def info(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {
            "clients": self.host.client_ids,
            "device": str(self.device),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "resources": ctx.get_assigned_resources(),
            "node_id": ctx.get_node_id(),
            "pid": os.getpid(),
            "torch_threads": torch.get_num_threads(),
        }

    def run(self, fn: ClientFn, cid: int, msg: Any) -> tuple[Any, CallMeta]:
        return self.host.run(fn, cid, msg)

    def run_many(self, fn: ClientFn, cids: Sequence[int], msg: Any) -> list[tuple[Any, CallMeta]]:
        return self.host.run_many(fn, cids, msg)
