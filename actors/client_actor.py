"""A Ray actor hosting some clients: their data (zero-copy from the object store) and state.

This module imports only ray at the top, so the coordinator can start client actors before it
pays for importing torch itself: the actors' imports and the coordinator's run in parallel.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import ray

if TYPE_CHECKING:
    from fedray.data import ArrayDataset, ClientIndices
    from fedray.engine.client import Task
    from fedray.federation import ClientFn
    from fedray.federation.host import CallMeta


def assigned_device() -> str:
    """This actor's device: the GPU Ray assigned it is cuda:0 once Ray has set
    CUDA_VISIBLE_DEVICES; else the CPU."""
    import torch

    return "cuda:0" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"


@ray.remote(max_restarts=0)
class ClientActor:
    """Serves its clients one call at a time (Ray runs an actor's calls in order)."""

    def __init__(
        self, num_cpus: float, plugins: Sequence[str] = (), expect: Mapping[str, str] | None = None
    ) -> None:
        import torch

        # The whole library now, while the coordinator starts: the algorithms' client functions
        # arrive pickled by reference, and unpickling the first one would otherwise import it all
        # in the first round (seconds of every run's first round).
        import fedray.algorithms  # noqa: F401
        import fedray.algorithms.evaluation  # noqa: F401
        from fedray.config.plugins import activate
        from fedray.federation.host import set_torch_threads

        # The run's plug-ins before anything of theirs arrives (their models, their client
        # functions): a failure names the plug-in, this node and the import error.
        activate(
            list(plugins),
            where=f"a client actor on node {ray.util.get_node_ip_address()}",
            expect=dict(expect or {}),
        )

        self.num_cpus = num_cpus
        self.threads = set_torch_threads(num_cpus)
        self.device = torch.device(assigned_device())
        self.host = None

    def setup(
        self, task: Task, train: ArrayDataset, test: ArrayDataset, clients: Mapping[int, ClientIndices]
    ) -> dict[str, Any]:
        from fedray.federation.host import ClientHost

        gpus = ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0)
        share = min(1.0, gpus) if self.device.type == "cuda" and gpus > 0 else 1.0
        self.host = ClientHost(
            task, train, clients, self.device, test=test, cpus=self.num_cpus, gpu_share=share
        )
        return self.info()

    def info(self) -> dict[str, Any]:
        import torch

        ctx = ray.get_runtime_context()
        return {
            "clients": self.host.client_ids if self.host else [],  # a range for clients made on demand
            "device": str(self.device),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "resources": ctx.get_assigned_resources(),
            "node_id": ctx.get_node_id(),
            "pid": os.getpid(),
            "torch_threads": torch.get_num_threads(),
            "fold_bytes": self.host.fold_bytes if self.host else 0,  # replies at a time, folded rounds
        }

    def run(self, fn: ClientFn, cid: int, msg: Any) -> tuple[Any, CallMeta]:
        return self.host.run(fn, cid, msg)

    def run_groups(
        self, fn: ClientFn, groups: Sequence[tuple[Sequence[int], Any]]
    ) -> list[tuple[Any, CallMeta]]:
        """Each group's message is an ObjectRef inside the list (Ray resolves only top-level
        arguments): fetched here, zero-copy, once per group."""
        got = ray.get([msg for _, msg in groups])
        return self.host.run_groups(fn, [(cids, msg) for (cids, _), msg in zip(groups, got, strict=True)])

    def relay(self, fn: ClientFn, cids: Sequence[int], common: Any, *carries: Any) -> tuple[Any, ...]:
        """This actor's hops of a relay (``cids[i]`` gets ``carries[i]``; top-level arguments, so Ray
        resolves a carry left on another actor and hands it over directly), trained as one call.
        Returns the carries, then the infos, then the metas: 3 x len(cids) values, which the caller
        asks for as that many returns, so each carry can stay here as its own object."""
        got = self.host.relay(fn, list(zip(cids, carries, strict=True)), common)
        return (*[c for c, _, _ in got], *[i for _, i, _ in got], *[m for _, _, m in got])

    def run_test(self, fn: ClientFn, start: int, stop: int, msg: Any) -> Any:
        return self.host.run_test(fn, start, stop, msg)

    def stateful_ids(self) -> list[int]:
        return self.host.stateful_ids()

    def get_state(self, cid: int, node: str | None = None) -> Any:
        """Client ``cid``'s state; for a caller on this actor's node (``node``), a spilled state as
        its file (`fedray.storage.blobs.StateFile`), which the caller can link."""
        return self.host.checkpoint_state(cid, files=node == ray.get_runtime_context().get_node_id())

    def set_state(self, cid: int, state: Any) -> None:
        self.host.set_state(cid, state)
