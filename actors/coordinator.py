"""The coordinator actor: owns the round loop, the RayFederation and the results writer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ray

from actors.federation import make_ray_federation
from fedray.config import from_dict
from fedray.experiment import Event, execute
from fedray.federation import set_torch_threads


# num_cpus=0: the coordinator mostly waits on the client actors; reserving a CPU for it would take
# a whole client actor's slot on small machines. It evaluates the global model between rounds,
# while the client actors are idle.
@ray.remote(num_cpus=0, max_restarts=0)
class Coordinator:
    def run(self, config: dict[str, Any]) -> Iterator[Event]:
        cfg = from_dict(config)
        set_torch_threads(cfg.num_cpus_per_actor)  # the same thread count as --local: same numbers
        yield from execute(cfg, make_ray_federation)
