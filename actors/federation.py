"""RayFederation: the Federation protocol over client actors in a placement group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.client_actor import ClientActor
from actors.placement import PlacementError, assign_clients, plan_actor_count
from fedray.client import Task
from fedray.config import Config
from fedray.data import FederatedData
from fedray.federation import ClientError, ClientFn, ClientHost, TrafficMeter, sample_clients


def unwrap(error: BaseException) -> BaseException:
    """The user-facing exception inside Ray's wrappers: a ClientError keeps its client id."""
    seen = 0
    while isinstance(error, ray.exceptions.RayTaskError) and error.cause is not None and seen < 10:
        error, seen = error.cause, seen + 1
    return error


class RayFederation:
    def __init__(self, cfg: Config, data: FederatedData) -> None:
        self.task = Task.from_config(cfg, data.dataset.spec)
        self.test_set = data.dataset.test
        # Metadata (sizes, label counts) comes from a host that never trains; it reads the same arrays.
        self._meta = ClientHost(self.task, data.dataset.train, data.clients)
        self.client_ids = self._meta.client_ids
        self._num_examples = self._meta.num_examples()
        self._num_test = self._meta.num_test_examples()
        self._traffic = TrafficMeter()

        res = ray.cluster_resources()
        n = plan_actor_count(
            len(self.client_ids), cfg.num_actors, cfg.num_cpus_per_actor, cfg.num_gpus_per_actor,
            res.get("CPU", 0.0), res.get("GPU", 0.0),
        )  # fmt: skip
        bundle = {"CPU": cfg.num_cpus_per_actor}
        if cfg.num_gpus_per_actor > 0:
            bundle["GPU"] = cfg.num_gpus_per_actor
        self._pg = placement_group([dict(bundle) for _ in range(n)], strategy="PACK")
        ready, _ = ray.wait([self._pg.ready()], timeout=cfg.placement_timeout_s)
        if not ready:
            remove_placement_group(self._pg)
            raise PlacementError(
                f"could not place {n} client actors with {bundle} each within placement_timeout_s="
                f"{cfg.placement_timeout_s:g}; the cluster has {res.get('CPU', 0):g} CPUs and {res.get('GPU', 0):g} GPUs "
                "(lower num_actors, num_cpus_per_actor or num_gpus_per_actor)"
            )
        train_ref = ray.put(data.dataset.train)  # once; every actor reads it zero-copy
        groups = assign_clients({c: self._num_examples[c] for c in self.client_ids}, n)
        self.actors = []
        self._actor_of: dict[int, Any] = {}
        for i, group in enumerate(groups):
            actor = ClientActor.options(
                num_cpus=cfg.num_cpus_per_actor,
                num_gpus=cfg.num_gpus_per_actor,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=i
                ),
            ).remote(self.task, train_ref, {c: data.clients[c] for c in group}, cfg.num_cpus_per_actor)
            self.actors.append(actor)
            for c in group:
                self._actor_of[c] = actor
        self.actor_info = self._get([a.info.remote() for a in self.actors])

    # --- plumbing ------------------------------------------------------------------------------
    def _get(self, refs: Any) -> Any:
        try:
            return ray.get(refs)
        except ray.exceptions.RayTaskError as e:
            inner = unwrap(e)
            if isinstance(inner, ClientError):
                raise ClientError(inner.cid, inner.message, inner.remote_traceback) from None
            raise
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(f"a client actor died (node lost or out of memory?): {e}") from None

    def placement(self) -> dict[str, Any]:
        return {
            "mode": "ray",
            "actors": len(self.actors),
            "nodes": len({i["node_id"] for i in self.actor_info}),
            "devices": sorted({i["device"] for i in self.actor_info}),
            "torch_threads": self.actor_info[0]["torch_threads"],
            "clients_per_actor": [len(i["clients"]) for i in self.actor_info],
        }

    # --- Federation protocol ---------------------------------------------------------------------
    def map(self, fn: ClientFn, cids: Sequence[int], msg: Any) -> dict[int, Any]:
        msg_ref = ray.put(msg)  # the broadcast goes into the object store once
        by_actor: dict[Any, list[int]] = {}
        for c in sorted(cids):
            by_actor.setdefault(self._actor_of[c], []).append(c)
        refs = [a.run_many.remote(fn, group, msg_ref) for a, group in by_actor.items()]
        results = [r for batch in self._get(refs) for r in batch]
        self._traffic.broadcast(msg, len(results))
        self._traffic.replies([m for _, m in results])
        return {m.cid: r for r, m in sorted(results, key=lambda rm: rm[1].cid)}

    def chain(self, fn: ClientFn, chains: Sequence[Sequence[int]], first_msg: Any) -> list[Any]:
        msg_ref = ray.put(first_msg)
        finals, metas = [], []
        for chain in chains:
            ref = msg_ref
            for c in chain:
                # The reply ref goes straight to the next client's actor; the coordinator never touches it.
                ref, meta = self._actor_of[c].run.options(num_returns=2).remote(fn, c, ref)
                metas.append(meta)
            finals.append(ref)
        out = self._get(finals + metas)
        self._traffic.chains(first_msg, chains, out[len(finals) :])
        return out[: len(finals)]

    def num_examples(self, cids: Sequence[int] | None = None) -> dict[int, int]:
        return {c: self._num_examples[c] for c in (self.client_ids if cids is None else cids)}

    def num_test_examples(self, cids: Sequence[int] | None = None) -> dict[int, int]:
        return {c: self._num_test[c] for c in (self.client_ids if cids is None else cids)}

    def label_counts(self, cids: Sequence[int] | None = None) -> dict[int, np.ndarray]:
        counts = self._meta.label_counts()
        return {c: counts[c] for c in (self.client_ids if cids is None else cids)}

    def sample(self, fraction: float, rng: np.random.Generator) -> list[int]:
        return sample_clients(self.client_ids, fraction, rng)

    def take_traffic(self) -> tuple[int, int]:
        return self._traffic.take()

    def close(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self.actors = []
        remove_placement_group(self._pg)


def make_ray_federation(cfg: Config, data: FederatedData) -> tuple[RayFederation, dict[str, Any]]:
    fed = RayFederation(cfg, data)
    return fed, fed.placement()
