"""Algorithm registry: an explicit dict from config name to `Algorithm` record (docs/architecture.md#adding-an-algorithm).

The algorithms live in their families' folders; what several share sits beside them (`rounds`:
FedAvg's local SGD and aggregate, `evaluation`: models evaluated on the test set and the clients'
splits, `clustering`: K-means and purity).

May import: `fedray.federation` and every layer below it; an algorithm reaches its clients only
through the `Federation` protocol.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from fedray import MOVED_MODULES
from fedray.algorithms.baselines import fedavg, fedlc, fednova, fedprox, fedrs, minibatch_sgd, moon, scaffold
from fedray.algorithms.clustered import clusterfedavg, fedsoft, fesem, ifca
from fedray.algorithms.concat import fedconcat, fedconcat_id
from fedray.algorithms.mixture import fedem, fedrc
from fedray.algorithms.plan import RunPlan
from fedray.algorithms.relay import fedcat
from fedray.algorithms.sampling import clusamp
from fedray.algorithms.splitting import cfl, layercfl
from fedray.config.hparams import hparams_from_dict
from fedray.storage.blobs import checkpoint_tag


@dataclass(frozen=True)
class Algorithm:
    name: str
    Hparams: type
    init: Callable[..., Any]  # (fed, hp) -> State
    round: Callable[..., Any]  # (state, fed, hp, rnd) -> (State, records)
    evaluate: Callable[..., Any]  # (state, fed, hp, rnd) -> records
    # (cfg, hp) -> None: the checks of check_run below, given the whole config. Deprecated (an
    # algorithm reads the run through `RunPlan`); a plug-in's still runs, and says so once.
    check_config: Callable[..., None] | None = None
    # (state, hp, rnd) -> bool: evaluate after this round whatever eval_every says (FedCat: after
    # each aggregation). Optional.
    evaluate_after: Callable[..., bool] | None = None
    # (state, hp) -> list[SavedModel]: the trained models, saved when the run finishes (fedray/storage/export.py).
    models: Callable[..., Any] = lambda state, hp: []
    # (cstate) -> Params | None: a client's personal model, where clients keep one (FedSoft). Optional.
    personal_model: Callable[..., Any] | None = None
    # (hp) -> int | None: the rounds the hyperparameters fix (FedConcat: encoder + classifier rounds),
    # used when the config leaves `rounds` unset. Optional.
    rounds_from_hp: Callable[..., int | None] | None = None
    module: str = ""  # the module the record was made from (its docstring documents the algorithm)
    # (run, hp) -> None: checks between hp and the rest of the run (`RunPlan`: rounds, clients,
    # partition, model, ...) before anything starts; raises ValueError naming the keys. Optional.
    check_run: Callable[[RunPlan, Any], None] | None = None

    def make_hparams(self, values: Mapping[str, Any]) -> Any:
        return hparams_from_dict(self.Hparams, values, self.name)

    def full_hparams(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Every hyperparameter the run uses, defaults included (a config names only non-defaults)."""
        return dataclasses.asdict(self.make_hparams(values))

    @classmethod
    def from_module(cls, name: str, module: ModuleType) -> Algorithm:
        return cls(
            name=name,
            Hparams=module.Hparams,
            init=module.init,
            round=module.round,
            evaluate=module.evaluate,
            check_config=getattr(module, "check_config", None),
            evaluate_after=getattr(module, "evaluate_after", None),
            models=module.models,
            personal_model=getattr(module, "personal_model", None),
            rounds_from_hp=getattr(module, "rounds_from_hp", None),
            module=module.__name__,
            check_run=getattr(module, "check_run", None),
        )


ALGORITHMS: dict[str, Algorithm] = {}

REQUIRED = ("Hparams", "init", "round", "evaluate", "models")  # what an algorithm's module must define


def _tag_state(name: str, module: ModuleType) -> None:
    """An algorithm module's own ``State`` dataclass is named in checkpoints by the algorithm
    (`fedray.storage.blobs.checkpoint_tag`: ``fedavg.State``), wherever its module moves; the names
    its module had before (`fedray.MOVED_MODULES`) still read."""
    state = getattr(module, "State", None)
    if not (
        isinstance(state, type) and dataclasses.is_dataclass(state) and state.__module__ == module.__name__
    ):
        return  # none, or another algorithm's (named by that one)
    if "_checkpoint_tag" not in state.__dict__:
        before = [f"{old}:State" for old, new in MOVED_MODULES.items() if new == module.__name__]
        checkpoint_tag(f"{name}.State", *before)(state)


def register_algorithm(name: str, algorithm: ModuleType | Algorithm) -> Algorithm:
    """Add an algorithm, which ``algorithm: NAME`` then chooses: a module defining ``Hparams``,
    ``init``, ``round``, ``evaluate`` and ``models`` (and optionally ``check_run``,
    ``evaluate_after``, ``personal_model``, ``rounds_from_hp``: the `Algorithm` record's fields;
    docs/extending.md), or a record. The built-ins are added the same way."""
    if not name.isidentifier():
        raise ValueError(f"algorithm name {name!r}: use letters, digits and underscores")
    if name in ALGORITHMS:
        raise ValueError(f"algorithm {name!r} is registered already (by {ALGORITHMS[name].module})")
    if isinstance(algorithm, ModuleType):
        missing = [a for a in REQUIRED if not hasattr(algorithm, a)]
        if missing:
            raise ValueError(
                f"algorithm {name!r}: module {algorithm.__name__} does not define {', '.join(missing)}"
            )
        _tag_state(name, algorithm)
        algorithm = Algorithm.from_module(name, algorithm)
    elif not isinstance(algorithm, Algorithm):
        raise TypeError(
            f"algorithm {name!r}: a module or an Algorithm record, got {type(algorithm).__name__}"
        )
    if not dataclasses.is_dataclass(algorithm.Hparams):
        raise TypeError(f"algorithm {name!r}: Hparams must be a dataclass (its fields are the hp. keys)")
    ALGORITHMS[name] = algorithm
    return algorithm


for _name, _module in {
    "fedavg": fedavg,
    "fedprox": fedprox,
    "scaffold": scaffold,
    "fednova": fednova,
    "moon": moon,
    "fedrs": fedrs,
    "fedlc": fedlc,
    "minibatch_sgd": minibatch_sgd,
    "clusterfedavg": clusterfedavg,
    "fedconcat": fedconcat,
    "fedconcat_id": fedconcat_id,
    "fedcat": fedcat,
    "clusamp": clusamp,
    "fedem": fedem,
    "fedrc": fedrc,
    "cfl": cfl,
    "layercfl": layercfl,
    "ifca": ifca,
    "fesem": fesem,
    "fedsoft": fedsoft,
}.items():
    register_algorithm(_name, _module)
