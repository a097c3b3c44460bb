"""Declared hyperparameter bounds (fedray/config/hparams.py): the checker on a hand-made dataclass, every
bound kind and its exact message; and for every registered algorithm, a value outside each
declared bound is refused by the config, naming 'hp.NAME', before anything runs."""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from typing import Any

import pytest

from fedray.algorithms import ALGORITHMS
from fedray.config.coercion import ConfigError
from fedray.config.hparams import Bound, OneOf, bound, check_fields, declared, hparams_from_dict, one_of
from fedray.config.keys import Config
from tests.conftest import small_config


@dataclass
class _Hp:
    a: float = field(default=0.0, metadata=bound(ge=0))
    b: float = field(default=1.0, metadata=bound(gt=0))
    c: float = field(default=1.0, metadata=bound(le=1))
    d: float = field(default=0.0, metadata=bound(lt=1))
    e: float = field(default=0.5, metadata=bound(ge=0, lt=1))
    f: float = field(default=0.5, metadata=bound(gt=0, le=1))
    g: float = field(default=0.5, metadata=bound(ge=0, le=1))
    h: float = field(default=0.5, metadata=bound(gt=0, lt=1))
    k: int | None = field(default=None, metadata=bound(ge=1))  # None (unset) passes
    s: str = field(default="paper", metadata=one_of("paper", "code"))
    doc: int = field(default=2, metadata=bound(ge=1) | {"doc": "merges with other metadata"})
    free: int = -5  # no rule


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("a", -1.0, "must be >= 0, got -1.0"),
        ("b", 0.0, "must be > 0, got 0.0"),
        ("c", 1.5, "must be <= 1, got 1.5"),
        ("d", 1.0, "must be < 1, got 1.0"),
        ("e", 1.0, "must be in [0, 1), got 1.0"),
        ("e", -0.25, "must be in [0, 1), got -0.25"),
        ("f", 0.0, "must be in (0, 1], got 0.0"),
        ("f", 1.5, "must be in (0, 1], got 1.5"),
        ("g", 2, "must be in [0, 1], got 2"),
        ("h", 1.0, "must be in (0, 1), got 1.0"),
        ("k", 0, "must be >= 1, got 0"),
        ("s", "cod", "must be one of paper, code, got 'cod'; did you mean 'code'?"),
        ("s", "x", "must be one of paper, code, got 'x'"),
        ("s", 3, "must be one of paper, code, got 3"),
        ("doc", 0, "must be >= 1, got 0"),
    ],
)
def test_each_bound_kind_refuses_with_one_message(name, value, message):
    hp = dataclasses.replace(_Hp(), **{name: value})
    with pytest.raises(ValueError) as e:
        check_fields(hp)
    assert str(e.value) == f"config key 'hp.{name}': {message}"
    with pytest.raises(ValueError) as e:
        check_fields(hp, prefix="")  # the config's own keys have no prefix
    assert str(e.value) == f"config key '{name}': {message}"


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"a": 0.0, "b": 1e-9, "c": 1.0, "d": 0.999, "e": 0.0, "f": 1.0, "g": 0.0, "h": 0.5},
        {"g": 1.0, "k": 1, "s": "code", "free": -100},
    ],
)
def test_the_ends_a_bound_includes_pass(values):
    check_fields(dataclasses.replace(_Hp(), **values))


def test_declared_rules_and_bad_declarations():
    rules = declared(_Hp)
    assert set(rules) == set("abcdefghks") | {"doc"} and "free" not in rules
    assert rules["e"] == Bound(ge=0, lt=1) and rules["s"] == OneOf(("paper", "code"))
    assert [rules[n].describe() for n in "abcdefghs"] == [
        ">= 0",
        "> 0",
        "<= 1",
        "< 1",
        "in [0, 1)",
        "in (0, 1]",
        "in [0, 1]",
        "in (0, 1)",
        "one of paper, code",
    ]
    assert dataclasses.fields(_Hp)[10].metadata["doc"] == "merges with other metadata"
    for bad in (dict(), dict(ge=0, gt=0), dict(le=1, lt=1)):
        with pytest.raises(TypeError):
            bound(**bad)
    with pytest.raises(TypeError):
        one_of()


@dataclass
class _Tied:
    lo: int = field(default=1, metadata=bound(ge=1))
    hi: int = 2  # >= lo

    def check(self) -> None:  # a check tying two fields: the declaration cannot say it
        if self.hi < self.lo:
            raise ValueError(f"config key 'hp.hi': must be >= hp.lo={self.lo}, got {self.hi}")


def test_hparams_from_dict_checks_types_then_bounds_then_the_dataclass_check():
    assert hparams_from_dict(_Tied, {"lo": 3, "hi": 3.0}, "x") == _Tied(3, 3)
    with pytest.raises(ConfigError, match=r"^config key 'hp.lo': expected an integer, got 'a'$"):
        hparams_from_dict(_Tied, {"lo": "a"}, "x")
    with pytest.raises(ConfigError, match=r"^config key 'hp.lo': must be >= 1, got 0$"):
        hparams_from_dict(_Tied, {"lo": 0, "hi": -1}, "x")  # the bound first, then check()
    with pytest.raises(ConfigError, match=r"^config key 'hp.hi': must be >= hp.lo=3, got 2$"):
        hparams_from_dict(_Tied, {"lo": 3}, "x")
    with pytest.raises(
        ConfigError, match=r"unknown config key 'hp.low' for algorithm x; did you mean 'hp.lo'"
    ):
        hparams_from_dict(_Tied, {"low": 3}, "x")


# --- every registered algorithm -------------------------------------------------------------------


def _outside(rule: Bound | OneOf, typ: Any) -> list[Any]:
    """A value just outside each end of ``rule`` (of the field's type, so that it passes coercion)."""
    if isinstance(rule, OneOf):
        return ["no_such_choice"]
    number = float if float in (typ, *typing.get_args(typ)) else int
    out = []
    if rule.ge is not None:
        out.append(number(rule.ge - 1))
    if rule.gt is not None:
        out.append(number(rule.gt))
    if rule.le is not None:
        out.append(number(rule.le + 1))
    if rule.lt is not None:
        out.append(number(rule.lt))
    return out


def _cases() -> list[Any]:
    cases = []
    for name, alg in ALGORITHMS.items():
        hints = typing.get_type_hints(alg.Hparams)
        for key, rule in declared(alg.Hparams).items():
            for value in _outside(rule, hints[key]):
                cases.append(pytest.param(name, key, value, id=f"{name}-{key}={value}"))
    return cases


CASES = _cases()


def test_the_registry_declares_bounds():
    declaring = {c.values[0] for c in CASES}
    assert len(CASES) >= 40 and len(declaring) >= len(ALGORITHMS) - 1  # FedNova has no hp keys


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_default_is_inside_its_declared_bound(algorithm):
    check_fields(ALGORITHMS[algorithm].Hparams())


@pytest.mark.parametrize("algorithm, key, value", CASES)
def test_a_value_outside_a_declared_bound_is_refused_before_anything_runs(tmp_path, algorithm, key, value):
    with pytest.raises(ConfigError) as e:
        small_config(tmp_path, algorithm=algorithm, hp={key: value})
    assert str(e.value).startswith(f"config key 'hp.{key}': must be "), str(e.value)
    assert str(e.value).endswith(f"got {value!r}") or f"got {value!r};" in str(e.value)
    assert not (tmp_path / "out").exists()


def _just_outside(rule: Bound) -> float:
    if rule.ge is not None:
        return rule.ge - 1
    if rule.gt is not None:
        return rule.gt
    return rule.le + 1 if rule.le is not None else rule.lt


@pytest.mark.parametrize("key", sorted(declared(Config)))
def test_every_config_key_bound_is_declared_and_refused_with_the_one_message(tmp_path, key):
    # The experiment config's keys declare their bounds like hp fields (one checker, one message);
    # validate keeps only the checks that tie keys together or read the data set.
    rule = declared(Config)[key]
    assert rule.holds(getattr(Config(), key))  # the default is inside
    bad = _just_outside(rule)
    note = f" ({rule.note})" if rule.note else ""
    from fedray.data.partitions import PARTITIONS

    readers = [p.name for p in PARTITIONS.values() if key in p.keys]
    choice = {"partition": readers[0]} if readers and "dirichlet" not in readers else {}  # one that reads it
    from fedray.data import DATASETS

    own = [d.name for d in DATASETS.values() if key in d.keys]
    if own and "synthetic" not in own:  # a data set's own key, set with that data set
        choice["dataset"] = own[0]
    with pytest.raises(
        ConfigError,
        match=rf"^config key '{key}': must be {re.escape(rule.describe() + note)}, got ",
    ):
        default = getattr(Config(), key)  # None for a key whose default is "not set" (data_seed)
        small_config(tmp_path, **choice, **{key: bad if default is None else type(default)(bad)})


def test_a_bare_off_read_as_false_by_yaml_is_the_word_where_it_is_a_choice():
    # FedRC's adam: off | paper | code. `--set hp.adam=off` (or `adam: off` in YAML) reached it as
    # False: "expected a string, got False", and FedRC-Adam could not be switched off by name.
    from fedray.experiment.checks import from_dict

    assert (
        from_dict({"algorithm": "fedrc", "hp": {"adam": False}}).run_id()
        == from_dict({"algorithm": "fedrc"}).run_id()
    )
    assert from_dict({"algorithm": "fedrc", "hp": {"adam": "paper"}}).hp == {"adam": "paper"}
    with pytest.raises(ConfigError, match=r"'hp.adam': expected a string, got True"):  # "on" is no choice
        from_dict({"algorithm": "fedrc", "hp": {"adam": True}})
