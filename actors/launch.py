"""Start the client actors in a placement group, before any data exists (light imports only)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.client_actor import ClientActor
from fedray.config.plugins import digest
from fedray.federation.placement import PlacementError, actor_slots, plan_actor_count


@dataclass
class ActorGroup:
    pg: PlacementGroup | None
    bundle: dict[str, float]
    actors: list[Any]
    timeout_s: float
    resources: dict[str, float] = field(default_factory=dict)
    # what makes two runs' actors interchangeable (`actor_shape`): a sweep hands a finished run's
    # actors to its next run of the same shape instead of starting new ones (`ActorPool`)
    shape: tuple = ()
    # spec -> digest of each plug-in as the driver read it: the actors and the coordinator check theirs
    plugins: dict[str, str] = field(default_factory=dict)

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


def actor_shape(config: dict[str, Any], num_actors: int | None = None) -> tuple:
    """How many client actors a run of ``config`` starts, what each reserves and which plug-ins
    (by content) they import: runs of one shape can share actors (each run sets them up afresh)."""
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
    plugins = tuple((s, digest(s)) for s in (config.get("plugins") or []))
    return (n, cpus, gpus, plugins)


class ActorPool:
    """Client actors that finished runs left idle for a later run of the same shape (a sweep's
    runs: starting an actor costs seconds of imports, and a sweep of short runs pays it per run).
    Thread-safe: a sweep runs several runs at once."""

    def __init__(self) -> None:
        self._idle: list[ActorGroup] = []
        self._lock = threading.Lock()
        self._closed = False  # no run will take from it any more: groups given back are killed

    def take(self, shape: tuple) -> ActorGroup | None:
        """An idle group of ``shape``, now the caller's; None if there is none."""
        with self._lock:
            for i, g in enumerate(self._idle):
                if g.shape == shape:
                    return self._idle.pop(i)
        return None

    def give(self, group: ActorGroup) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(group)
                return
        group.close()

    def held(self) -> tuple[float, float]:
        """The CPUs and GPUs the idle groups reserve (free for the sweep's next runs)."""
        with self._lock:
            groups = list(self._idle)
        return (
            sum(len(g.actors) * g.bundle.get("CPU", 0.0) for g in groups),
            sum(len(g.actors) * g.bundle.get("GPU", 0.0) for g in groups),
        )

    def evict(self) -> None:
        """Kill every idle group (a run of another shape needs their resources)."""
        with self._lock:
            groups, self._idle = self._idle, []
        for g in groups:
            g.close()

    def close(self) -> None:
        """No run will come for them: kill the idle groups, and any group given back from now on,
        so the cluster's resources go back to other jobs as soon as the last runs end."""
        with self._lock:
            self._closed = True
        self.evict()


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
    shape = actor_shape(config, num_actors)
    n = shape[0]
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
    return ActorGroup(pg, bundle, actors, config["placement_timeout_s"], dict(res), shape, expect)
