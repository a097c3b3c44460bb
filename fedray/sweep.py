"""Sweeps (DESIGN §5): one YAML file expands into many runs, run several at a time.

A sweep file is an experiment config plus these keys::

    cases: [{...}, ...]               # an axis of cases (the outermost), e.g. the partitions
    grid:                             # axes, expanded as a cartesian product (first axis outer)
      lr: [0.01, 0.05]                # values of the key the axis names (dotted for hp: hp.mu)
      partition:                      # a mapping is a case: several keys set together, one value
        - {partition: labels, partition_k: 2}
        - {partition: dirichlet, partition_beta: 0.1}
      algorithm:
        - fedavg
        - {algorithm: fedprox, grid: {hp.mu: [0.001, 0.01]}}   # a case may carry its own grid
    seeds: [0, 1, 2]                  # the seed axis (innermost)
    max_concurrent_runs: 0            # runs at once (0 = as many as the free resources allow)

On an axis named ``hp`` a mapping is the hp mapping itself (``hp: [{mu: 0.1}, {mu: 1}]``). Two
axes may not set the same key. ``--set`` overrides apply to every run, after the grid; runs it
makes identical are run once.

`load_sweep` validates every run before anything starts and reports all errors at once
(`SweepError`); `plan` says what a submission would do with each run. Running them is
`fedray.scheduler.run_sweep`. No Ray here.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedray.algorithms import ALGORITHMS
from fedray.coercion import suggest
from fedray.config import SWEEP_KEYS, Config, ConfigError, flatten, parse_sets, read_yaml, set_dotted
from fedray.results import run_state
from fedray.validation import from_dict

_LISTED = 8  # runs named under one error before "... and N more"


class SweepError(ConfigError):
    """The sweep file, or some of its runs, are invalid; the message lists every problem."""


@dataclass(frozen=True)
class Choice:
    """One value of an axis: the keys it sets (dotted) and how it reads in a run's label."""

    overrides: dict[str, Any]
    label: str


@dataclass
class SweepRun:
    index: int  # 1-based position in the expanded sweep; progress lines call the run "#index"
    label: str  # the axis values that make this run, e.g. "partition=labels,partition_k=2 seed=0"
    config: Config
    restart: bool = False  # start over instead of going on from the run's latest checkpoint

    @property
    def run_id(self) -> str:
        return self.config.run_id()


@dataclass
class Sweep:
    source: str
    runs: list[SweepRun]
    max_concurrent_runs: int
    collapsed: int = 0  # expanded runs that --set made identical to an earlier one (run once)

    @property
    def output(self) -> str:
        return self.runs[0].config.output


# ------------------------------------------------------------------------------------------------
# Expansion
# ------------------------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _apply(tree: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    for key, value in overrides.items():
        if isinstance(value, Mapping) and not value and key in tree:
            continue  # an empty section (hp: {}) adds nothing to the one there
        set_dotted(tree, key, copy.deepcopy(value), where=key)


def _overlaps(a: str, b: str) -> bool:
    """Dotted keys that set the same value: equal, or one a section holding the other."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _check_overlap(axes: Sequence[tuple[str, list[Choice]]], where: str, errors: list[str]) -> None:
    owner: dict[str, int] = {}
    for pos, (name, choices) in enumerate(axes):
        for key in sorted({k for c in choices for k in c.overrides}):
            if key in owner and owner[key] != pos:
                errors.append(
                    f"{where}: key '{key}' is set by two axes, '{axes[owner[key]][0]}' and '{name}' "
                    "(set each key on one axis, or vary the keys together as cases of one axis)"
                )
            owner.setdefault(key, pos)


def _product(axes: Sequence[tuple[str, list[Choice]]]) -> Iterator[tuple[Choice, ...]]:
    return itertools.product(*[choices for _, choices in axes])


def _case(case: Mapping[str, Any], where: str, errors: list[str]) -> list[Choice]:
    """A mapping on an axis: its keys set together; its own ``grid:`` expands inside it."""
    fixed = flatten({k: v for k, v in case.items() if k != "grid"})
    label = ",".join(f"{k}={_fmt(v)}" for k, v in fixed.items())
    if "grid" not in case:
        return [Choice(fixed, label)]
    sub = _grid(case["grid"], f"{where}.grid", errors)
    _check_overlap([("(the case)", [Choice(fixed, label)]), *sub], where, errors)
    out = []
    for combo in _product(sub):
        overrides = dict(fixed)
        for c in combo:
            overrides.update(c.overrides)
        out.append(Choice(overrides, ",".join(x for x in (label, *(c.label for c in combo)) if x)))
    return out


def _choices(axis: str, values: Any, where: str, errors: list[str], cases_only: bool = False) -> list[Choice]:
    if not isinstance(values, list) or not values:
        errors.append(f"{where}: expected a non-empty list of values, got {values!r}")
        return []
    out: list[Choice] = []
    for i, v in enumerate(values):
        here = f"{where}[{i}]"
        if cases_only and not isinstance(v, Mapping):
            errors.append(f"{here}: a case must be a mapping of keys to values, got {v!r}")
        elif isinstance(v, Mapping) and axis != "hp":
            out += _case(v, here, errors)
        else:
            flat = flatten({axis: v}) if isinstance(v, Mapping) else {axis: v}
            out.append(Choice(flat, ",".join(f"{k}={_fmt(x)}" for k, x in flat.items()) or f"{axis}={{}}"))
    return out


def _grid(grid: Any, where: str, errors: list[str]) -> list[tuple[str, list[Choice]]]:
    if not isinstance(grid, Mapping) or not grid:
        errors.append(f"{where}: expected a mapping of keys to lists of values, got {grid!r}")
        return []
    axes = [
        (str(name), _choices(str(name), values, f"{where}.{name}", errors)) for name, values in grid.items()
    ]
    _check_overlap(axes, where, errors)
    return axes


def _axes(raw: Mapping[str, Any], errors: list[str]) -> list[tuple[str, list[Choice]]]:
    axes = (
        [("cases", _choices("case", raw["cases"], "cases", errors, cases_only=True))]
        if "cases" in raw
        else []
    )
    if "grid" in raw:
        axes += _grid(raw["grid"], "grid", errors)
    if "seeds" in raw:
        seeds = raw["seeds"]
        if (
            not isinstance(seeds, list)
            or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
        ):
            errors.append(f"seeds: expected a non-empty list of integers >= 0, got {seeds!r}")
        else:
            axes.append(("seeds", [Choice({"seed": s}, f"seed={s}") for s in seeds]))
    _check_overlap(axes, "sweep", errors)
    return axes


def _report(source: str, problems: dict[str, list[str]], total: int) -> str:
    bad = len({label for labels in problems.values() for label in labels})
    lines = [f"{source}: {bad} of {total} runs are invalid; nothing was started:"]
    for message, labels in problems.items():
        lines.append(f"  {message}")
        for label in labels[:_LISTED]:
            lines.append(f"    in run [{label}]")
        if len(labels) > _LISTED:
            lines.append(f"    ... and {len(labels) - _LISTED} more runs")
    return "\n".join(lines)


def load_sweep(
    path: str | Path, sets: Iterable[str] = (), output: str | None = None, only: Iterable[str] = ()
) -> Sweep:
    """Expand and validate a sweep file. Raises `SweepError` listing every invalid run.

    ``only`` (``KEY=VALUE`` like ``--set``) keeps the runs whose resolved config has those values.
    Cheap: no data is read and no Ray is started (datasets are only checked to exist).
    """
    from fedray.data import DatasetMissing, check_available

    source = str(path)
    raw = read_yaml(path)
    errors: list[str] = []
    axes = _axes(raw, errors)
    max_concurrent = raw.get("max_concurrent_runs", 0)
    if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 0:
        errors.append(
            f"max_concurrent_runs: expected an integer >= 0 (0 = from resources), got {max_concurrent!r}"
        )
    if errors:
        raise SweepError("\n  ".join([f"{source}: invalid sweep; nothing was started:", *errors]))
    base = {k: v for k, v in raw.items() if k not in SWEEP_KEYS}
    over = flatten(parse_sets(sets))
    if output is not None:
        over["output"] = output
    wanted = flatten(parse_sets(only, flag="--only"))

    problems: dict[str, list[str]] = {}
    valid: list[tuple[str, Config]] = []
    total = 0
    for combo in _product(axes):
        total += 1
        tree = copy.deepcopy(base)
        label = " ".join(c.label for c in combo) or "the file as it is"  # a sweep file with no axes
        replaced = {k: v for k, v in over.items() if any(_overlaps(k, a) for c in combo for a in c.overrides)}
        if replaced:  # the label says what the run uses, not only the axis value --set replaced
            label += " (--set " + ",".join(f"{k}={_fmt(v)}" for k, v in replaced.items()) + ")"
        try:
            for c in combo:
                _apply(tree, c.overrides)
            _apply(tree, over)
            valid.append((label, from_dict(tree)))
        except ConfigError as e:
            if not _left_out(tree, wanted):  # a run --only leaves out is not in the way
                problems.setdefault(str(e), []).append(label)

    runs: list[SweepRun] = []
    seen: set[str] = set()
    for label, cfg in valid:
        if cfg.run_id() not in seen:
            seen.add(cfg.run_id())
            runs.append(SweepRun(len(runs) + 1, label, cfg))
    collapsed = len(valid) - len(runs)
    if wanted:  # before the data and partition checks, which are then done only for the runs wanted
        resolved = {r.index: _resolved(r.config) for r in runs}
        keys = {k for d in resolved.values() for k in d}
        for k in wanted:
            if keys and k not in keys:
                raise SweepError(f"--only {k}: unknown config key{suggest(k, keys)}")
        runs = [r for r in runs if all(resolved[r.index].get(k, object()) == v for k, v in wanted.items())]
        if not runs and not problems:
            raise SweepError(
                f"{source}: no run has {', '.join(f'{k}={_fmt(v)}' for k, v in wanted.items())} (--only)"
            )
    chosen = [(r.label, r.config) for r in runs]
    # Data sets are checked once per distinct source, for every run that reads it.
    by_source: dict[tuple, list[tuple[str, Config]]] = {}
    for label, cfg in chosen:
        key = (cfg.dataset, cfg.resolved_data_root(), cfg.download, cfg.emnist_split)
        by_source.setdefault(key, []).append((label, cfg))
    for group in by_source.values():
        try:
            check_available(group[0][1])
        except DatasetMissing as e:
            problems.setdefault(str(e), []).extend(label for label, _ in group)
    if len({cfg.output for _, cfg in valid}) > 1:
        problems.setdefault("config key 'output': every run of a sweep writes to one folder", []).extend(
            label for label, cfg in valid if cfg.output != valid[0][1].output
        )
    if problems:
        raise SweepError(_report(source, problems, total))
    _check_partitions(chosen, problems)
    if problems:
        raise SweepError(_report(source, problems, total))
    return Sweep(source, runs, max_concurrent, collapsed)


def _left_out(tree: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a run that does not resolve (a bad config) sets a key ``--only`` asks for to another value."""
    flat = flatten(dict(tree))
    return any(k in flat and flat[k] != v for k, v in wanted.items())


_PARTITION_KEYS = ("dataset", "data_root", "emnist_split", "synthetic_size", "synthetic_shape", "num_clients",
                   "partition", "partition_k", "partition_beta", "partition_clusters", "partition_size",
                   "partition_min_size", "partition_file", "seed")  # fmt: skip


def _check_partitions(valid: list[tuple[str, Config]], problems: dict[str, list[str]]) -> None:
    """Every distinct partition of the sweep drawn now (labels read once per dataset), so one that
    cannot be drawn fails before anything starts, not hours into the sweep."""
    from dataclasses import replace

    from fedray.data import (
        DatasetMissing,
        PartitionError,
        check_available,
        check_partition,
        draw_partition,
        train_labels,
    )
    from fedray.data.client_files import ClientFilesError

    labels: dict[tuple, tuple | None] = {}
    drawn: dict[tuple, str | None] = {}
    for label, cfg in valid:
        key = tuple(json.dumps(getattr(cfg, k)) for k in _PARTITION_KEYS)
        if cfg.dataset == "client_files":  # the files are the clients: read and checked once
            if key not in drawn:
                try:
                    check_partition(cfg)
                    drawn[key] = None
                except ClientFilesError as e:
                    drawn[key] = str(e)
            if drawn[key] is not None:
                problems.setdefault(drawn[key], []).append(label)
            continue
        source = key[:5]
        if source not in labels:
            try:  # data that is not here yet (download: true) is drawn when the run has it
                check_available(replace(cfg, download=False))
                labels[source] = train_labels(cfg)
            except DatasetMissing:
                labels[source] = None
        if labels[source] is None:
            continue
        if key not in drawn:
            try:
                draw_partition(cfg, *labels[source])
                drawn[key] = None
            except PartitionError as e:
                drawn[key] = str(e)
        if drawn[key] is not None:
            problems.setdefault(drawn[key], []).append(label)


def _resolved(cfg: Config) -> dict[str, Any]:
    """The run's config, flattened, with every hp value the algorithm uses (defaults included), so
    that ``--only hp.tau=1.0`` also keeps the runs where 1.0 is the default the config leaves out."""
    d = cfg.to_dict()
    d["hp"] = ALGORITHMS[cfg.algorithm].full_hparams(cfg.hp)
    return flatten(d)


# ------------------------------------------------------------------------------------------------
# What to run
# ------------------------------------------------------------------------------------------------


@dataclass
class PlannedRun:
    run: SweepRun
    state: str  # new | finished | failed | interrupted | running (written by a live process now)
    action: str  # run | skip


def plan(sweep: Sweep, force: bool = False) -> list[PlannedRun]:
    """Finished runs are skipped (``force``: run again); failed, interrupted and new ones run.

    A run that a live process is writing now (another sweep) is never touched.
    """
    out = []
    for r in sweep.runs:
        state = run_state(r.config.output, r.run_id)
        skip = state == "running" or (state == "finished" and not force)
        out.append(PlannedRun(r, state, "skip" if skip else "run"))
    return out
