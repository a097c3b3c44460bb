"""Typed values from YAML: checking a value against a dataclass field's annotation.

Shared by the experiment config (`fedray.config`) and the algorithms' ``Hparams`` (built by
`fedray.config.hparams.hparams_from_dict`), so neither has to import the other.
"""

from __future__ import annotations

import difflib
import math
import re
import types
import typing
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

INT64 = 2**63
_SCIENTIFIC = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


class ConfigError(ValueError):
    """A config key or value is wrong; the message names the key. ``problems``: each problem's own
    message, where one error tells several (`ConfigError.of`); else the one message."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        message = printable(message)
        super().__init__(message)
        self.problems = [printable(p) for p in problems] or [message]

    @classmethod
    def of(cls, problems: Sequence[str]) -> ConfigError:
        """One error for every problem found at once, each naming its key: a single one as it is,
        several as a list, so a config with three mistakes is mended in one go, not three runs."""
        return cls(all_problems(problems), problems)


MAX_LINE = 1000  # characters of one line of a message: a value in it is cut beyond


def printable(text: str) -> str:
    """``text`` fit for a terminal: characters that are not printable (a NUL, an escape sequence)
    written as Python escapes (tabs and newlines kept), and each line cut at `MAX_LINE`
    characters, saying how many more there were."""
    out = []
    for line in str(text).split("\n"):
        shown = "".join(c if c.isprintable() or c == "\t" else ascii(c)[1:-1] for c in line)
        if len(shown) > MAX_LINE:
            shown = f"{shown[:MAX_LINE]}... ({len(shown) - MAX_LINE:,} more characters)"
        out.append(shown)
    return "\n".join(out)


def count(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless one: "1 round", "30 rounds"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def all_problems(problems: Sequence[str]) -> str:
    """Several problems' messages as one: a count, then one line each (a single one as it is)."""
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems in the config:\n" + "\n".join(f"  - {p}" for p in problems)


def suggest(name: str, candidates: Iterable[str], prefix: str = "") -> str:
    """``; did you mean 'X'?`` for the candidate closest to ``name`` (as typed: ``prefix`` + X); where
    none is close, the candidates that contain ``name`` (``cnn``: ``one of 'fedrc_cnn', 'leaf_cnn',
    'mcmahan_cnn', 'simple_cnn'``; up to four); else ""."""
    candidates = list(candidates)
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{prefix}{close[0]}'?"
    within = sorted(c for c in candidates if len(name) >= 3 and name.lower() in c.lower())
    if len(within) == 1:
        return f"; did you mean '{prefix}{within[0]}'?"
    if 2 <= len(within) <= 4:
        return "; did you mean one of " + ", ".join(f"'{prefix}{c}'" for c in within) + "?"
    return ""


def coerce(
    key: str, value: Any, typ: Any, str_from_number: bool = False, choices: Collection[str] = ()
) -> Any:
    """Check ``value`` against the annotation ``typ``; allow int -> float. Returns the value to store.

    ``str_from_number``: a number where a string is expected is taken as its text (names such as
    ``experiment: 2024``). ``choices``: a string key's allowed values; where "on" or "off" is one
    (a config key declared ``on_off``, `fedray.config.keys.ON_OFF_KEYS`), the boolean YAML 1.1
    reads a bare on / off as is that word.
    """
    origin = typing.get_origin(typ)
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key '{key}': expected true or false, got {value!r}")
    if typ is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            if not -INT64 <= value < INT64:  # seeds and counts go to numpy and torch as int64
                raise ConfigError(f"config key '{key}': {value} is beyond a 64-bit integer")
            return value
        raise ConfigError(f"config key '{key}': expected an integer, got {value!r}")
    if typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value) if abs(value) < 1e308 else math.inf
        elif isinstance(value, str) and _SCIENTIFIC.match(value.strip()):
            number = float(value)  # PyYAML (YAML 1.1) reads 1e-3 as a string; people write it anyway
        else:
            raise ConfigError(f"config key '{key}': expected a number, got {value!r}")
        if not math.isfinite(number):  # .inf and .nan are numbers to YAML, never a setting
            raise ConfigError(f"config key '{key}': expected a finite number, got {value!r}")
        return number
    if typ is str:
        if isinstance(value, bool):  # YAML 1.1 (and --set) reads a bare on / off as a boolean
            word = "on" if value else "off"
            if word in choices:
                return word
        if isinstance(value, str):
            return value
        if str_from_number and isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"config key '{key}': expected a string, got {value!r}")
    if origin is list:
        (inner,) = typing.get_args(typ)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}': expected a list, got {value!r}")
        return [coerce(f"{key}[{i}]", v, inner) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"config key '{key}': expected a mapping of names to values, got {value!r}")
        return dict(value)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(typ):
            if option is type(None) and value is None:
                return None
            try:
                return coerce(key, value, option, str_from_number, choices)
            except ConfigError:
                continue
        raise ConfigError(f"config key '{key}': value {value!r} does not fit {typ}")
    if typ is Any:
        return value
    raise TypeError(f"unsupported config annotation {typ!r} for {key}")  # a bug in Config, not user input
