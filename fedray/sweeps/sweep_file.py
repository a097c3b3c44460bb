"""Sweeps (docs/sweeps-and-reports.md#sweeps): one YAML file expands into many runs, run several at a time.

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

A key only some partitions (datasets) read, such as partition_k, counts only for the runs whose
partition reads it: for the others it is left out (at its default), so it neither fails them nor
splits their run ids. Each place that sets it must reach a run that reads it, or the sweep is
invalid: the file's top level and ``--set`` (every run), an axis over it (the runs of its values),
a case (the runs of that case; ``{partition: dirichlet, partition_k: 3}`` is an error).

`load_sweep` validates every run before anything starts and reports all errors at once
(`SweepError`); `plan` says what a submission would do with each run. Running them is
`fedray.sweeps.scheduler.run_sweep`. No Ray here.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fedray.algorithms import ALGORITHMS
from fedray.config.coercion import count, suggest
from fedray.config.keys import (
    SWEEP_KEYS,
    Config,
    ConfigError,
    flat_key,
    flatten,
    parse_sets,
    plain_key,
    read_yaml,
    set_dotted,
    typed_sets,
    unsection,
)
from fedray.experiment.checks import Unread, at_default, check_last_batches, from_dict, unread_keys
from fedray.storage.results import run_state

_LISTED = 8  # runs named under one error before "... and N more"
MAX_RUNS = 10_000  # runs one sweep file may expand to (counted before it is expanded)


class SweepError(ConfigError):
    """The sweep file, or some of its runs, are invalid; the message lists every problem."""


@dataclass(frozen=True)
class Choice:
    """One value of an axis: the keys it sets (dotted) and how it reads in a run's label."""

    overrides: dict[str, Any]
    label: str
    # key -> where in the file it is set ("grid.partition_k", "cases[1]"): an axis over a key, or a
    # case, that reaches no run whose partition (dataset) reads the key names itself so.
    sources: dict[str, str] = field(default_factory=dict)


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
    # expanded runs identical to an earlier one (run once): --set made them so, or they differ only
    # in a key their partition (dataset) does not read
    collapsed: int = 0

    @property
    def output(self) -> str:
        return self.runs[0].config.output

    @property
    def gpus_auto(self) -> bool:
        """Some run has ``num_gpus_per_actor: auto``: `with_gpus` before `plan`, where the runs go."""
        return any(r.config.gpus_auto for r in self.runs)

    def with_gpus(self, share: Callable[[float], float]) -> tuple[Sweep, dict[float, float]]:
        """The sweep with ``num_gpus_per_actor: auto`` resolved in every run, ``share`` giving the
        fraction for a CPU count per actor (`fedray.federation.placement.auto_gpus_per_actor` on the cluster the
        sweep attached to), and what it chose by CPU count. Runs it makes identical to an earlier one
        (auto resolved to a fraction another run sets by hand) are run once."""
        chosen: dict[float, float] = {}
        runs: list[SweepRun] = []
        seen: set[str] = set()
        for r in self.runs:
            cfg = r.config
            if cfg.gpus_auto:
                if cfg.num_cpus_per_actor not in chosen:
                    chosen[cfg.num_cpus_per_actor] = share(cfg.num_cpus_per_actor)
                cfg = cfg.with_gpus(chosen[cfg.num_cpus_per_actor])
            if cfg.run_id() not in seen:
                seen.add(cfg.run_id())
                runs.append(replace(r, config=cfg))
        merged = self.collapsed + len(self.runs) - len(runs)
        return replace(self, runs=runs, collapsed=merged), chosen


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
                clash = (
                    f"key '{key}' is set by two axes, '{axes[owner[key]][0]}' and '{name}' "
                    "(set each key on one axis, or vary the keys together as cases of one axis)"
                )
                if not any(e.endswith(f": {clash}") for e in errors):  # the sweep's axes hold the grid's
                    errors.append(f"{where}: {clash}")
            owner.setdefault(key, pos)


def _size(axes: Sequence[tuple[str, list[Choice]]]) -> int:
    """How many combinations ``axes`` make, without making them."""
    return math.prod(len(choices) for _, choices in axes)


def _product(axes: Sequence[tuple[str, list[Choice]]]) -> Iterator[tuple[Choice, ...]]:
    return itertools.product(*[choices for _, choices in axes])


def _case(case: Mapping[str, Any], where: str, errors: list[str]) -> list[Choice]:
    """A mapping on an axis: its keys set together; its own ``grid:`` expands inside it."""
    fixed = _flat_keys(flatten({k: v for k, v in case.items() if k != "grid"}), where, errors)
    label = ",".join(f"{k}={_fmt(v)}" for k, v in fixed.items())
    sources = dict.fromkeys(fixed, where)
    if "grid" not in case:
        return [Choice(fixed, label, sources)]
    sub = _grid(case["grid"], f"{where}.grid", errors)
    _check_overlap([("(the case)", [Choice(fixed, label)]), *sub], where, errors)
    if (n := _size(sub)) > MAX_RUNS:
        errors.append(f"{where}.grid: expands to {n:,} runs; a sweep file makes at most {MAX_RUNS:,}")
        return []
    out = []
    for combo in _product(sub):
        overrides, within = dict(fixed), dict(sources)
        for c in combo:
            overrides.update(c.overrides)
            within.update(c.sources)
        out.append(Choice(overrides, ",".join(x for x in (label, *(c.label for c in combo)) if x), within))
    return out


def _flat_keys(values: Mapping[str, Any], where: str, errors: list[str] | None = None) -> dict[str, Any]:
    """Dotted keys as the config names them: an axis, a case or a --set may name a key with its
    section (``training.lr``), as a sectioned file writes it (`fedray.config.keys.flat_key`). A key
    in a section that does not hold it, or one key given twice (``lr`` and ``training.lr``), is an
    error added to ``errors`` (raised where there is none to add to)."""
    out: dict[str, Any] = {}
    for written, value in values.items():
        try:
            name = flat_key(written)
            if name in out:
                raise ConfigError(f"key '{name}' is given twice (as '{written}' too)")
        except ConfigError as e:
            if errors is None:
                raise ConfigError(f"{where}: {e}") from None
            errors.append(f"{where}: {e}")
            continue
        out[name] = value
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
        elif isinstance(v, Mapping) and plain_key(axis) not in ("hp", "data"):
            out += _case(v, here, errors)
        else:
            flat = _flat_keys(flatten({axis: v}) if isinstance(v, Mapping) else {axis: v}, here, errors)
            label = ",".join(f"{k}={_fmt(x)}" for k, x in flat.items()) or f"{axis}={{}}"
            out.append(Choice(flat, label, dict.fromkeys(flat, where)))
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
            axes.append(("seeds", [Choice({"seed": s}, f"seed={s}", {"seed": "seeds"}) for s in seeds]))
    _check_overlap(axes, "sweep", errors)
    return axes


def _report(source: str, problems: dict[str, list[str]], total: int, only: bool = False) -> str:
    """The invalid runs' errors; with ``only`` (--only given) the count is of the runs it picks,
    which the file's total is not."""
    bad = len({label for labels in problems.values() for label in labels})
    among = " (of those --only picks)" if only else ""
    verb = "is" if bad == 1 else "are"
    lines = [f"{source}: {bad} of {count(total, 'run')} {verb} invalid{among}; nothing was started:"]
    for message, labels in problems.items():
        lines.append(f"  {message}")
        if total > 1 and len(set(labels)) == total:
            lines.append(f"    in all {total} runs")
            continue
        for label in labels[:_LISTED]:
            lines.append(f"    in run [{label}]")
        if len(labels) > _LISTED:
            lines.append(f"    ... and {len(labels) - _LISTED} more runs")
    return "\n".join(lines)


def load_sweep(
    path: str | Path,
    sets: Iterable[str] = (),
    output: str | None = None,
    only: Iterable[str] = (),
    plugins: Iterable[str] = (),
    raw: Mapping[str, Any] | None = None,
) -> Sweep:
    """Expand and validate a sweep file. Raises `SweepError` listing every invalid run.

    ``only`` (``KEY=VALUE`` like ``--set``) keeps the runs whose resolved config has those values.
    The file's ``plugins`` are relative to its folder; ``plugins`` (``--plugin``) are added to every
    run, relative to the working directory. Cheap: no data is read and no Ray is started (datasets
    are only checked to exist). ``raw``: the file's keys, read already (the rest of a file whose
    ``tune:`` block was taken out); ``path`` then names it in messages and places its plug-ins.
    """
    parts = _read_sweep(path, sets, output, only, plugins, raw)
    valid, problems, total = _expand(parts)
    runs: list[SweepRun] = []
    seen: set[str] = set()
    for label, cfg in valid:  # runs identical to an earlier one are run once
        if cfg.run_id() not in seen:
            seen.add(cfg.run_id())
            runs.append(SweepRun(len(runs) + 1, label, cfg))
    collapsed = len(valid) - len(runs)
    if parts.wanted:  # before the data and partition checks, which are then done only for the runs wanted
        runs = _only(runs, parts.wanted, parts.source, bool(problems))
    chosen = [(r.label, r.config) for r in runs]
    _check_data_sources(chosen, problems)
    if len({cfg.output for _, cfg in valid}) > 1:
        problems.setdefault("config key 'output': every run of a sweep writes to one folder", []).extend(
            label for label, cfg in valid if cfg.output != valid[0][1].output
        )
    if problems:
        raise SweepError(_report(parts.source, problems, total, bool(parts.wanted)))
    _check_partitions(chosen, problems)
    if problems:
        raise SweepError(_report(parts.source, problems, total, bool(parts.wanted)))
    return Sweep(parts.source, runs, parts.max_concurrent, collapsed)


@dataclass
class _SweepParts:
    """A sweep file read: its axes and the keys every run starts from, and what the command line
    adds (``over``: --set, --plugin, --output) or keeps (``wanted``: --only)."""

    source: str
    axes: list[tuple[str, list[Choice]]]  # (the axis, its choices), outermost first
    max_concurrent: int
    base: dict[str, Any]  # the file's keys but the sweep's own
    from_set: dict[str, str]  # what --set says (dotted keys), as typed: for the errors that name it
    top: dict[str, Any]  # the file's top-level keys (dotted), likewise
    over: dict[str, Any]
    wanted: dict[str, Any]


def _read_sweep(
    path: str | Path,
    sets: Iterable[str],
    output: str | None,
    only: Iterable[str],
    plugins: Iterable[str],
    raw: Mapping[str, Any] | None = None,
) -> _SweepParts:
    from fedray.experiment.checks import resolve_plugins

    source = str(path)
    raw = dict(read_yaml(path) if raw is None else raw)
    if "tune" in raw:
        raise SweepError(
            f"{source}: key 'tune' belongs to tuning: run it with `fedray tune`, which searches each cell first"
        )
    errors: list[str] = []
    axes = _axes(raw, errors)
    max_concurrent = raw.get("max_concurrent_runs", 0)
    if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 0:
        errors.append(
            f"max_concurrent_runs: expected an integer >= 0 (0 = from resources), got {max_concurrent!r}"
        )
    if not errors and (n := _size(axes)) > MAX_RUNS:
        errors.append(
            f"expands to {n:,} runs; a sweep file makes at most {MAX_RUNS:,} (split it, or narrow an axis)"
        )
    if errors:
        raise SweepError("\n  ".join([f"{source}: invalid sweep; nothing was started:", *errors]))
    base = unsection({k: v for k, v in raw.items() if k not in SWEEP_KEYS}, source)
    if base.get("plugins"):
        base["plugins"] = resolve_plugins(base["plugins"], Path(path).resolve().parent, f"{source}: plugins")
    sets = list(sets)
    over = _flat_keys(flatten(parse_sets(sets)), "--set")
    from_set = typed_sets(sets)
    if plugins:
        over["plugins"] = [*base.get("plugins", []), *resolve_plugins(list(plugins), None, "--plugin")]
    if output is not None:
        over["output"] = output
    wanted = _flat_keys(flatten(parse_sets(only, flag="--only")), "--only")
    return _SweepParts(source, axes, max_concurrent, base, from_set, flatten(base), over, wanted)


def _expand(parts: _SweepParts) -> tuple[list[tuple[str, Config]], dict[str, list[str]], int]:
    """Every combination of the axes as a checked config with its label; the problems of those that
    do not check (each with the runs it is in), and how many combinations there are. A key set where
    no run reached reads it is refused at once (`_Unread`)."""
    base, over = parts.base, parts.over
    problems: dict[str, list[str]] = {}
    valid: list[tuple[str, Config]] = []
    unread = _Unread()
    total = 0
    for combo in _product(parts.axes):
        total += 1
        tree = copy.deepcopy(base)
        label = " ".join(c.label for c in combo) or "the file as it is"  # a sweep file with no axes
        replaced = {k: v for k, v in over.items() if any(_overlaps(k, a) for c in combo for a in c.overrides)}
        if replaced:  # the label says what the run uses, not only the axis value --set replaced
            label += " (--set " + ",".join(f"{k}={_fmt(v)}" for k, v in replaced.items()) + ")"
        try:
            for c in combo:
                _apply(tree, c.overrides)
            file_tree = copy.deepcopy(tree)
            _apply(tree, over)
            sources = {k: "" for k in base}
            for c in combo:
                sources.update({k.split(".")[0]: w for k, w in c.sources.items()})
            # the file's keys: read by its runs?
            unread.add(sources, unread_keys(file_tree, include_defaults=True), file_tree)
            # --set's: by the runs as set
            unread.add({k: "--set" for k in over}, unread_keys(tree, include_defaults=True), tree)
            for key in unread_keys(tree, include_defaults=True):
                del tree[key]  # for this run's partition (dataset) the key is not there
            valid.append((label, from_dict(tree)))
        except ConfigError as e:
            if not _left_out(tree, parts.wanted):  # a run --only leaves out is not in the way
                set_by = {k for c in combo for k in c.overrides}
                for problem in e.problems:  # each with the runs it is in
                    origin = _origin(problem, parts.from_set, parts.top, set_by)
                    problems.setdefault(problem + origin, []).append(label)
    if unread_errors := unread.errors():
        raise SweepError(
            "\n  ".join([f"{parts.source}: invalid sweep; nothing was started:", *unread_errors])
        )
    return valid, problems, total


def _only(runs: list[SweepRun], wanted: dict[str, Any], source: str, other_problems: bool) -> list[SweepRun]:
    """The runs whose resolved config has every value --only asks for; none is an error that says
    what was likely meant (unless other problems are said already)."""
    resolved = {r.index: _resolved(r.config) for r in runs}
    keys = {k for d in resolved.values() for k in d}
    for k in wanted:
        if keys and k not in keys:
            raise SweepError(f"--only {k}: unknown config key{suggest(k, keys)}")
    runs = [r for r in runs if all(resolved[r.index].get(k, object()) == v for k, v in wanted.items())]
    if runs or other_problems:
        return runs
    # a run's auto is resolved only where it goes (`fedray.sweeps.flow.plan_sweep`), so --only sees
    # the word, not the share it becomes: say so where the word would match
    as_auto = {**wanted, "num_gpus_per_actor": "auto"}
    auto = wanted.get("num_gpus_per_actor", "auto") != "auto" and any(
        all(d.get(k, object()) == v for k, v in as_auto.items()) for d in resolved.values()
    )
    # a name no run has, close to one some run has: the likely typo (labels for label)
    near = "".join(
        suggest(v, {d[k] for d in resolved.values() if isinstance(d.get(k), str)}, prefix=f"{k}=")
        for k, v in wanted.items()
        if isinstance(v, str) and not any(d.get(k, object()) == v for d in resolved.values())
    )
    raise SweepError(
        f"{source}: no run has {', '.join(f'{k}={_fmt(v)}' for k, v in wanted.items())} (--only)"
        + near
        + (
            "; num_gpus_per_actor is auto in the runs that match the rest, resolved only where "
            "they go: --only num_gpus_per_actor=auto picks them"
            if auto
            else ""
        )
    )


def _check_data_sources(chosen: list[tuple[str, Config]], problems: dict[str, list[str]]) -> None:
    """Every data set the runs read is there, checked once per distinct source; a missing one is a
    problem of every run that reads it."""
    from fedray.data import DATASETS, DatasetMissing, check_available

    by_source: dict[tuple, list[tuple[str, Config]]] = {}
    for label, cfg in chosen:
        key = (
            cfg.dataset,
            cfg.resolved_data_root(),
            cfg.download,
            *_values(cfg, (*DATASETS[cfg.dataset].keys, "data")),
        )
        by_source.setdefault(key, []).append((label, cfg))
    for group in by_source.values():
        try:
            check_available(group[0][1].data_section)
        except DatasetMissing as e:
            problems.setdefault(str(e), []).extend(label for label, _ in group)


class _Unread:
    """Which places of a sweep (the file's top level, an axis, a case, --set) set a key that only
    some partitions (datasets) read, and whether any run they reach reads it."""

    def __init__(self) -> None:
        self.read: dict[tuple[str, str], bool] = {}
        # (where, key) -> in the runs that do not read it
        self.unread: dict[tuple[str, str], list[Unread]] = {}
        self.changed: set[tuple[str, str]] = set()  # set to another value than the default in some run

    def add(
        self, sources: Mapping[str, str], unread: Mapping[str, Unread], values: Mapping[str, Any]
    ) -> None:
        """One run: ``sources`` (key -> where it is set), ``unread`` (`unread_keys` of the run, keys
        at their defaults included), ``values`` (the run's keys)."""
        for key, where in sources.items():
            if key not in unread:
                self.read[(where, key)] = True
                continue
            self.read.setdefault((where, key), False)
            self.unread.setdefault((where, key), []).append(unread[key])
            if not at_default(key, values[key]):
                self.changed.add((where, key))

    def errors(self) -> list[str]:
        """A key set somewhere that no run reads, set there to another value than its default (at
        its default it changes nothing: a side file or a resolved config writes every key)."""
        out = []
        for (where, key), read in self.read.items():
            if not read and (where, key) in self.changed:
                first, *others = self.unread[(where, key)]
                message = first.message([u.chosen for u in (first, *others) if u.what == first.what])
                out.append(f"{where}: {message}" if where else message)
        return out


def _origin(problem: str, sets: Mapping[str, Any], top: Iterable[str], set_by: Iterable[str]) -> str:
    """Where the key a run's ``problem`` names got its value, where the run's label does not say:
    `` (set by --set K=V)`` or `` (set at the file's top level)``; "" for a key an axis of the run
    sets (its label shows the value), a key left at its default, or a problem that names no key.
    ``sets``: what --set says (dotted keys), as typed; ``top``: the file's top-level keys (dotted);
    ``set_by``: the run's axes' keys."""
    match = re.search(r"config key '([\w.]+)'", problem)
    if match is None:
        return ""
    key = match[1]

    def within(keys: Iterable[str]) -> bool:
        return any(_overlaps(key, k) for k in keys)

    if within(sets):
        return " (set by --set " + ",".join(f"{k}={v}" for k, v in sets.items() if _overlaps(key, k)) + ")"
    if within(set_by) or not within(top):
        return ""
    return " (set at the file's top level)"


def _left_out(tree: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a run that does not resolve (a bad config) sets a key ``--only`` asks for to another value."""
    flat = flatten(dict(tree))
    return any(k in flat and flat[k] != v for k, v in wanted.items())


def _values(cfg: Config, keys: Iterable[str]) -> tuple[str, ...]:
    return tuple(json.dumps(getattr(cfg, k)) for k in keys)


def _check_partitions(valid: list[tuple[str, Config]], problems: dict[str, list[str]]) -> None:
    """Every distinct partition of the sweep drawn now (labels read once per dataset), so one that
    cannot be drawn fails before anything starts, not hours into the sweep."""
    from fedray.data import (
        DATASETS,
        PARTITIONS,
        DatasetMissing,
        PartitionError,
        check_available,
        check_partition,
        draw_partition,
        train_labels,
        train_sizes,
    )
    from fedray.data.client_files import ClientFilesError

    labels: dict[tuple, tuple | None] = {}
    drawn: dict[tuple, str | None] = {}
    sizes: dict[tuple, dict[int, int]] = {}
    for label, cfg in valid:
        source = (cfg.dataset, cfg.data_root, *_values(cfg, (*DATASETS[cfg.dataset].keys, "data")))
        drawing = (
            cfg.num_clients,
            cfg.partition,
            cfg.seed,
            cfg.data_seed,
            cfg.shift,
            *_values(cfg, PARTITIONS[cfg.partition].keys),
        )
        key = (*source, *drawing)
        if DATASETS[cfg.dataset].own_clients:  # the data set's own clients: built and checked once
            if key not in drawn:
                try:
                    sizes[key] = check_partition(cfg.data_section)
                    drawn[key] = None
                except ClientFilesError as e:
                    drawn[key] = str(e)
            if drawn[key] is not None:
                problems.setdefault(drawn[key], []).append(label)
            else:
                _check_batches(cfg, sizes[key], label, problems)
            continue
        if source not in labels:
            try:  # data that is not here yet (download: true) is drawn when the run has it
                check_available(replace(cfg.data_section, download=False))
                labels[source] = train_labels(cfg.data_section)
            except DatasetMissing:
                labels[source] = None
        if labels[source] is None:
            continue
        if key not in drawn:
            try:
                sizes[key] = train_sizes(cfg.data_section, draw_partition(cfg.data_section, *labels[source]))
                drawn[key] = None
            except PartitionError as e:
                drawn[key] = str(e)
        if drawn[key] is not None:
            problems.setdefault(drawn[key], []).append(label)
        else:
            _check_batches(cfg, sizes[key], label, problems)


def _check_batches(cfg: Config, sizes: dict[int, int], label: str, problems: dict[str, list[str]]) -> None:
    """`check_last_batches` for one run of a sweep, its refusal kept with the run's label."""
    try:
        check_last_batches(cfg, sizes)
    except ConfigError as e:
        problems.setdefault(str(e), []).append(label)


def _resolved(cfg: Config) -> dict[str, Any]:
    """The run's config, flattened, with every hp value the algorithm uses and every setting its
    dataset has (defaults included), so that ``--only hp.tau=1.0`` also keeps the runs where 1.0 is
    the default the config leaves out."""
    from fedray.data import DATASETS

    d = cfg.to_dict()
    d["hp"] = ALGORITHMS[cfg.algorithm].full_hparams(cfg.hp)
    if DATASETS[cfg.dataset].settings is not None:
        d["data"] = dataclasses.asdict(DATASETS[cfg.dataset].make_settings(cfg.data))
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
