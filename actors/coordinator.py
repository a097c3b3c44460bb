"""The coordinator actor: owns the round loop, the RayFederation and the results writer."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import ray

if TYPE_CHECKING:
    from actors.launch import ActorGroup
    from fedray.experiment.loop import Event


# num_cpus=0: the coordinator mostly waits on the client actors (which also evaluate); reserving a
# CPU for it would take a whole client actor's slot on small machines.
class CoordinatorCode:
    """The coordinator actor's code (`Coordinator` is the actor class; tests call this in-process)."""

    def run(
        self,
        config: dict[str, Any],
        group: ActorGroup,
        restart: bool = False,
        reason: str = "",
        failures_left: int = 0,
        cwd: str | None = None,
    ) -> Iterator[Event]:
        """Run the experiment on ``group``, the client actors the driver started (and will free);
        the arguments after it are `fedray.experiment.loop.execute`'s. ``cwd``: the driver's working
        directory, which the config's relative paths (output, data_root, ...) mean: the coordinator
        runs on the driver's node, but a Ray started elsewhere starts it in another folder."""
        import os

        if cwd:
            os.chdir(cwd)
        # Imported here, not at module level: the actors already import torch while we do.
        from actors.federation import make_ray_federation
        from fedray.config.plugins import activate
        from fedray.experiment.checks import from_dict
        from fedray.experiment.loop import execute
        from fedray.federation.host import set_torch_threads

        activate(  # checked against what the driver read, as the client actors check theirs
            config.get("plugins") or [],
            where=f"the coordinator on node {ray.util.get_node_ip_address()}",
            expect=group.plugins,
        )
        cfg = from_dict(config)
        set_torch_threads(cfg.num_cpus_per_actor)
        yield from execute(cfg, partial(make_ray_federation, group=group), restart, reason, failures_left)


Coordinator = ray.remote(num_cpus=0, max_restarts=0)(CoordinatorCode)


class PackWorkerCode:
    """A pack's worker (`fedray.sweeps.pack`): its runs in this one process, on the GPU share (and CPUs)
    Ray gave it, each run's clients in an in-process federation whose stacked calls meet in the
    pack's `Packer`. Like the coordinator it writes the results, so it runs on the driver's node."""

    def run(
        self,
        configs: list[dict[str, Any]],
        restarts: list[bool],
        cwd: str | None = None,
        reason: str = "",
        plugins: dict[str, str] | None = None,
    ) -> Iterator[tuple[int, Any]]:
        """Yields ``(k, event)`` for run ``k`` of ``configs``: its events, then `fedray.sweeps.pack.Ended`.
        ``reason``: noted with each run's resume (a pack started again after its worker was lost).
        ``plugins`` (spec -> digest): the plug-ins as the driver read them, checked as the client
        actors check theirs (`actors.launch.launch_actors`)."""
        import os

        if cwd:
            os.chdir(cwd)
        from actors.client_actor import assigned_device
        from fedray.config.plugins import activate
        from fedray.experiment.checks import from_dict
        from fedray.experiment.local import make_local_federation
        from fedray.federation.host import set_torch_threads
        from fedray.sweeps.pack import Ended, execute_pack

        activate(
            configs[0].get("plugins") or [],
            where=f"a pack's worker on node {ray.util.get_node_ip_address()}",
            expect=plugins,
        )
        cfgs = [from_dict(c) for c in configs]
        threads = set_torch_threads(cfgs[0].num_cpus_per_actor)
        make = partial(
            make_local_federation,
            device=assigned_device(),
            num_threads=threads,
            cpus=cfgs[0].num_cpus_per_actor,
        )
        for k, ev in execute_pack(cfgs, make, restarts, reason):
            if isinstance(ev, Ended) and ev.error is not None:
                ev = Ended(shippable(ev.error))
            yield k, ev


def shippable(error: BaseException) -> BaseException:
    """``error`` as it can cross to the driver: itself where it pickles and comes back, else a
    RuntimeError with its type, message and traceback (a run's error must not break the stream
    that carries its pack's other runs)."""
    import traceback

    from ray import cloudpickle

    try:
        cloudpickle.loads(cloudpickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any failure to pickle or rebuild it
        text = "".join(traceback.format_exception(error))
        return RuntimeError(f"{type(error).__name__}: {error}\n{text}")


PackWorker = ray.remote(max_restarts=0)(PackWorkerCode)
