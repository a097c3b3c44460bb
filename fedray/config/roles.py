"""What a config key is, declared once on the key (its field metadata in `fedray.config.Config`).

Each key of `Config` is declared with `key`: its default, the section of the YAML that holds it (a
config file may be written in sections, `SECTIONS`), its bound (`fedray.config.hparams.bound`) and
its roles, a `Role`. Every list of keys the rest of fedray reads (the keys left out of the run id,
those a pack's runs share, those a search may not vary, those a run is labelled by, ...) is derived
from the roles (`fedray.config.keys.keys_where`), so a new key is one declaration::

    lr: float = key("training", 0.05, rule=bound(gt=0))  # in the run id, tunable, a setting
    num_actors: int = key("resources", 0, in_run_id=False, setting=False)  # changes no number
    pack_runs: str = key("resources", "off", as_before="off", setting=False, on_off=True)

Config layer: a leaf, it imports nothing from fedray.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["NEW", "ROLE", "Role", "SECTIONS", "key", "roles_of"]

ROLE = "fedray.role"  # the field-metadata key holding a config key's Role

# The sections a config file may be written in, each with what it holds. A flat file (every key at
# the top) loads the same config; a key is in exactly one section.
SECTIONS: dict[str, str] = {
    "run": "what runs: the experiment's name, the algorithm and its hyperparameters (hp), plug-ins, seeds",
    "source": "the dataset the samples come from, and its own settings (data)",
    "clients": "how the samples are shared out: the clients, the partition, their test and validation splits",
    "training": "the model and the local training: rounds, epochs, batches, the optimiser",
    "evaluation": "what is evaluated, on what, how often",
    "resources": "where and how the clients compute: CPUs and GPUs, kernels, batched and packed training",
    "results": "where results go and the live loggers",
    "recovery": "checkpoints and what a run survives",
}


class _New:
    """`Role.as_before` of a key that existed when the first results were written."""

    def __repr__(self) -> str:
        return "NEW"


NEW: Any = _New()


@dataclass(frozen=True)
class Role:
    """What one config key is to the rest of fedray. Every flag reads as a question about the key.

    - ``section``: the section of `SECTIONS` that holds it.
    - ``in_run_id``: whether it is in the run id (False: it cannot change a number, as where results
      go or how many actors serve the clients).
    - ``as_before``: for a key added after results existed, the value that means "as before": at it,
      the key stays out of the run id, so every earlier run keeps its id (`NEW`: an original key).
    - ``setting``: whether runs that differ in it are other settings (False: replicates of one
      setting, as the seed, or the same work done elsewhere, as the GPU share). Never for a key
      not in the run id.
    - ``pack``: the runs of one pack (fedray/sweeps/pack.py) must share it.
    - ``stack``: the updates of one stack must share it (a `fedray.engine.client.Task` attribute of
      its name); implies ``pack``.
    - ``tunable``: a search may vary it (False: it makes the validation data, the budget or the
      record).
    - ``label``: it names a run in the results' columns, the report's and the loggers' labels.
    - ``text``: a name or a path, taken as typed (``experiment: 2024`` is the name "2024").
    - ``registry``: its values are names in a registry a plug-in adds to.
    - ``dataset_own``: a flat key only some datasets read (`DatasetKind.keys`).
    - ``by_content``: it names a file by its path, and the run id hashes the file's content.
    - ``on_off``: a string key whose values include on and off (which YAML 1.1 reads as booleans).
    - ``trial_differs``: a search's trials set it otherwise than the test runs of the settings they
      tune (where they are filed, what they evaluate on), so it does not tell settings apart when a
      report pairs them.
    """

    section: str
    in_run_id: bool = True
    as_before: Any = NEW
    setting: bool = True
    pack: bool = False
    stack: bool = False
    tunable: bool = True
    label: bool = False
    text: bool = False
    registry: bool = False
    dataset_own: bool = False
    by_content: bool = False
    on_off: bool = False
    trial_differs: bool = False

    @property
    def added_later(self) -> bool:
        return self.as_before is not NEW

    def problems(self, name: str) -> list[str]:
        """What contradicts itself in this declaration of key ``name`` (a bug in `Config`)."""
        out = []
        if self.section not in SECTIONS:
            out.append(f"section {self.section!r} is not one of {', '.join(SECTIONS)}")
        if not self.in_run_id and (self.setting or self.added_later or self.by_content):
            out.append("a key not in the run id is no setting, was never added to it, hashes no file")
        if self.stack and not self.pack:
            out.append("a key a stack shares is one a pack shares")
        return [f"config key {name!r}: {p}" for p in out]


def key(
    section: str,
    default: Any = dataclasses.MISSING,
    *,
    factory: Callable[[], Any] | Any = dataclasses.MISSING,
    rule: Mapping[str, Any] | None = None,
    **roles: Any,
) -> Any:
    """A config key's field: its section, its default (``factory`` for a list or a mapping), its
    declared bound (``rule``: `fedray.config.hparams.bound`) and its roles (`Role`'s flags)."""
    metadata = {**(rule or {}), ROLE: Role(section, **roles)}
    return dataclasses.field(default=default, default_factory=factory, metadata=metadata)


def roles_of(cls: type) -> dict[str, Role]:
    """Each field's `Role`, by name, in declaration order; a field declared without one, or one
    that contradicts itself, is a `TypeError` (a bug in the class, found at import)."""
    out: dict[str, Role] = {}
    problems = []
    for f in dataclasses.fields(cls):
        role = f.metadata.get(ROLE)
        if role is None:
            problems.append(f"config key {f.name!r} is declared without its roles (fedray.config.roles.key)")
            continue
        problems += role.problems(f.name)
        out[f.name] = role
    if problems:
        raise TypeError("; ".join(problems))
    return out
