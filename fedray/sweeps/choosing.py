"""How fedray chooses, once for every chooser: a search among its trials (`fedray.sweeps.search`)
and `fedray report --tuned` among a cell's settings (`analysis.report`).

- A run's value is read off its curve of one metric at a point (`At`, `read_at`): its final
  evaluation; its best; the evaluation of its best training accuracy (``best-train``: the round a
  method that cannot see the test set would stop at); or the mean of its last K evaluations
  (``mean_last: K``, which smooths a noisy curve).
- Candidates are ranked by one rule (`ranked`): one with no value (every seed diverged, or none
  read) after every other; among the rest, those run with the most seeds (values and diverged runs
  together) first, so a point one lucky seed has reached cannot win over one run in full; then the
  fewest diverged runs; then the best mean (the highest, or the lowest where lower is better);
  then the order they are listed in (a search's draw order, a report's first seen), so a tie is
  decided the same way on every rerun.

Sweeps layer: imports nothing of fedray.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["AT_WORDS", "At", "parse_at", "ranked", "read_at"]

AT_WORDS = ("final", "best", "best-train", "mean_last: K")
BETTER = ("higher", "lower")


@dataclass(frozen=True)
class At:
    """Where a curve is read: ``how`` one of final, best, best-train, mean_last (``last``: its K)."""

    how: str = "final"
    last: int = 1

    @property
    def text(self) -> str:
        """As a line says it: ``final``, ``best``, ``best-train``, ``mean_last 3``."""
        return f"mean_last {self.last}" if self.how == "mean_last" else self.how


def parse_at(value: Any) -> At:
    """``final``, ``best``, ``best-train``, ``{mean_last: K}`` (a file's), ``mean_last:K`` (a command
    line's) as an `At`; anything else a ValueError naming what is taken."""
    if value in ("final", "best", "best-train"):
        return At(value)
    k: Any = None
    if isinstance(value, Mapping) and set(value) == {"mean_last"}:
        k = value["mean_last"]
    elif isinstance(value, str) and value.replace(" ", "").startswith("mean_last:"):
        text = value.replace(" ", "").removeprefix("mean_last:")
        k = int(text) if text.isdigit() else None
    if isinstance(k, int) and not isinstance(k, bool) and k >= 1:
        return At("mean_last", k)
    raise ValueError(f"final, best, best-train or mean_last: K (K >= 1 evaluations), got {value!r}")


def read_at(
    curve: Sequence[tuple[int, float]],
    at: At,
    better: str = "higher",
    train: Sequence[tuple[int, float]] | None = None,
) -> tuple[float, float]:
    """(round, value) of ``curve`` (its evaluations, (round, value) in round order) read at ``at``;
    NaNs where there is nothing to read. best: the first round of the best value (``better``; a
    NaN is none);
    best-train: the round, among those ``curve`` has, of the best of ``train`` (training accuracy,
    the first on a tie); mean_last: the mean of the last K values, at the last round."""
    if better not in BETTER:
        raise ValueError(f"better must be one of {', '.join(BETTER)}, got {better!r}")
    if not curve:
        return math.nan, math.nan
    rounds = [r for r, _ in curve]
    values = [v for _, v in curve]
    if at.how == "final":
        return float(rounds[-1]), float(values[-1])
    if at.how == "mean_last":
        tail = values[-at.last :]
        return float(rounds[-1]), float(sum(tail) / len(tail))
    if at.how == "best":  # a value that is not a number is no best
        valued = [(v, i) for i, v in enumerate(values) if not math.isnan(v)]
        if not valued:
            return math.nan, math.nan
        best = (max if better == "higher" else min)(v for v, _ in valued)
        i = next(i for v, i in valued if v == best)
        return float(rounds[i]), float(values[i])
    if at.how == "best-train":
        there = {r: v for r, v in (train or ()) if not math.isnan(v)}
        found = [(there[r], -i) for i, r in enumerate(rounds) if r in there]
        if not found:
            return math.nan, math.nan
        _, neg = max(found)  # the best training accuracy, the first round on a tie
        return float(rounds[-neg]), float(values[-neg])
    raise ValueError(f"at {at.how!r}: one of {', '.join(AT_WORDS)}")


def ranked(candidates: Sequence[tuple[Sequence[float], int]], better: str = "higher") -> list[int]:
    """The candidates' indices, best first, by the module's rule: each candidate is its values
    (one a seed read; a NaN counts as no seed) and its runs that diverged."""
    if better not in BETTER:
        raise ValueError(f"better must be one of {', '.join(BETTER)}, got {better!r}")
    sign = -1.0 if better == "higher" else 1.0

    def key(i: int) -> tuple:
        values = [x for x in candidates[i][0] if not math.isnan(x)]
        diverged = candidates[i][1]
        if not values:
            return (1, 0, 0, 0.0, i)
        return (0, -(len(values) + diverged), diverged, sign * sum(values) / len(values), i)

    return sorted(range(len(candidates)), key=key)
