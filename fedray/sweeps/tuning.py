"""Tuning (docs/tuning.md): a config or sweep file's ``tune:`` block, read and checked here, with
what is chosen from the trials' rows. Running the trials is Ray Tune's (`actors.tune`); nothing
here imports Ray.

::

    validation_fraction: 0.1            # tuning reads validation only: required
    tune:
      search:                           # any config key, dotted hp.* too
        lr: {loguniform: [0.001, 0.5]}  # also uniform: [lo, hi], randint: [lo, hi), choice: [...], grid: [...]
        hp.mu: {choice: [0.001, 0.01, 0.1]}
      trials: 16                        # samples of the space (a grid's values are each run that often)
      metric: val_accuracy              # val_accuracy | val_loss | val_local_accuracy
      mode: max                         # default: min for a loss, else max
      at: final                         # final | best | mean_last: K (the trial's value that chooses)
      scheduler: {asha: {grace_rounds: 5, reduction_factor: 3}}   # or none
      search_alg: random                # random | grid (the grid's values only) | optuna (TPE)
      seed: 0                           # of the search
      seeds: [0]                        # the training seeds every trial runs (their mean chooses)
      max_concurrent_trials: 0          # 0: as many as the cluster's resources take

A trial is one fedray run a seed of ``seeds`` at the sampled values, evaluating on validation
(``evaluate_on: validation``): it reads no test sample. Each is a run like any other (its run id,
Parquet rows and checkpoints in the results folder), under the experiment name ``EXPERIMENT-tune``
so that `fedray report` keeps them apart from the runs on test.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from fedray.config.coercion import ConfigError, suggest
from fedray.config.keys import FIELDS, Config, field_type, set_dotted

TUNE_KEY = "tune"
DISTRIBUTIONS = ("loguniform", "uniform", "randint", "choice", "grid")
NUMERIC = ("loguniform", "uniform", "randint")
METRICS = ("val_accuracy", "val_loss", "val_local_accuracy")
SCHEDULERS = ("asha", "none")
SEARCH_ALGS = ("random", "grid", "optuna")
# What a trial may not vary: what makes the validation data, what the budget is, where and how it is
# recorded. Tuning the seed would choose a lucky seed, not a setting.
FIXED = (
    "seed",
    "data_seed",
    "validation_fraction",
    "evaluate_on",
    "rounds",
    "output",
    "experiment",
    "plugins",
    "dataset",
    "data_root",
)
MAX_TRIALS = 10_000  # the sweep limit: trials a search may run
TRIALS_SUFFIX = "-tune"  # the trials' experiment: the cell's experiment and this


class TuneError(ConfigError):
    """A ``tune:`` block fedray cannot search; the message names the key."""


@dataclass(frozen=True)
class Dist:
    """One key's search space: a distribution and its arguments as written."""

    kind: str
    args: tuple[Any, ...]

    def corners(self) -> list[Any]:
        """Values that bound the space: every value a trial may be given is checked between them."""
        if self.kind in ("choice", "grid"):
            return list(self.args)
        lo, hi = self.args
        return [lo, hi - 1] if self.kind == "randint" else [lo, hi]

    def size(self) -> int:
        return len(self.args) if self.kind == "grid" else 1


@dataclass(frozen=True)
class TuneSpec:
    search: dict[str, Dist]
    trials: int = 16
    metric: str = "val_accuracy"
    mode: str = "max"
    at: str = "final"
    last: int = 1  # at mean_last: K
    scheduler: str = "asha"
    grace_rounds: int = 1
    reduction_factor: float = 3.0
    search_alg: str = "random"
    seed: int = 0
    seeds: tuple[int, ...] = (0,)
    max_concurrent_trials: int = 0

    @property
    def total(self) -> int:
        """Trials run: ``trials`` samples, each grid key's values run that often."""
        return self.trials * math.prod(d.size() for d in self.search.values())

    def describe(self) -> str:
        return ", ".join(f"{k} {d.kind}{list(d.args)}" for k, d in self.search.items())


def _where(key: str) -> str:
    return f"tune.{key}"


def _dist(key: str, value: Any, problems: list[str]) -> Dist | None:
    where = f"{_where('search')}.{key}"
    if not isinstance(value, Mapping) or len(value) != 1:
        problems.append(
            f"{where}: a distribution, one of {', '.join(DISTRIBUTIONS)} (e.g. {{loguniform: [0.001, 0.5]}}), "
            f"got {value!r}"
        )
        return None
    ((kind, args),) = value.items()
    if kind not in DISTRIBUTIONS:
        problems.append(
            f"{where}: unknown distribution {kind!r}{suggest(str(kind), DISTRIBUTIONS)} (allowed: {', '.join(DISTRIBUTIONS)})"
        )
        return None
    if not isinstance(args, list) or not args:
        problems.append(f"{where}: {kind} takes a list of values, got {args!r}")
        return None
    if kind in NUMERIC:
        numbers = all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args)
        if len(args) != 2 or not numbers or not args[0] < args[1]:
            problems.append(f"{where}: {kind} takes [low, high] with low < high, got {args!r}")
            return None
        if kind == "loguniform" and args[0] <= 0:
            problems.append(f"{where}: loguniform takes [low, high] above 0, got {args!r}")
            return None
        if kind == "randint" and not all(isinstance(a, int) for a in args):
            problems.append(f"{where}: randint takes integers [low, high), got {args!r}")
            return None
    return Dist(kind, tuple(args))


def _search_items(tree: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """The searched keys (dotted) and their distributions: ``hp.mu: {...}`` or ``hp: {mu: {...}}``."""
    out = []
    for k, v in tree.items():
        key = f"{prefix}{k}"
        is_dist = isinstance(v, Mapping) and len(v) == 1 and next(iter(v)) in DISTRIBUTIONS
        if isinstance(v, Mapping) and v and not is_dist and all(isinstance(x, Mapping) for x in v.values()):
            out += _search_items(v, f"{key}.")
        else:
            out.append((key, v))
    return out


def _key_type(key: str, algorithms: Iterable[str]) -> tuple[Any, str | None]:
    """The type a searched key takes, and what is wrong with searching it (None: nothing)."""
    if key.startswith("hp."):
        from fedray.algorithms import ALGORITHMS

        name = key[3:]
        for alg in algorithms:
            kind = ALGORITHMS.get(alg)
            hints = {} if kind is None else typing_hints(kind.Hparams)
            if name not in hints:
                return None, f"is not a hyperparameter of {alg}{suggest(name, list(hints))}"
        return typing_hints(ALGORITHMS[next(iter(algorithms))].Hparams)[name], None
    if key not in FIELDS:
        return None, f"is not a config key{suggest(key, list(FIELDS))}"
    if key in FIXED:
        return None, "is fixed in a search (it makes the validation data, the budget or the record)"
    return field_type(key), None


def typing_hints(cls: type) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(cls)


def _numeric(typ: Any) -> bool:
    return typ in (int, float)


def read_spec(block: Any, algorithms: Iterable[str]) -> TuneSpec:
    """The ``tune:`` block as a `TuneSpec`; every problem in one `TuneError`, each naming its key."""
    problems: list[str] = []
    if not isinstance(block, Mapping):
        raise TuneError(f"{_where('')[:-1]}: a mapping (search, trials, metric, ...), got {block!r}")
    known = {
        "search",
        "trials",
        "metric",
        "mode",
        "at",
        "scheduler",
        "search_alg",
        "seed",
        "seeds",
        "max_concurrent_trials",
    }
    for key in block:
        if key not in known:
            problems.append(f"{_where(str(key))}: not a tune key{suggest(str(key), sorted(known))}")
    algorithms = list(algorithms)
    search: dict[str, Dist] = {}
    raw = block.get("search")
    if not isinstance(raw, Mapping) or not raw:
        problems.append(
            f"{_where('search')}: the keys to search and their distributions, e.g. lr: {{loguniform: [0.001, 0.5]}}; got {raw!r}"
        )
        raw = {}
    for key, value in _search_items(raw):
        dist = _dist(key, value, problems)
        typ, wrong = _key_type(key, algorithms)
        if wrong:
            problems.append(f"{_where('search')}.{key}: {key} {wrong}")
            continue
        if dist is not None:
            if dist.kind in NUMERIC and not _numeric(typ):
                problems.append(
                    f"{_where('search')}.{key}: {dist.kind} draws numbers, and {key} takes {getattr(typ, '__name__', typ)}: use choice"
                )
            elif dist.kind == "randint" and typ is not int:
                problems.append(
                    f"{_where('search')}.{key}: randint draws integers, and {key} takes {typ.__name__}: use uniform"
                )
            else:
                search[key] = dist
    spec = _scalars(block, problems)
    if problems:
        raise TuneError.of(problems)
    spec = dataclasses.replace(spec, search=search)
    if spec.search_alg == "grid" and any(d.kind != "grid" for d in search.values()):
        raise TuneError(
            f"{_where('search_alg')}: grid runs the grid's values, and {', '.join(k for k, d in search.items() if d.kind != 'grid')} is not a grid: write {{grid: [...]}}, or search_alg: random"
        )
    if spec.total > MAX_TRIALS:
        raise TuneError(
            f"{_where('trials')}: {spec.total:,} trials; a search runs at most {MAX_TRIALS:,} (the sweep limit)"
        )
    if spec.search_alg == "optuna":
        try:
            import optuna  # noqa: F401
        except ImportError:
            raise TuneError(
                f"{_where('search_alg')}: optuna searches with Optuna's TPE, which is not installed: "
                "pip install 'fedray[optuna]' (or pip install optuna)"
            ) from None
        if any(d.kind == "grid" for d in search.values()):
            raise TuneError(
                f"{_where('search_alg')}: optuna does not search a grid: write choice: [...] instead"
            )
    return spec


def _scalars(block: Mapping[str, Any], problems: list[str]) -> TuneSpec:
    """The block's keys but ``search``."""

    def integer(key: str, default: int, low: int) -> int:
        v = block.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            problems.append(f"{_where(key)}: an integer >= {low}, got {v!r}")
            return default
        return v

    def one_of(key: str, default: str, allowed: Sequence[str]) -> str:
        v = block.get(key, default)
        if v not in allowed:
            problems.append(
                f"{_where(key)}: one of {', '.join(allowed)}, got {v!r}{suggest(str(v), allowed)}"
            )
            return default
        return v

    trials = integer("trials", 16, 1)
    metric = block.get("metric", "val_accuracy")
    if metric not in METRICS:
        hint = (
            f" (tuning reads validation only: val_{metric}?)"
            if f"val_{metric}" in METRICS
            else suggest(str(metric), METRICS)
        )
        problems.append(f"{_where('metric')}: one of {', '.join(METRICS)}, got {metric!r}{hint}")
        metric = "val_accuracy"
    mode = one_of("mode", "min" if "loss" in str(metric) else "max", ("max", "min"))
    at, last = _at(block.get("at", "final"), problems)
    scheduler, grace, factor = _scheduler(block.get("scheduler", {"asha": {}}), problems)
    seeds = seed_list(block.get("seeds", [0]))
    if seeds is None:
        problems.append(f"{_where('seeds')}: a list of seeds (integers >= 0), got {block['seeds']!r}")
        seeds = [0]
    return TuneSpec(
        {},
        trials=trials,
        metric=metric,
        mode=mode,
        at=at,
        last=last,
        scheduler=scheduler,
        grace_rounds=grace,
        reduction_factor=factor,
        search_alg=one_of("search_alg", "random", SEARCH_ALGS),
        seed=integer("seed", 0, 0),
        seeds=tuple(dict.fromkeys(seeds)),
        max_concurrent_trials=integer("max_concurrent_trials", 0, 0),
    )


def seed_list(value: Any) -> list[int] | None:
    """Seeds as a file writes them (one, or a list), each once in order; None where they are not."""
    seeds = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(seeds, list) or not seeds:
        return None
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        return None
    return list(dict.fromkeys(seeds))


def _at(value: Any, problems: list[str]) -> tuple[str, int]:
    if value in ("final", "best"):
        return value, 1
    if isinstance(value, Mapping) and set(value) == {"mean_last"}:
        k = value["mean_last"]
        if isinstance(k, int) and not isinstance(k, bool) and k >= 1:
            return "mean_last", k
    problems.append(f"{_where('at')}: final, best, or mean_last: K (K >= 1 evaluations), got {value!r}")
    return "final", 1


def _scheduler(value: Any, problems: list[str]) -> tuple[str, int, float]:
    if value in ("none", None):
        return "none", 1, 3.0
    if value == "asha":
        value = {"asha": {}}
    if isinstance(value, Mapping) and set(value) == {"asha"}:
        opts = value["asha"] or {}
        if isinstance(opts, Mapping) and set(opts) <= {"grace_rounds", "reduction_factor"}:
            grace, factor = opts.get("grace_rounds", 1), opts.get("reduction_factor", 3)
            if isinstance(grace, int) and grace >= 1 and isinstance(factor, (int, float)) and factor > 1:
                return "asha", grace, float(factor)
    problems.append(
        f"{_where('scheduler')}: asha (with grace_rounds >= 1, reduction_factor > 1) or none, e.g. "
        f"{{asha: {{grace_rounds: 5, reduction_factor: 3}}}}; got {value!r}"
    )
    return "none", 1, 3.0


def check_base(cfg: Config, spec: TuneSpec) -> None:
    """What the cell's config must be for its search: validation held out, and every value the
    space reaches a valid config (its corners checked now, not hours into the search)."""
    from fedray.experiment.validation import from_dict

    if cfg.validation_fraction <= 0:
        raise TuneError(
            "config key 'validation_fraction': tuning reads validation only, never a test sample: set it "
            "(e.g. validation_fraction: 0.1)"
        )
    if cfg.shift != "none":
        raise TuneError(
            f"config key 'shift': {cfg.shift}'s test clients are made of the test set: a search cannot read them"
        )
    base = trial_mapping(cfg, {}, spec.seeds[0])
    problems: list[str] = []
    for key, dist in spec.search.items():
        for value in dist.corners():
            try:
                from_dict(trial_mapping(cfg, {key: value}, spec.seeds[0]) if key else base)
            except ConfigError as e:
                problems.append(f"{_where('search')}.{key}: {value!r} gives no valid run: {e}")
                break
    if problems:
        raise TuneError.of(problems)


def trial_mapping(cfg: Config, values: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """A trial's config: the cell's, at ``values`` (dotted keys), seed ``seed``, evaluating on
    validation, under the trials' experiment name."""
    tree = cfg.to_dict()
    for key, value in values.items():
        set_dotted(tree, key, value, f"{_where('search')}.{key}")
    tree["seed"] = seed
    tree["evaluate_on"] = "validation"
    tree["experiment"] = trials_experiment(cfg.experiment)
    return tree


def trials_experiment(experiment: str) -> str:
    return experiment if experiment.endswith(TRIALS_SUFFIX) else f"{experiment}{TRIALS_SUFFIX}"


def cell_key(cfg: Config, spec: TuneSpec) -> str:
    """A short name of a cell's search (its folder under OUT/tune/): the hash of its config and of
    the search itself, so a tune: block changed since (more trials, another space) is searched
    anew rather than restored as it was (its trials' finished runs are found by their run ids)."""
    tree = cfg.to_dict()
    tree.pop("seed", None)
    both = {"config": tree, "search": dataclasses.asdict(spec)}
    return hashlib.sha256(json.dumps(both, sort_keys=True, default=str).encode()).hexdigest()[:12]


# ------------------------------------------------------------------------------------------------
# Choosing from the trials' rows
# ------------------------------------------------------------------------------------------------


@dataclass
class Trial:
    """A trial as its rows tell it: the values it ran, its runs (a seed each), the metric by round
    (the mean over its seeds), the rounds it ran of the budget, and its value at ``at``."""

    values: dict[str, Any]
    run_ids: list[str]
    curve: pd.Series  # round -> the metric's mean over the trial's seeds
    rounds: int
    value: float = math.nan
    stopped: bool = False  # stopped early (ASHA), before the budget


def trial_value(curve: pd.Series, spec: TuneSpec) -> float:
    """A trial's value: its last evaluation's, its best, or the mean of its last K."""
    if curve.empty:
        return math.nan
    if spec.at == "best":
        return float(curve.max() if spec.mode == "max" else curve.min())
    if spec.at == "mean_last":
        return float(curve.iloc[-spec.last :].mean())
    return float(curve.iloc[-1])


def read_trials(
    metrics: pd.DataFrame, trials: Sequence[tuple[dict[str, Any], list[str]]], spec: TuneSpec, budget: int
) -> list[Trial]:
    """Each trial (its values, its run ids) from the results folder's metric rows."""
    rows = metrics[(metrics["metric"] == spec.metric) & (metrics["scope"] == "global")]
    out = []
    for values, run_ids in trials:
        mine = rows[rows["run_id"].isin(run_ids)]
        # a round every seed of the trial reached: their mean there
        per = mine.groupby("round")["value"].agg(["mean", "count"])
        curve = per.loc[per["count"] == len(run_ids), "mean"].sort_index()
        done = int(curve.index.max()) if len(curve) else 0
        t = Trial(values, run_ids, curve, done, stopped=done < budget)
        t.value = trial_value(curve, spec)
        out.append(t)
    return out


def choose(trials: Sequence[Trial], spec: TuneSpec) -> Trial:
    """The chosen trial: the best value among those that ran the whole budget (ASHA lets some; a
    trial stopped early is compared only where none finished), the first on a tie."""
    finished = [t for t in trials if not t.stopped and not math.isnan(t.value)]
    pool = finished or [t for t in trials if not math.isnan(t.value)]
    if not pool:
        raise TuneError(f"no trial recorded {spec.metric}: nothing to choose from (see the trials' runs)")
    pick = max if spec.mode == "max" else min
    return pick(pool, key=lambda t: t.value)


def tuned_document(
    cell: str, cfg: Config, spec: TuneSpec, chosen: Trial, trials: Sequence[Trial]
) -> dict[str, Any]:
    """What ``tuned.yaml`` says of one cell: the values chosen, on what, and the --set that reuses them."""
    values = {k: _exact(v) for k, v in chosen.values.items()}  # the trial's own: a rounded lr is another run
    return {
        "cell": cell,
        "experiment": cfg.experiment,
        "algorithm": cfg.algorithm,
        "chosen": values,
        "set": [f"{k}={v}" for k, v in values.items()],
        "metric": spec.metric,
        "mode": spec.mode,
        "at": spec.at if spec.at != "mean_last" else f"mean_last {spec.last}",
        "value": _plain(chosen.value),
        "chosen_runs": list(chosen.run_ids),
        "trials": len(trials),
        "stopped_early": sum(t.stopped for t in trials),
        "trial_rounds": int(sum(t.rounds * len(t.run_ids) for t in trials)),
        "search": {k: {d.kind: list(d.args)} for k, d in spec.search.items()},
        "seeds": list(spec.seeds),
        "trial_list": [
            {
                "values": {k: _exact(v) for k, v in t.values.items()},
                "value": _plain(t.value),
                "rounds": t.rounds,
                "stopped": t.stopped,
                "runs": list(t.run_ids),
            }
            for t in sorted(trials, key=lambda t: t.run_ids)  # the same list however Tune ordered them
        ],
    }


def _exact(v: Any) -> Any:
    """A value as YAML writes it back exactly (a float's shortest repr that reads back the same)."""
    return v.item() if hasattr(v, "item") else v


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float):
        return float(f"{v:.6g}")
    return v


def write_tuned(out: str | Path, cells: Sequence[dict[str, Any]]) -> Path:
    """``OUT/tuned.yaml``: every cell's choice (written whole, then renamed)."""
    from fedray.storage.files import write_text_atomic

    path = Path(out) / "tuned.yaml"
    write_text_atomic(yaml.safe_dump({"cells": list(cells)}, sort_keys=False), path)
    return path


def read_tuned(out: str | Path) -> list[dict[str, Any]]:
    """The cells of ``OUT/tuned.yaml`` (none where it is not there)."""
    path = Path(out) / "tuned.yaml"
    if not path.is_file():
        return []
    data = yaml.safe_load(path.read_text()) or {}
    return list(data.get("cells", []))


def split_block(raw: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """A file's keys without its ``tune:`` block, and the block."""
    rest = {k: v for k, v in raw.items() if k != TUNE_KEY}
    return rest, raw.get(TUNE_KEY)


__all__ = [
    "DISTRIBUTIONS",
    "METRICS",
    "TUNE_KEY",
    "Dist",
    "Trial",
    "TuneError",
    "TuneSpec",
    "check_base",
    "choose",
    "read_spec",
    "read_trials",
    "read_tuned",
    "split_block",
    "trial_mapping",
    "trial_value",
    "trials_experiment",
    "tuned_document",
    "write_tuned",
]
