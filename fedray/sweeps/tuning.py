"""Tuning (docs/tuning.md): a config or sweep file's ``tune:`` block, read and checked here, with
what is chosen from the trials' rows. Running the trials is Ray Tune's (`actors.tune`); nothing
here imports Ray.

::

    validation_fraction: 0.1            # tuning reads validation only: required
    tune:
      search:                           # any config key, dotted hp.* too
        lr: {loguniform: [0.001, 0.5]}  # also uniform: [lo, hi], randint: [lo, hi), choice: [...], grid: [...]
        hp.mu: {choice: [0.001, 0.01, 0.1]}
      trials: 16                        # draws of the space (a grid alone: each value once, the default)
      metric: val_accuracy              # val_accuracy | val_loss | val_local_accuracy
      mode: max                         # default: min for a loss, else max
      at: final                         # final | best | mean_last: K (the trial's value that chooses)
      scheduler: {successive_halving: {grace_rounds: 5, reduction_factor: 3}}   # (asha: the same), or none
      search_alg: random                # random | grid (the grid's values only) | optuna (TPE)
      batch: 4                          # optuna: trials asked at a time
      seed: 0                           # of the search
      seeds: [0]                        # the training seeds every trial runs (their mean chooses)
      max_concurrent_trials: 0          # 0: as many as the cluster's resources take

A trial is one fedray run a seed of ``seeds`` at the drawn values, evaluating on validation
(``evaluate_on: validation``): it reads no test sample. Each is a run like any other (its run id,
Parquet rows and checkpoints in the results folder), under the experiment name ``EXPERIMENT-tune``
so that `fedray report` keeps them apart from the runs on test. Which trials run, which are stopped
and which is chosen is decided from the recorded values alone (`fedray.sweeps.search`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedray.config.coercion import ConfigError, suggest
from fedray.config.keys import FIELDS, FIXED_IN_SEARCH, Config, field_type, flat_key, set_dotted
from fedray.sweeps.choosing import At, parse_at

TUNE_KEY = "tune"
DISTRIBUTIONS = ("loguniform", "uniform", "randint", "choice", "grid")
NUMERIC = ("loguniform", "uniform", "randint")
METRICS = ("val_accuracy", "val_loss", "val_local_accuracy")
# successive halving at fixed rungs, each decided once it is complete; "asha" is the name files
# used when Ray Tune's asynchronous ASHA ran it, kept as the same thing
HALVING = "successive_halving"
SEARCH_ALGS = ("random", "grid", "optuna")
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
    scheduler: str = HALVING  # or "none"
    grace_rounds: int = 1
    reduction_factor: float = 3.0
    search_alg: str = "random"
    seed: int = 0
    seeds: tuple[int, ...] = (0,)
    max_concurrent_trials: int = 0
    batch: int = 4  # optuna: trials asked at a time
    # the scheduler as the file wrote it (False: the default, which halves only where it stops a trial)
    scheduler_written: bool = True
    trials_written: bool = True  # False: a grid alone then runs each point once
    # keys searched only in the cells of an algorithm (``per_algorithm: {moon: {hp.mu: ...}}``)
    per_algorithm: dict[str, dict[str, Dist]] = dataclasses.field(default_factory=dict)

    def for_algorithm(self, algorithm: str) -> TuneSpec:
        """The search of a cell of ``algorithm``: the common keys and its algorithm's own."""
        search = {**self.search, **self.per_algorithm.get(algorithm, {})}
        grid_only = bool(search) and all(d.kind == "grid" for d in search.values())
        trials = 1 if grid_only and not self.trials_written else self.trials
        return dataclasses.replace(self, search=search, trials=trials, per_algorithm={})

    @property
    def total(self) -> int:
        """Trials drawn: ``trials`` draws, each grid key's values with every draw."""
        return self.trials * math.prod(d.size() for d in self.search.values())

    @property
    def at_text(self) -> str:
        """``at`` as a line says it: ``final``, ``best``, ``mean_last 3``."""
        return At(self.at, self.last).text

    @property
    def grid_only(self) -> bool:
        """Every searched key is a grid: its values are the trials, each run once."""
        return all(d.kind == "grid" for d in self.search.values())

    def describe(self) -> str:
        return ", ".join(f"{k} {d.kind}{list(d.args)}" for k, d in self.search.items())


def _where(key: str) -> str:
    return f"tune.{key}"


def _dist(key: str, value: Any, problems: list[str], section: str = "tune.search") -> Dist | None:
    where = f"{section}.{key}"
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
    if key in FIXED_IN_SEARCH:  # the keys declared untunable: what a search holds fixed
        return None, "is fixed in a search (it makes the validation data, the budget or the record)"
    return field_type(key), None


def typing_hints(cls: type) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(cls)


def _numeric(typ: Any) -> bool:
    return typ in (int, float)


def _read_search(raw: Any, where: str, algorithms: Sequence[str], problems: list[str]) -> dict[str, Dist]:
    """A ``search`` mapping (``where`` names it) as distributions, each key checked against
    ``algorithms`` (an hp.* key must be a hyperparameter of each)."""
    search: dict[str, Dist] = {}
    seen: set[str] = set()
    for written, value in _search_items(raw):
        try:
            key = flat_key(written)  # training.lr, as a config written in sections names it, is lr
        except ConfigError as e:
            problems.append(f"{where}.{written}: {e}")
            continue
        if key in seen:  # every key read so far, searched or refused
            problems.append(f"{where}.{written}: {key} is searched twice")
            continue
        seen.add(key)
        dist = _dist(key, value, problems, where)
        typ, wrong = _key_type(key, algorithms)
        if wrong:
            problems.append(f"{where}.{key}: {key} {wrong}")
            continue
        if dist is not None:
            if dist.kind in NUMERIC and not _numeric(typ):
                problems.append(
                    f"{where}.{key}: {dist.kind} draws numbers, and {key} takes {getattr(typ, '__name__', typ)}: use choice"
                )
            elif dist.kind == "randint" and typ is not int:
                problems.append(
                    f"{where}.{key}: randint draws integers, and {key} takes {typ.__name__}: use uniform"
                )
            else:
                search[key] = dist
    return search


def read_spec(block: Any, algorithms: Iterable[str]) -> TuneSpec:
    """The ``tune:`` block as a `TuneSpec`; every problem in one `TuneError`, each naming its key.
    ``algorithms``: those of the file's cells, whose searches are each checked."""
    problems: list[str] = []
    if not isinstance(block, Mapping):
        raise TuneError(f"{_where('')[:-1]}: a mapping (search, trials, metric, ...), got {block!r}")
    known = {
        "search",
        "per_algorithm",
        "trials",
        "metric",
        "mode",
        "at",
        "scheduler",
        "search_alg",
        "seed",
        "seeds",
        "max_concurrent_trials",
        "batch",
    }
    for key in block:
        if key not in known:
            problems.append(f"{_where(str(key))}: not a tune key{suggest(str(key), sorted(known))}")
    algorithms = list(algorithms)
    per: dict[str, dict[str, Dist]] = {}
    raw_per = block.get("per_algorithm", {})
    if not isinstance(raw_per, Mapping):
        problems.append(
            f"{_where('per_algorithm')}: each algorithm's own keys to search, e.g. moon: {{hp.mu: {{grid: [0.01, 0.1]}}}}; "
            f"got {raw_per!r}"
        )
        raw_per = {}
    for alg, raw in raw_per.items():
        where = f"{_where('per_algorithm')}.{alg}"
        if alg not in algorithms:
            problems.append(f"{where}: no cell of the file runs {alg}{suggest(str(alg), algorithms)}")
        elif not isinstance(raw, Mapping) or not raw:
            problems.append(f"{where}: {alg}'s keys to search and their distributions; got {raw!r}")
        else:
            per[alg] = _read_search(raw, where, [alg], problems)
    raw = block.get("search", {} if raw_per else None)
    if not isinstance(raw, Mapping) or not (raw or raw_per):
        problems.append(
            f"{_where('search')}: the keys to search and their distributions, e.g. lr: {{loguniform: [0.001, 0.5]}}; got {raw!r}"
        )
        raw = {}
    search = _read_search(raw, _where("search"), algorithms, problems)
    spec = _scalars(block, problems)
    if problems:
        raise TuneError.of(problems)
    spec = dataclasses.replace(spec, search=search, per_algorithm=per, trials_written="trials" in block)
    if "batch" in block and spec.search_alg != "optuna":
        raise TuneError(
            f"{_where('batch')}: only optuna asks for trials in batches ({spec.search_alg} draws them all at once)"
        )
    for alg in dict.fromkeys(algorithms):
        _check_cell_search(spec.for_algorithm(alg), alg if per else None)
    if spec.search_alg == "optuna":
        try:
            import optuna  # noqa: F401
        except ImportError:
            raise TuneError(
                f"{_where('search_alg')}: optuna searches with Optuna's TPE, which is not installed: "
                "pip install 'fedray[optuna]' (or pip install optuna)"
            ) from None
    return spec


def _check_cell_search(spec: TuneSpec, algorithm: str | None) -> None:
    """What a cell's search (its common and its algorithm's keys) must be; ``algorithm`` is named
    where the file has per_algorithm searches."""
    of = f" ({algorithm}'s cells)" if algorithm else ""
    search = spec.search
    if search and spec.grid_only and spec.trials != 1:
        raise TuneError(
            f"{_where('trials')}: every searched key{of} is a grid, whose values are each run once (a trial is "
            f"one run a seed of tune.seeds); trials: {spec.trials} would run each again on the same seeds: "
            "leave trials out, or give more seeds (tune.seeds: [0, 1])"
        )
    if spec.search_alg == "grid" and any(d.kind != "grid" for d in search.values()):
        raise TuneError(
            f"{_where('search_alg')}: grid runs the grid's values, and {', '.join(k for k, d in search.items() if d.kind != 'grid')} is not a grid{of}: write {{grid: [...]}}, or search_alg: random"
        )
    if spec.total > MAX_TRIALS:
        raise TuneError(
            f"{_where('trials')}: {spec.total:,} trials{of}; a search runs at most {MAX_TRIALS:,} (the sweep limit)"
        )
    if spec.search_alg == "optuna" and any(d.kind == "grid" for d in search.values()):
        raise TuneError(
            f"{_where('search_alg')}: optuna does not search a grid{of}: write choice: [...] instead"
        )


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
    scheduler, grace, factor = _scheduler(block.get("scheduler", {HALVING: {}}), problems)
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
        batch=integer("batch", 4, 1),
        scheduler_written="scheduler" in block,
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
    """Where a trial's curve is read (`fedray.sweeps.choosing.parse_at`, as `fedray report --at`)."""
    try:
        at = parse_at(value)
    except ValueError:
        at = None
    if at is None or at.how == "best-train":  # a trial's record is its metric's curve alone
        why = (
            "best-train reads training accuracy, which a search does not record for its trials"
            if at is not None
            else f"got {value!r}"
        )
        problems.append(f"{_where('at')}: final, best or mean_last: K (K >= 1 evaluations); {why}")
        return "final", 1
    return at.how, at.last


def _scheduler(value: Any, problems: list[str]) -> tuple[str, int, float]:
    if value in ("none", None):
        return "none", 1, 3.0
    if value in (HALVING, "asha"):
        value = {value: {}}
    if isinstance(value, Mapping) and len(value) == 1 and next(iter(value)) in (HALVING, "asha"):
        opts = next(iter(value.values())) or {}
        if isinstance(opts, Mapping) and set(opts) <= {"grace_rounds", "reduction_factor"}:
            grace, factor = opts.get("grace_rounds", 1), opts.get("reduction_factor", 3)
            if (
                isinstance(grace, int)
                and not isinstance(grace, bool)
                and grace >= 1
                and isinstance(factor, (int, float))
                and not isinstance(factor, bool)
                and factor > 1
            ):
                return HALVING, grace, float(factor)
    problems.append(
        f"{_where('scheduler')}: successive_halving (asha: the same; with grace_rounds >= 1, reduction_factor > 1) "
        f"or none, e.g. {{successive_halving: {{grace_rounds: 5, reduction_factor: 3}}}}; got {value!r}"
    )
    return "none", 1, 3.0


def rungs(spec: TuneSpec, n: int, rounds: int, eval_every: int = 1) -> list[tuple[int, int]]:
    """The search's schedule for ``n`` trials and a budget of ``rounds``: ``(round, trials)`` for
    each rung, the last the whole budget. Successive halving: the first rung at ``grace_rounds``,
    each next at ``reduction_factor`` times the round before (rounded down, at least one more),
    each rung's round rounded up to an evaluated one (a multiple of ``eval_every``); a rung keeps
    the best ``1/reduction_factor`` of its trials (rounded down) for the next, as long as at least
    ``reduction_factor`` (rounded up) go on, and those left then run the whole budget. So several
    trials always reach the full budget, and the choice is made among them."""
    if spec.scheduler == "none":
        return [(rounds, n)]
    least = math.ceil(spec.reduction_factor)
    out: list[tuple[int, int]] = []
    k, step = n, 0
    r = _evaluated(spec.grace_rounds, eval_every)
    while r < rounds and math.floor(k / spec.reduction_factor) >= least:
        out.append((r, k))
        k = math.floor(k / spec.reduction_factor)
        step += 1
        r = _evaluated(
            max(r + 1, math.floor(spec.grace_rounds * spec.reduction_factor**step + 1e-9)), eval_every
        )
    out.append((rounds, k))
    return out


def _evaluated(rnd: int, eval_every: int) -> int:
    """The first round at or after ``rnd`` that is evaluated (``eval_every``)."""
    return -(-rnd // eval_every) * eval_every


def schedule_rounds(schedule: Sequence[tuple[int, int]], seeds: int = 1) -> int:
    """The trial-rounds a schedule spends: each trial's rounds up to the rung it stops at."""
    spent, before = 0, 0
    for r, k in schedule:
        spent += k * (r - before)
        before = r
    return spent * seeds


def describe_schedule(schedule: Sequence[tuple[int, int]], seeds: int = 1) -> str:
    """``16 trials to round 3, the best 5 to round 30 (183 of 480 trial-rounds)``."""
    parts = [
        f"{k} trials to round {r}" if i == 0 else f"the best {k} to round {r}"
        for i, (r, k) in enumerate(schedule)
    ]
    full = schedule[0][1] * schedule[-1][0] * seeds
    return f"{', '.join(parts)} ({schedule_rounds(schedule, seeds)} of {full} trial-rounds)"


def settings(spec: TuneSpec) -> int | None:
    """How many settings a space of choices and grids has (None: a continuous or integer range)."""
    if any(d.kind not in ("choice", "grid") for d in spec.search.values()):
        return None
    return math.prod(len(d.args) for d in spec.search.values())


def check_schedule(cfg: Config, spec: TuneSpec) -> None:
    """A written scheduler that cannot stop a trial is refused, naming why: its first rung at or past
    the budget, before the first evaluation, or too few trials to halve."""
    if spec.scheduler == "none" or not spec.scheduler_written or not spec.search:
        return
    where = f"{_where('scheduler')}.{HALVING}.grace_rounds"
    if spec.grace_rounds >= cfg.rounds:
        raise TuneError(
            f"{where}: {spec.grace_rounds} is not below rounds ({cfg.rounds}): the first rung would be the whole "
            "budget and no trial would stop; lower it, or scheduler: none"
        )
    if spec.grace_rounds < cfg.eval_every:
        raise TuneError(
            f"{where}: {spec.grace_rounds} comes before the first evaluation (eval_every {cfg.eval_every}): a rung "
            f"ranks the trials on their validation values; make it at least {cfg.eval_every}"
        )
    n = min(spec.total, settings(spec) or spec.total)  # a finite space draws at most its settings
    if len(rungs(spec, n, cfg.rounds, cfg.eval_every)) == 1:
        least = math.ceil(spec.reduction_factor)
        need = math.ceil(least * spec.reduction_factor - 1e-9)
        what = f"{n} trials" if n == spec.total else f"{spec.total} draws of a space of {n} settings"
        raise TuneError(
            f"{_where('scheduler')}: {what} are too few to halve at reduction_factor "
            f"{spec.reduction_factor:g} (a rung keeps 1/{spec.reduction_factor:g} of its trials, and at least "
            f"{least} go on to the end: it needs {need} trials or more); draw more trials, or scheduler: none"
        )


def check_base(cfg: Config, spec: TuneSpec) -> None:
    """What the cell's config must be for its search: validation held out, and every value the
    space reaches a valid config (its corners checked now, not hours into the search)."""
    from fedray.experiment.checks import from_dict

    if cfg.validation_fraction <= 0:
        raise TuneError(
            "config key 'validation_fraction': tuning reads validation only, never a test sample: set it "
            "(e.g. validation_fraction: 0.1)"
        )
    if cfg.shift != "none":
        raise TuneError(
            f"config key 'shift': {cfg.shift}'s test clients are made of the test set: a search cannot read them"
        )
    check_schedule(cfg, spec)
    problems: list[str] = []
    for key, dist in spec.search.items():
        for value in dist.corners():
            try:
                from_dict(trial_mapping(cfg, {key: value}, spec.seeds[0]))
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


def tuned_document(cell: str, cfg: Config, spec: TuneSpec, outcome: Any) -> dict[str, Any]:
    """What ``tuned.yaml`` says of one cell's search (a `fedray.sweeps.search.Outcome`, None for a
    cell with nothing to search): the values
    chosen, on what, the --set that reuses them, the schedule and every trial in the order it was
    drawn. Nothing in it depends on when or how fast the trials ran: the same file and seed give
    the same bytes."""
    if outcome is None:  # nothing searched in this cell (its algorithm has no per_algorithm keys)
        return {
            "cell": cell,
            "experiment": cfg.experiment,
            "algorithm": cfg.algorithm,
            "chosen": {},
            "set": [],
            "metric": spec.metric,
            "mode": spec.mode,
            "at": spec.at_text,
            "value": None,
            "chosen_runs": [],
            "trials": 0,
            "note": "nothing searched: its config as it is",
        }
    chosen = outcome.chosen
    values = {k: _exact(v) for k, v in chosen.values.items()}  # the trial's own: a rounded lr is another run
    return {
        "cell": cell,
        "experiment": cfg.experiment,
        "algorithm": cfg.algorithm,
        "chosen": values,
        "set": [f"{k}={v}" for k, v in values.items()],
        "metric": spec.metric,
        "mode": spec.mode,
        "at": spec.at_text,
        "value": _plain(chosen.value),
        "chosen_runs": list(chosen.run_ids),
        "trials": len(outcome.trials),
        "draws": sum(t.draws for t in outcome.trials),
        "stopped_early": sum(t.stopped for t in outcome.trials),
        "diverged": sum(t.diverged for t in outcome.trials),
        "schedule": [{"round": r, "trials": k} for r, k in outcome.schedule],
        "trial_rounds": outcome.trial_rounds,
        "full_trial_rounds": len(outcome.trials) * cfg.rounds * len(spec.seeds),
        "search": {k: {d.kind: list(d.args)} for k, d in spec.search.items()},
        "search_alg": spec.search_alg,
        "seed": spec.seed,
        "seeds": list(spec.seeds),
        "trial_list": [
            {
                "values": {k: _exact(v) for k, v in t.values.items()},
                "value": _plain(t.value),
                "rounds": t.rounds,
                "stopped": t.stopped,
                "diverged": t.diverged,
                "draws": t.draws,
                "runs": list(t.run_ids),
            }
            for t in outcome.trials
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
    """``OUT/tuned.yaml``: every cell's choice (written whole, then renamed), left as it is where it
    already says exactly this: a finished search read again changes no file."""
    path = Path(out) / "tuned.yaml"
    write_if_changed(path, yaml.safe_dump({"cells": list(cells)}, sort_keys=False))
    return path


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` whole (then renamed) unless it holds exactly that; whether it wrote."""
    from fedray.storage.files import write_text_atomic

    try:
        if path.is_file() and not path.is_symlink() and path.read_text() == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    write_text_atomic(text, path)
    return True


def merged_tuned(
    out: str | Path, cells: Sequence[tuple[str, str]], docs: Mapping[int, dict[str, Any]]
) -> list[dict[str, Any]]:
    """``tuned.yaml``'s cells with a search's choices made so far: ``cells`` are the search's
    (experiment, cell) in its order, ``docs`` its documents by index there. The search's cells come
    first, in its order (a cell not chosen yet keeps what the file said of it, if anything), then the
    file's other cells (another file tuned into the same folder) as they were."""
    old = read_tuned(out)
    keyed = {(d.get("experiment"), d.get("cell")): d for d in old}
    mine = []
    for i, key in enumerate(cells):
        if i in docs:
            mine.append(docs[i])
        elif key in keyed:
            mine.append(keyed[key])
    ours = set(cells)
    return mine + [d for d in old if (d.get("experiment"), d.get("cell")) not in ours]


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
    "TuneError",
    "TuneSpec",
    "check_base",
    "read_spec",
    "merged_tuned",
    "read_tuned",
    "split_block",
    "trial_mapping",
    "trials_experiment",
    "tuned_document",
    "write_if_changed",
    "write_tuned",
]
