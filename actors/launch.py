"""Start the client actors in a placement group, before any data exists (light imports only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.client_actor import ClientActor
from fedray.placement import PlacementError, actor_slots, plan_actor_count
from fedray.plugins import digest


@dataclass
class ActorGroup:
    pg: PlacementGroup | None
    bundle: dict[str, float]
    actors: list[Any]
    timeout_s: float
    resources: dict[str, float] = field(default_factory=dict)

    def wait_ready(self) -> None:
        """Block until every actor is placed, or fail loudly after ``placement_timeout_s``."""
        ready, _ = ray.wait([self.pg.ready()], timeout=self.timeout_s)
        if not ready:
            n, res = len(self.actors), self.resources
            self.close()
            raise PlacementError(
                f"could not place {n} client actors with {self.bundle} each within placement_timeout_s="
                f"{self.timeout_s:g}; the cluster has {res.get('CPU', 0):g} CPUs and {res.get('GPU', 0):g} GPUs "
                "(lower num_actors, num_cpus_per_actor or num_gpus_per_actor)"
            )

    def close(self) -> None:
        """Kill the actors and free their resources; safe to call more than once."""
        if self.pg is None:
            return
        for a in self.actors:
            ray.kill(a)
        self.actors = []
        remove_placement_group(self.pg)
        self.pg = None


def launch_actors(config: dict[str, Any], num_actors: int | None = None, fixed: bool = False) -> ActorGroup:
    """Plan the actor count from the cluster's resources and start that many bare client actors.

    ``num_actors`` (a sweep's share of the cluster) overrides the config's own. Takes the plain
    config dict (already validated by the driver) so it runs before the caller imports torch;
    returns at once, the actors start in the background. ``fixed``: the cluster cannot grow (a Ray
    that fedray started on this machine), so actors beyond its totals are an error now rather than
    after ``placement_timeout_s`` (a cluster with an autoscaler may add the nodes they wait for).
    """
    res = ray.cluster_resources()
    cpus, gpus = config["num_cpus_per_actor"], config["num_gpus_per_actor"]
    n = plan_actor_count(
        config["num_clients"],
        config["num_actors"] if num_actors is None else num_actors,
        cpus,
        gpus,
        res.get("CPU", 0.0),
        res.get("GPU", 0.0),
    )
    bundle = {"CPU": cpus, **({"GPU": gpus} if gpus > 0 else {})}
    if fixed and n > (fits := actor_slots(cpus, gpus, res.get("CPU", 0.0), res.get("GPU", 0.0))):
        raise PlacementError(
            f"num_actors={n} client actors with {bundle} each do not fit the local Ray fedray started on "
            f"this machine ({res.get('CPU', 0):g} CPUs, {res.get('GPU', 0):g} GPUs: at most {fits} such actors), "
            "which cannot grow; lower num_actors (0: as many as fit), num_cpus_per_actor or num_gpus_per_actor, "
            "or attach to a larger cluster (--address)"
        )
    pg = placement_group([dict(bundle) for _ in range(n)], strategy="PACK")
    plugins = list(config.get("plugins") or [])
    # Each actor imports the run's plug-ins when it starts (files and packages reach other nodes
    # with the job's py_modules: `actors.driver.connect`) and checks they are what the driver read.
    expect = {s: digest(s) for s in plugins}
    actors = [
        ClientActor.options(
            num_cpus=cpus,
            num_gpus=gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
        ).remote(cpus, plugins, expect)
        for i in range(n)
    ]
    return ActorGroup(pg, bundle, actors, config["placement_timeout_s"], dict(res))
