"""fedray: federated learning under heterogeneous data, simulated on Ray actors.

The library (this package) never imports ray: every algorithm runs unchanged on the in-process
`LocalFederation` and on the actor-based `actors.RayFederation`.

From Python (docs/extending.md):

    import fedray
    result = fedray.run("jobs/configs/digits.yaml", rounds=5, local=True)   # or a dict, a Config
    result.final_accuracy, result.metrics                                  # float, pandas DataFrame

``fedray.run`` and ``fedray.sweep`` (`fedray/api.py`) are the command line's own path; like every
name here they are imported on first use, so ``import fedray`` stays light. `fedray/api.py` is the
package's front door, the one module that reaches the Ray layer (`actors/`, inside its functions)
and the results readers (`analysis/`); the library below it never imports Ray. The
registration functions (``register_algorithm``, ``register_model``, ``register_dataset``,
``register_partition``) are how plug-ins and the built-ins alike add what a config can name.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> the module that defines it, imported on first use (torch and the registries are heavy)
_API = {
    "register_algorithm": "fedray.algorithms",
    "Algorithm": "fedray.algorithms",
    "ALGORITHMS": "fedray.algorithms",
    "register_model": "fedray.models",
    "EncoderHead": "fedray.models",
    "MODELS": "fedray.models",
    "register_dataset": "fedray.data",
    "DatasetKind": "fedray.data",
    "Dataset": "fedray.data",
    "ArrayDataset": "fedray.data",
    "DataSpec": "fedray.data",
    "DatasetInfo": "fedray.data",
    "FederatedData": "fedray.data",
    "ClientIndices": "fedray.data",
    "ClientSource": "fedray.data",
    "SourcedClients": "fedray.data",
    "register_partition": "fedray.data.partitions",
    "Partition": "fedray.data.partitions",
    "from_arrays": "fedray.data.arrays",
    "from_torch": "fedray.data.arrays",
    "LocalUpdate": "fedray.update",
    "Evaluation": "fedray.update",
    "Trained": "fedray.update",
    "Step": "fedray.update",
    "Batch": "fedray.update",
    "Frozen": "fedray.update",
    "Config": "fedray.config",
    "ConfigError": "fedray.config",
    "load_config": "fedray.validation",
    "from_dict": "fedray.validation",
    "run": "fedray.api",
    "sweep": "fedray.api",
    "RunResult": "fedray.api",
}
__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'fedray' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
