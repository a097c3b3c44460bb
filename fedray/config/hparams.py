"""An algorithm's hyperparameters (``hp.*``): bounds declared where a field is defined, one checker
for every field, and building an algorithm's ``Hparams`` dataclass from a config's ``hp`` values.

A field states what values it takes in its own declaration::

    mu: float = field(default=0.001, metadata=bound(ge=0))  # proximal weight
    gamma_max: float = field(default=0.5, metadata=bound(ge=0, lt=1))
    server_update: str = field(default="paper", metadata=one_of("paper", "code"))

and `check_fields` checks every declared field, with one message for every algorithm, naming the
key: ``config key 'hp.mu': must be >= 0, got -1.0``, ``config key 'hp.gamma_max': must be in [0, 1),
got 1.0``, ``config key 'hp.server_update': must be one of paper, code, got 'x'``. An ``Hparams``
writes a ``check()`` method only for what a declaration cannot say (fields tied together, a
list-or-string field); an algorithm's ``check_run`` ties its hyperparameters to the rest of the
run. `hparams_from_dict` runs them in that order: types, declared bounds, ``check()``.

The experiment config's own keys declare their bounds the same way (`fedray.config.Config`).

Config layer: imports nothing from fedray but `fedray.config.coercion`.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedray.config.coercion import ConfigError, all_problems, coerce, suggest

__all__ = [
    "Bound",
    "OneOf",
    "bound",
    "check_fields",
    "declared",
    "field_problems",
    "hparams_from_dict",
    "one_of",
    "settings_from_dict",
]

RULE = "fedray.rule"  # the field-metadata key holding a field's Bound or OneOf


def _num(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class Bound:
    """A numeric interval: at most one lower end (``ge`` or ``gt``) and one upper (``le`` or ``lt``).
    ``None`` passes (an optional field left unset)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    note: str = ""  # what a special value means, said after the bound: ">= 0 (0 = never)"
    words: tuple[str, ...] = ()  # names the field also takes instead of a number ("auto")

    def __post_init__(self) -> None:
        if self.ge is not None and self.gt is not None or self.le is not None and self.lt is not None:
            raise TypeError("bound: give at most one of ge, gt and one of le, lt")
        if all(v is None for v in (self.ge, self.gt, self.le, self.lt)):
            raise TypeError("bound: give ge, gt, le or lt")

    def holds(self, value: Any) -> bool:
        if isinstance(value, str):
            return value in self.words
        return (
            value is None
            or (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )

    def describe(self) -> str:
        """``>= 0``, ``> 0``, ``<= 1``, ``in [0, 1)``, ``>= 0 or auto``: what follows "must be"."""
        return self._interval() + "".join(f" or {w}" for w in self.words)

    def _interval(self) -> str:
        low = ("[", self.ge) if self.ge is not None else ("(", self.gt) if self.gt is not None else None
        high = ("]", self.le) if self.le is not None else (")", self.lt) if self.lt is not None else None
        if low and high:
            return f"in {low[0]}{_num(low[1])}, {_num(high[1])}{high[0]}"
        if low:
            return f"{'>=' if low[0] == '[' else '>'} {_num(low[1])}"
        assert high is not None
        return f"{'<=' if high[0] == ']' else '<'} {_num(high[1])}"

    def problem(self, value: Any) -> str | None:
        note = f" ({self.note})" if self.note else ""
        return None if self.holds(value) else f"must be {self.describe()}{note}, got {value}"


@dataclass(frozen=True)
class OneOf:
    """A value from a fixed list of names."""

    choices: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.choices:
            raise TypeError("one_of: give at least one choice")

    def holds(self, value: Any) -> bool:
        return value in self.choices

    def describe(self) -> str:
        return f"one of {', '.join(self.choices)}"

    def problem(self, value: Any) -> str | None:
        if self.holds(value):
            return None
        close = suggest(value, self.choices) if isinstance(value, str) else ""
        return f"must be {self.describe()}, got {value!r}{close}"


def bound(
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    note: str = "",
    words: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Field metadata: the value lies in the interval (``ge``: >=, ``gt``: >, ``le``: <=, ``lt``: <);
    ``note`` says what a special value means (``bound(ge=0, note="0 = never")``); ``words``: names
    taken instead of a number (``bound(ge=0, words=("auto",))``). A dict, so it
    merges with other metadata: ``bound(ge=0) | {"doc": "..."}``."""
    return {RULE: Bound(ge=ge, gt=gt, le=le, lt=lt, note=note, words=words)}


def one_of(*choices: str) -> dict[str, Any]:
    """Field metadata: the value is one of ``choices`` (pass a registry's keys as ``*REGISTRY``)."""
    return {RULE: OneOf(tuple(choices))}


def declared(cls_or_obj: Any) -> dict[str, Bound | OneOf]:
    """The declared rule of each field that has one, by field name (inherited fields included)."""
    return {f.name: f.metadata[RULE] for f in dataclasses.fields(cls_or_obj) if RULE in f.metadata}


def field_problems(obj: Any, prefix: str = "hp.") -> list[str]:
    """What is wrong with the declared fields of the dataclass instance ``obj``: one message a field
    that fails its rule, naming the key (``prefix`` + the field's name)."""
    out = []
    for name, rule in declared(obj).items():
        problem = rule.problem(getattr(obj, name))
        if problem is not None:
            out.append(f"config key '{prefix}{name}': {problem}")
    return out


def check_fields(obj: Any, prefix: str = "hp.") -> None:
    """Check every declared field of the dataclass instance ``obj``: a ValueError naming each key
    that fails (``prefix`` + the field's name), all of them in one message."""
    problems = field_problems(obj, prefix)
    if problems:
        raise ValueError(all_problems(problems))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A dataclass's resolved annotations (typing.get_type_hints costs milliseconds a call)."""
    return typing.get_type_hints(cls)


def hparams_from_dict(cls: type, values: Mapping[str, Any], algorithm: str) -> Any:
    """Build an algorithm's Hparams dataclass from ``hp.*`` values (`settings_from_dict`)."""
    return settings_from_dict(cls, values, "hp", f"algorithm {algorithm}")


def settings_from_dict(cls: type, values: Mapping[str, Any], section: str, owner: str) -> Any:
    """Build a settings dataclass from the values of config section ``section`` (``hp``: an
    algorithm's hyperparameters; ``data``: a dataset's own settings), with the same checks as
    Config: known keys, types, the declared bounds (`check_fields`), then the dataclass's own
    ``check()``. ``owner`` names whose settings they are in errors (``algorithm fedprox``). A
    dataset's text settings take a number as its text (a split or a column named 2024, unquoted)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = _hints(cls)
    kwargs, problems = {}, []
    for k, v in values.items():
        if k not in fields:
            known = ", ".join(sorted(fields)) or "none"
            problems.append(
                f"unknown config key '{section}.{k}' for {owner}{suggest(k, fields, section + '.')} "
                f"(its {section} keys: {known})"
            )
            continue
        rule = fields[k].metadata.get(RULE)
        try:
            choices = rule.choices if isinstance(rule, OneOf) else ()
            kwargs[k] = coerce(
                f"{section}.{k}", v, hints[k], choices=choices, str_from_number=section == "data"
            )
        except ConfigError as e:
            problems.append(str(e))
    made = cls(**kwargs)  # the values that are of their type, so their bounds are told in the same message
    problems += field_problems(made, prefix=section + ".")
    if problems:
        raise ConfigError.of(problems)
    try:
        check = getattr(made, "check", None)
        if check is not None:
            check()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return made
