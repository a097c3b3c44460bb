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

The folders below are the layers, each importing only those before it (docs/architecture.md walks
them): `config/`, `models/` and `data/`, `storage/`, `engine/`, `federation/`, `algorithms/`,
`experiment/`, `sweeps/`; then this front door (`api.py`, `progress.py`). `params.py` and
`records.py` are the vocabulary every layer speaks (parameter dicts, metric rows).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
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
    "data_settings": "fedray.data",
    "load_dataset": "fedray.data",
    "register_logger": "fedray.storage.loggers",
    "RunInfo": "fedray.storage.loggers",
    "RunLogger": "fedray.storage.loggers",
    "FederatedData": "fedray.data",
    "ClientIndices": "fedray.data",
    "ClientSource": "fedray.data",
    "SourcedClients": "fedray.data",
    "register_partition": "fedray.data.partitions",
    "Partition": "fedray.data.partitions",
    "from_arrays": "fedray.data.arrays",
    "from_torch": "fedray.data.arrays",
    "LocalUpdate": "fedray.engine.update",
    "Evaluation": "fedray.engine.update",
    "Trained": "fedray.engine.update",
    "Step": "fedray.engine.update",
    "Batch": "fedray.engine.update",
    "Frozen": "fedray.engine.update",
    "Config": "fedray.config",
    "DataSection": "fedray.config.sections",
    "RunPlan": "fedray.algorithms.plan",
    "ConfigError": "fedray.config",
    "load_config": "fedray.experiment.checks",
    "from_dict": "fedray.experiment.checks",
    "run": "fedray.api",
    "sweep": "fedray.api",
    "tune": "fedray.api",
    "Tuned": "fedray.api",
    "RunResult": "fedray.api",
    # what an algorithm plug-in writes with (docs/extending.md#what-is-stable)
    "Federation": "fedray.federation",
    "Client": "fedray.engine.client",
    "Task": "fedray.engine.client",
    "Params": "fedray.params",
    "get_params": "fedray.params",
    "set_params": "fedray.params",
    "weighted_average": "fedray.params",
    "Record": "fedray.records",
    "rec": "fedray.records",
    "assignment_rec": "fedray.records",
    "bound": "fedray.config.hparams",
    "one_of": "fedray.config.hparams",
    "local_update": "fedray.algorithms.rounds",
    "fedavg_aggregate": "fedray.algorithms.rounds",
    "train_reply": "fedray.algorithms.rounds",
    "train_records": "fedray.algorithms.rounds",
    "reply_bytes": "fedray.algorithms.rounds",
    "single_model_records": "fedray.algorithms.evaluation",
    "SavedModel": "fedray.storage.export",
    "global_model": "fedray.storage.export",
    "cluster_models": "fedray.storage.export",
}
__all__ = sorted(_API)


# Modules that moved (old name -> where it lives now). An import of an old name gets the module
# itself (the same object, so isinstance and pickling agree) and says so once; a checkpoint that
# names a class by its old module reads back as the class (fedray.storage.checkpoint).
_ALGORITHM_FAMILIES = {
    "baselines": ("fedavg", "fedprox", "scaffold", "fednova", "moon", "fedrs", "fedlc"),
    "clustered": ("clusterfedavg", "ifca", "fesem", "fedsoft"),
    "concat": ("fedconcat", "fedconcat_id"),
    "mixture": ("fedem", "fedrc"),
    "relay": ("fedcat",),
    "sampling": ("clusamp",),
    "splitting": ("cfl", "layercfl"),
}
MOVED_MODULES = {
    # the algorithm families, each one folder under fedray/algorithms/
    **{
        f"fedray.algorithms.{name}": f"fedray.algorithms.{family}.{name}"
        for family, names in _ALGORITHM_FAMILIES.items()
        for name in names
    },
    "fedray.clustering": "fedray.algorithms.clustering",
    "fedray.splitting": "fedray.algorithms.splitting.cfl",
    "fedray.mixture": "fedray.algorithms.mixture",
    "fedray.mixture.client": "fedray.algorithms.mixture.client",
    "fedray.mixture.server": "fedray.algorithms.mixture.fedem",
    # the flat modules of fedray/, each into its layer's folder
    **{
        f"fedray.{name}": f"fedray.{folder}.{name}"
        for folder, names in {
            "config": ("coercion", "hparams", "plugins", "seeding"),
            "storage": ("results", "checkpoint", "export"),
            "engine": ("update", "train", "batched", "drive", "client"),
            "federation": ("host", "catalog", "local", "traffic", "batons", "client_states", "placement"),
            "algorithms": ("evaluation",),
            "sweeps": ("sweep_file", "scheduler", "pack"),
        }.items()
        for name in names
    },
    "fedray.validation": "fedray.experiment.checks",
    "fedray.experiment.validation": "fedray.experiment.checks",
}


class FedrayMovedWarning(FutureWarning):
    """A module imported by a name it had in an earlier fedray: it works, and the name will go."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name as the module that now holds it (`MOVED_MODULES`)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(name, self) if name in MOVED_MODULES else None

    def create_module(self, spec: Any) -> Any:
        new = MOVED_MODULES[spec.name]
        warnings.warn(
            f"{spec.name} is now {new}: the old name still imports it, and will go in a later fedray",
            FedrayMovedWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: Any) -> None:
        """The module was run under its own name already."""


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'fedray' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
