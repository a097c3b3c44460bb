"""Algorithm registry: an explicit dict from config name to `Algorithm` record (docs/architecture.md#adding-an-algorithm)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from fedray.algorithms.baselines import fedavg, fedlc, fednova, fedprox, fedrs, moon, scaffold
from fedray.algorithms.clustered import clusterfedavg, fedsoft, fesem, ifca
from fedray.algorithms.concat import fedconcat, fedconcat_id
from fedray.algorithms.mixture import fedem, fedrc
from fedray.algorithms.relay import fedcat
from fedray.algorithms.sampling import clusamp
from fedray.algorithms.splitting import cfl, layercfl
from fedray.hparams import hparams_from_dict


@dataclass(frozen=True)
class Algorithm:
    name: str
    Hparams: type
    init: Callable[..., Any]  # (fed, hp) -> State
    round: Callable[..., Any]  # (state, fed, hp, rnd) -> (State, records)
    evaluate: Callable[..., Any]  # (state, fed, hp, rnd) -> records
    # (cfg, hp) -> None: checks between hp and the rest of the config (rounds, partition, ...);
    # raises ValueError naming the keys. Optional.
    check_config: Callable[..., None] | None = None
    # (state, hp, rnd) -> bool: evaluate after this round whatever eval_every says (FedCat: after
    # each aggregation). Optional.
    evaluate_after: Callable[..., bool] | None = None
    # (state, hp) -> list[SavedModel]: the trained models, saved when the run finishes (fedray/export.py).
    models: Callable[..., Any] = lambda state, hp: []
    # (cstate) -> Params | None: a client's personal model, where clients keep one (FedSoft). Optional.
    personal_model: Callable[..., Any] | None = None
    # (hp) -> int | None: the rounds the hyperparameters fix (FedConcat: encoder + classifier rounds),
    # used when the config leaves `rounds` unset. Optional.
    rounds_from_hp: Callable[..., int | None] | None = None
    module: str = ""  # the module the record was made from (its docstring documents the algorithm)

    def make_hparams(self, values: Mapping[str, Any]) -> Any:
        return hparams_from_dict(self.Hparams, values, self.name)

    def full_hparams(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Every hyperparameter the run uses, defaults included (a config names only non-defaults)."""
        return dataclasses.asdict(self.make_hparams(values))

    @classmethod
    def from_module(cls, name: str, module: ModuleType) -> Algorithm:
        return cls(
            name,
            module.Hparams,
            module.init,
            module.round,
            module.evaluate,
            getattr(module, "check_config", None),
            getattr(module, "evaluate_after", None),
            module.models,
            getattr(module, "personal_model", None),
            getattr(module, "rounds_from_hp", None),
            module.__name__,
        )


ALGORITHMS: dict[str, Algorithm] = {
    "fedavg": Algorithm.from_module("fedavg", fedavg),
    "fedprox": Algorithm.from_module("fedprox", fedprox),
    "scaffold": Algorithm.from_module("scaffold", scaffold),
    "fednova": Algorithm.from_module("fednova", fednova),
    "moon": Algorithm.from_module("moon", moon),
    "fedrs": Algorithm.from_module("fedrs", fedrs),
    "fedlc": Algorithm.from_module("fedlc", fedlc),
    "clusterfedavg": Algorithm.from_module("clusterfedavg", clusterfedavg),
    "fedconcat": Algorithm.from_module("fedconcat", fedconcat),
    "fedconcat_id": Algorithm.from_module("fedconcat_id", fedconcat_id),
    "fedcat": Algorithm.from_module("fedcat", fedcat),
    "clusamp": Algorithm.from_module("clusamp", clusamp),
    "fedem": Algorithm.from_module("fedem", fedem),
    "fedrc": Algorithm.from_module("fedrc", fedrc),
    "cfl": Algorithm.from_module("cfl", cfl),
    "layercfl": Algorithm.from_module("layercfl", layercfl),
    "ifca": Algorithm.from_module("ifca", ifca),
    "fesem": Algorithm.from_module("fesem", fesem),
    "fedsoft": Algorithm.from_module("fedsoft", fedsoft),
}
