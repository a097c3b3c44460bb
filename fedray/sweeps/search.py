"""A search decided from recorded values alone (docs/tuning.md#how-a-search-decides).

Which trials a cell's search runs, how far each goes and which is chosen is a function of its file
(the cell's config and its ``tune:`` block, `fedray.sweeps.tuning`) and of the values its trials'
runs recorded, never of when or in what order they ran:

- **The draws.** ``random`` and ``grid`` draw every trial at once from the search's seed (NumPy's
  PCG64); ``optuna`` asks Optuna's TPE (seeded) for ``batch`` trials at a time and tells it each
  batch's values at the first rung, in the order they were asked, before asking for the next. A
  setting drawn twice is one trial (its runs are one config and seed each): it counts once.
- **The rungs.** Successive halving (`fedray.sweeps.tuning.rungs`): every trial is brought to the
  first rung's round, then ranked on its value there (``at`` over the rounds up to the rung), and
  the best ``1/reduction_factor`` go on to the next rung; the rest are stopped there. A rung is
  decided only once every one of its trials has reached it.
- **The tie rule.** Trials of equal value rank in the order they were drawn (the first drawn
  first); a trial whose value is not a number (its run diverged: fedray stops a run whose metrics
  turn non-finite) ranks after every other.
- **The choice** is the best of the trials that ran the whole budget, by the same ranking.

A search is driven as a generator (`CellSearch.steps`): it yields the runs that must reach a round
before it can decide (`Work`), and whoever runs them (`actors.tune`, on Ray Tune) sends it on once
they have. It reads each run's row and metric rows afresh after every step, so an interrupted search
run again replays the same decisions from what its runs recorded, runs only what is missing, and a
finished one runs nothing. There is no search state of its own to lose or to trust.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedray.config.keys import Config
from fedray.sweeps.choosing import At, ranked, read_at
from fedray.sweeps.tuning import (
    Dist,
    TuneError,
    TuneSpec,
    describe_schedule,
    rungs,
    schedule_rounds,
    trial_mapping,
)


@dataclass(frozen=True)
class Work:
    """A run to bring to round ``until`` (stopped there, unless that is its budget)."""

    config: Config
    until: int
    restart: bool  # --restart: the run starts over (the first time this search touches it)
    trial: str  # the trial's values, for messages (``lr=0.0412``)
    stopped_by: str  # why it stops at ``until`` (noted with the run's ``stopped`` event)

    @property
    def run_id(self) -> str:
        return self.config.run_id()


@dataclass
class Record:
    """What a run's files say of it now: its status, the rounds it ran, the round it diverged at
    (None: it did not), its error, and its values of the search's metric by round."""

    status: str | None
    rounds_done: int = 0
    diverged_at: int | None = None
    error: str = ""
    curve: list[tuple[int, float]] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)  # the validation metrics it recorded

    def reached(self, rnd: int) -> bool:
        """Whether the run has been where round ``rnd`` asks: finished, stopped at or past it, or
        diverged (it goes no further)."""
        return (
            self.status == "finished"
            or self.diverged_at is not None
            or (self.status == "stopped" and self.rounds_done >= rnd)
        )


def read_record(cfg: Config, metric: str) -> Record:
    """``cfg``'s run as its row and metric rows in its results folder tell it."""
    from fedray.storage.results import read_run_row, run_metric, run_metric_names

    row = read_run_row(cfg.output, cfg.run_id())
    if row is None:
        return Record(None)
    summary = json.loads(row.get("summary") or "{}")
    error = row.get("error") or ""
    done = int(summary.get("rounds_done", 0))
    diverged = row["status"] == "failed" and error.startswith("FloatingPointError")
    curve = run_metric(cfg.output, cfg.run_id(), metric)
    names = [] if curve else [m for m in run_metric_names(cfg.output, cfg.run_id()) if m.startswith("val_")]
    return Record(row["status"], done, done + 1 if diverged else None, error, curve, names)


@dataclass
class Trial:
    """A trial: a setting of the searched keys, its runs (a seed each), how far it was asked to go
    and what its runs recorded there."""

    index: int  # the order it was first drawn in
    values: dict[str, Any]
    configs: list[Config]  # its runs' configs, a seed of tune.seeds each
    draws: int = 1
    rounds: int = 0  # the round it was last asked to reach
    curve: list[tuple[int, float]] = field(default_factory=list)  # the mean over its seeds, by round
    value: float = math.nan  # ``at`` over its curve up to ``rounds``
    diverged: bool = False
    stopped: bool = False  # stopped at a rung, before the budget

    @property
    def run_ids(self) -> list[str]:
        return [c.run_id() for c in self.configs]

    def describe(self) -> str:
        return ", ".join(f"{k}={short(v)}" for k, v in self.values.items())


@dataclass
class Outcome:
    """A finished search: every trial in draw order, the chosen one, the schedule it ran and the
    trial-rounds it spent (each run's rounds up to where it stopped)."""

    trials: list[Trial]
    chosen: Trial
    schedule: list[tuple[int, int]]
    trial_rounds: int


def short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def sample(dist: Dist, rng: np.random.Generator) -> Any:
    """One value of ``dist`` (not a grid) from ``rng``."""
    if dist.kind == "loguniform":
        lo, hi = dist.args
        return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    if dist.kind == "uniform":
        return float(rng.uniform(*dist.args))
    if dist.kind == "randint":
        return int(rng.integers(*dist.args))
    if dist.kind == "choice":
        return dist.args[int(rng.integers(len(dist.args)))]
    raise ValueError(f"{dist.kind} is not drawn")


def draw(spec: TuneSpec) -> list[dict[str, Any]]:
    """The trials of a ``random`` or ``grid`` search, in order: ``trials`` draws, each with every
    point of the grid keys (in the file's order), the other keys drawn from the search's seed."""
    rng = np.random.default_rng(spec.seed)
    grid = [k for k, d in spec.search.items() if d.kind == "grid"]
    out = []
    for _ in range(spec.trials):
        for point in itertools.product(*(spec.search[k].args for k in grid)):
            at = dict(zip(grid, point, strict=True))
            out.append({k: at[k] if k in at else sample(d, rng) for k, d in spec.search.items()})
    return out


def _identity(values: dict[str, Any]) -> str:
    """Settings are the same trial when their values are (exactly, with their types)."""
    return json.dumps([(k, type(v).__name__, repr(v)) for k, v in values.items()])


def _optuna_distributions(spec: TuneSpec) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, Any] = {}
    for key, d in spec.search.items():
        if d.kind in ("loguniform", "uniform"):
            out[key] = FloatDistribution(float(d.args[0]), float(d.args[1]), log=d.kind == "loguniform")
        elif d.kind == "randint":
            out[key] = IntDistribution(d.args[0], d.args[1] - 1)
        else:
            out[key] = CategoricalDistribution(list(d.args))
    return out


def rank(trials: Sequence[Trial], spec: TuneSpec) -> list[Trial]:
    """Best first, by the rule every chooser shares (`fedray.sweeps.choosing.ranked`): a trial is
    one candidate of one value (``mode``); equal values in draw order; a diverged trial, or one not
    read, after every other."""
    trials = sorted(trials, key=lambda t: t.index)
    order = ranked(
        [([t.value], int(t.diverged)) for t in trials], "higher" if spec.mode == "max" else "lower"
    )
    return [trials[i] for i in order]


def value_at(curve: Sequence[tuple[int, float]], rnd: int, spec: TuneSpec) -> float:
    """``at`` over the values of rounds up to ``rnd`` (`fedray.sweeps.choosing.read_at`): the last,
    the best, or the mean of the last K."""
    upto = [(r, v) for r, v in curve if r <= rnd]
    return read_at(upto, At(spec.at, spec.last), "higher" if spec.mode == "max" else "lower")[1]


class CellSearch:
    """One cell's search (its config at the file's seed, with the paths absolute and its GPU share
    resolved): `steps` yields the runs to bring to a round, and returns the `Outcome`. ``restart``:
    every run starts over the first time this search touches it (its earlier records ignored
    until then)."""

    def __init__(
        self,
        cell: Config,
        spec: TuneSpec,
        restart: bool = False,
        label: str = "",
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.cell, self.spec, self.restart, self.label, self.say = cell, spec, restart, label, say
        self.trials: list[Trial] = []
        self._by_identity: dict[str, Trial] = {}
        self._touched: set[str] = set()  # run ids asked for in this search (after --restart: started over)
        self._records: dict[str, Record] = {}
        self.schedule: list[tuple[int, int]] = []
        self.rung = 0  # the rung being reached now (an index into the schedule)
        self.drawn = 0  # draws so far (optuna draws in batches)

    # --- the trials ----------------------------------------------------------------------------------
    def _trial(self, values: dict[str, Any]) -> Trial:
        """The trial of these values: a new one, or the one drawn before (one draw more)."""
        from fedray.experiment.checks import from_dict

        self.drawn += 1
        key = _identity(values)
        if key in self._by_identity:
            t = self._by_identity[key]
            t.draws += 1
            return t
        configs = [from_dict(trial_mapping(self.cell, values, s)) for s in self.spec.seeds]
        t = Trial(len(self.trials), dict(values), configs)
        self.trials.append(t)
        self._by_identity[key] = t
        return t

    def record(self, cfg: Config) -> Record:
        run_id = cfg.run_id()
        if self.restart and run_id not in self._touched:
            return Record(None)  # starts over when first asked: what it holds now is not read
        if run_id not in self._records:
            self._records[run_id] = read_record(cfg, self.spec.metric)
        return self._records[run_id]

    def forget(self) -> None:
        """Runs ran since the records were read: read them again when next asked."""
        self._records.clear()

    def _measure(self, t: Trial, rnd: int) -> None:
        """``t``'s curve (the mean over its seeds, rounds every seed recorded) and value at ``rnd``."""
        records = [self.record(c) for c in t.configs]
        t.diverged = any(r.diverged_at is not None and r.diverged_at <= rnd for r in records)
        per = [dict(r.curve) for r in records]
        common = sorted(set.intersection(*(set(p) for p in per))) if per else []
        t.curve = [(r, sum(p[r] for p in per) / len(per)) for r in common if r <= rnd]
        t.value = math.nan if t.diverged else value_at(t.curve, rnd, self.spec)

    # --- the steps -----------------------------------------------------------------------------------
    def _reach(self, trials: Sequence[Trial], rnd: int) -> Generator[list[Work], None, None]:
        """Bring every run of ``trials`` to round ``rnd`` (those already there are left alone)."""
        stop = rnd < self.cell.rounds
        why = (
            f"successive halving: rung {self.rung + 1} of {len(self.schedule) or '?'}, round {rnd}"
            if stop
            else ""
        )
        work = []
        for t in trials:
            t.rounds = max(t.rounds, rnd)
            for cfg in t.configs:
                if not self.record(cfg).reached(rnd):
                    restart = self.restart and cfg.run_id() not in self._touched
                    work.append(Work(cfg, rnd, restart, t.describe(), why))
        if work:
            self._touched.update(w.run_id for w in work)
            yield work
            self.forget()
            for w in work:
                rec = self.record(w.config)
                if not rec.reached(rnd):
                    raise TuneError(self._unreached(w, rec))
        for t in trials:
            self._check_metric(t)
            self._measure(t, rnd)
        if trials and all(math.isnan(t.value) and not t.diverged for t in trials):
            raise TuneError(
                f"{self.label}no trial recorded {self.spec.metric} by round {rnd} (eval_every "
                f"{self.cell.eval_every}): a rung ranks the trials on their validation values"
            )

    def _unreached(self, w: Work, rec: Record) -> str:
        where = f"{self.label}trial {w.trial} (run {w.run_id}, {self.cell.output}/runs/)"
        if rec.status == "failed":
            first = rec.error.strip().splitlines()[0] if rec.error.strip() else "no error recorded"
            return f"{where} failed: {first}"
        return f"{where} did not reach round {w.until}: it is {rec.status or 'not started'}"

    def _check_metric(self, t: Trial) -> None:
        for cfg in t.configs:
            rec = self.record(cfg)
            if not rec.curve and rec.diverged_at is None and rec.metrics:
                raise TuneError(
                    f"tune.metric: {self.cell.algorithm} records no {self.spec.metric} (it records "
                    f"{', '.join(rec.metrics)})"
                )

    def _draw_all(self) -> None:
        for values in draw(self.spec):
            self._trial(values)

    def _ask_in_batches(self, first_round: int) -> Generator[list[Work], None, None]:
        """Optuna's TPE, seeded: ``batch`` trials asked at a time, each batch brought to the first
        rung and its values there told in the order asked, before the next batch is asked."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(
            direction="maximize" if self.spec.mode == "max" else "minimize",
            sampler=optuna.samplers.TPESampler(seed=self.spec.seed),
        )
        dists = _optuna_distributions(self.spec)
        while self.drawn < self.spec.total:
            asked = [study.ask(dists) for _ in range(min(self.spec.batch, self.spec.total - self.drawn))]
            batch = [self._trial({k: ot.params[k] for k in self.spec.search}) for ot in asked]
            yield from self._reach(list({id(t): t for t in batch}.values()), first_round)
            for ot, t in zip(asked, batch, strict=True):
                if math.isnan(t.value):
                    study.tell(ot, state=optuna.trial.TrialState.FAIL)
                else:
                    study.tell(ot, t.value)

    def steps(self) -> Generator[list[Work], None, Outcome]:
        """The search: yields the runs to bring to a round (sent on once they have), returns the
        `Outcome`."""
        spec, budget = self.spec, self.cell.rounds
        if spec.search_alg == "optuna":
            planned = rungs(spec, spec.total, budget, self.cell.eval_every)
            self.schedule = planned
            yield from self._ask_in_batches(planned[0][0])
        else:
            self._draw_all()
        self.schedule = rungs(spec, len(self.trials), budget, self.cell.eval_every)
        if len(self.trials) < self.drawn and self.say:
            self.say(
                f"{self.label}{self.drawn} draws gave {len(self.trials)} distinct settings (one trial each): "
                f"{describe_schedule(self.schedule, len(spec.seeds))}"
            )
        alive = list(self.trials)
        for j, (rnd, _) in enumerate(self.schedule):
            self.rung = j
            yield from self._reach(alive, rnd)
            if j + 1 == len(self.schedule):
                break
            ranked = rank(alive, spec)
            keep = self.schedule[j + 1][1]
            for t in ranked[keep:]:
                t.stopped = True
            alive = sorted(ranked[:keep], key=lambda t: t.index)
            if self.say:
                best = ranked[0]
                self.say(
                    f"{self.label}rung {j + 1} of {len(self.schedule)} (round {rnd}): the best {keep} of "
                    f"{len(ranked)} go on to round {self.schedule[j + 1][0]}, {len(ranked) - keep} stopped; best "
                    f"{best.describe()} ({spec.metric} {best.value:.4f})"
                )
        finalists = [t for t in rank(alive, spec) if not math.isnan(t.value)]
        if not finalists:
            raise TuneError(
                f"{self.label}every trial that ran the whole budget ended without a {spec.metric} "
                f"(diverged: {', '.join(t.describe() for t in alive)}); see their runs in {self.cell.output}/runs/"
            )
        outcome = Outcome(list(self.trials), finalists[0], list(self.schedule), self.trial_rounds())
        if self.say:
            c = outcome.chosen
            full = len(self.trials) * budget * len(spec.seeds)
            self.say(
                f"{self.label}chosen: {c.describe()} ({spec.metric} {c.value:.4f}, {spec.at_text}, of {len(self.trials)} "
                f"trials, {sum(t.stopped for t in self.trials)} stopped early; {outcome.trial_rounds} of {full} trial-rounds)"
            )
        return outcome

    def trial_rounds(self) -> int:
        """The rounds the search's runs ran: each run up to where it was asked to go (a run that
        diverged, up to its last finite round)."""
        spent = 0
        for t in self.trials:
            for cfg in t.configs:
                rec = self.record(cfg)
                spent += min(t.rounds, rec.rounds_done) if rec.diverged_at is not None else t.rounds
        return spent

    def best_so_far(self) -> Trial | None:
        """The best trial at the last rung every trial reached (None before the first)."""
        measured = [t for t in self.trials if t.curve and not math.isnan(t.value)]
        return rank(measured, self.spec)[0] if measured else None

    # --- what a progress table shows -------------------------------------------------------------------
    def progress(self, live: dict[str, int]) -> tuple[int, int]:
        """Trial-rounds done (``live``: run id -> the round it reported last, for runs in flight) and
        planned by the schedule (at the trials drawn so far; optuna's by the draws it will make)."""
        schedule = self.schedule or rungs(self.spec, self.spec.total, self.cell.rounds, self.cell.eval_every)
        seeds = len(self.spec.seeds)
        planned = schedule_rounds(schedule, seeds)
        done = 0
        for t in self.trials:
            for cfg in t.configs:
                rec = self.record(cfg)
                there = self.cell.rounds if rec.status == "finished" else rec.rounds_done
                done += min(t.rounds, max(there, live.get(cfg.run_id(), 0)))
        return done, planned

    def describe_now(self) -> str:
        """``rung 1 of 2 (round 3): 16 trials, 0 stopped; best so far lr=0.1439 (val_accuracy 0.9412)``."""
        schedule = self.schedule or rungs(self.spec, self.spec.total, self.cell.rounds, self.cell.eval_every)
        rnd = schedule[min(self.rung, len(schedule) - 1)][0]
        stopped = sum(t.stopped for t in self.trials)
        best = self.best_so_far()
        said = f"; best so far {best.describe()} ({self.spec.metric} {best.value:.4f})" if best else ""
        return (
            f"rung {self.rung + 1} of {len(schedule)} (round {rnd}): {len(self.trials)} trials drawn, "
            f"{stopped} stopped{said}"
        )
