"""A search on Ray Tune (docs/tuning.md): each trial a fedray run (a run a seed of ``tune.seeds``) at
the values Tune samples, evaluating on validation, reporting every evaluated round to Tune so ASHA
stops the weak trials early; its rows, checkpoints and run id are a run's like any other, in the
results folder.

A trial's runs go in the trial's own process (fedray's in-process federation): it starts no
actor of its own, so it never waits on its placement group for room its trial did not reserve (Ray
Tune's trap for trials that start actors: ray-project/ray#25239); the trial reserves the CPUs (and
GPU share) of one of the run's actors. Trials run side by side as the cluster's resources allow.
Tune's state is kept in ``OUT/tune/CELL`` (CELL: the hash of the searched config and its search):
the same command after a Ctrl-C or a kill restores it, keeping the finished trials and resuming the unfinished ones,
whose runs go on from their checkpoints.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ray import tune

from fedray.config.keys import Config
from fedray.sweeps.tuning import Dist, TuneError, TuneSpec, cell_key, trial_mapping

Say = Callable[[str], None] | None


def _space(dist: Dist) -> Any:
    lo_hi = dist.args
    return {
        "loguniform": lambda: tune.loguniform(*lo_hi),
        "uniform": lambda: tune.uniform(*lo_hi),
        "randint": lambda: tune.randint(*lo_hi),
        "choice": lambda: tune.choice(list(lo_hi)),
        "grid": lambda: tune.grid_search(list(lo_hi)),
    }[dist.kind]()


def _names(spec: TuneSpec) -> dict[str, str]:
    """Tune's name of each searched key (p0, p1, ...: dotted names are Tune's own separators)."""
    return {f"p{i}": key for i, key in enumerate(spec.search)}


def trial_values(config: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    return {names[k]: v for k, v in config.items() if k in names}


def _trial(
    config: dict[str, Any], *, base: dict[str, Any], names: dict[str, str], spec: TuneSpec, restart: bool
) -> None:
    """Tune's trainable: the trial's runs (a seed each) in this process, side by side round by
    round, the mean of their metric reported at every round they all evaluated."""
    import torch

    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import Finished, RoundDone, execute
    from fedray.experiment.validation import from_dict

    cell = from_dict(base)
    torch.set_num_threads(max(1, int(cell.num_cpus_per_actor)))
    values = trial_values(config, names)
    cfgs = [from_dict(trial_mapping(cell, values, s)) for s in spec.seeds]
    runs = [execute(c, make_local_federation, restart) for c in cfgs]
    seen: dict[int, list[float]] = {}
    try:
        live = list(range(len(runs)))
        while live:
            for i in list(live):
                ev = next(runs[i], None)
                while ev is not None and not isinstance(ev, (RoundDone, Finished)):
                    ev = next(runs[i], None)
                if ev is None or isinstance(ev, Finished):
                    if isinstance(ev, Finished) and ev.already:  # finished before: its rows say
                        for rnd, value in _recorded(cfgs[i], spec.metric):
                            seen.setdefault(rnd, []).append(value)
                    for _ in runs[i]:  # to its end (closed at Finished, it would say interrupted)
                        pass
                    live.remove(i)
                    continue
                if ev.round == ev.rounds:  # its last: to its end before Tune hears it (and stops it)
                    for _ in runs[i]:
                        pass
                    live.remove(i)
                if spec.metric in ev.metrics:
                    seen.setdefault(ev.round, []).append(ev.metrics[spec.metric])
                elif any(k.startswith("val_") for k in ev.metrics):
                    recorded = sorted(k for k in ev.metrics if k.startswith("val_"))
                    raise TuneError(
                        f"tune.metric: {cell.algorithm} records no {spec.metric} (it records {', '.join(recorded)})"
                    )
            for rnd in sorted(r for r, v in seen.items() if len(v) == len(runs)):
                tune.report({spec.metric: sum(seen[rnd]) / len(runs), "round": rnd})
                del seen[rnd]
    finally:
        for run in runs:
            run.close()  # a trial stopped early: its runs recorded as interrupted, checkpoints kept


def _recorded(cfg: Config, metric: str) -> list[tuple[int, float]]:
    """A finished run's values of ``metric`` by round, from its rows."""
    from fedray.storage.results import run_metric

    return run_metric(cfg.output, cfg.run_id(), metric)


def _absolute(cfg: Config) -> Config:
    """The config with its paths absolute: a trial runs in a worker whose working folder is Tune's."""
    from dataclasses import replace

    def absolute(p: str) -> str:
        return str(Path(p).resolve()) if p and not Path(p).is_absolute() and Path(p).exists() else p

    return replace(
        cfg,
        output=str(Path(cfg.output).resolve()),
        data_root=absolute(cfg.data_root),
        partition_file=absolute(cfg.partition_file),
        init_model=absolute(cfg.init_model),
    )


class TrialLines(tune.Callback):
    """A line for each trial as it ends (finished, stopped early, failed). Kept with Tune's state
    (pickled), so a restored search says its lines too."""

    def __init__(self, say: Say, spec: TuneSpec, names: dict[str, str], rounds: int, label: str) -> None:
        self.say, self.spec, self.names, self.rounds, self.label = say, spec, names, rounds, label

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._said(trial, trials, False)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._said(trial, trials, True)

    def _said(self, trial: Any, trials: list, failed: bool) -> None:
        if not self.say:
            return
        done = sum(t.status in ("TERMINATED", "ERROR") or t is trial for t in trials)
        values = ", ".join(f"{k}={_short(v)}" for k, v in trial_values(trial.config, self.names).items())
        last = trial.last_result or {}
        rnd, value = last.get("round"), last.get(self.spec.metric)
        if failed:
            what = "failed"
        elif value is None:
            what = "reported nothing"
        else:
            stopped = " (stopped early)" if rnd is not None and rnd < self.rounds else ""
            what = f"{self.spec.metric} {value:.4f} at round {rnd}{stopped}"
        self.say(f"{self.label}trial {done}/{self.spec.total} {values}: {what}")


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def search(
    cell: Config, spec: TuneSpec, *, restart: bool = False, say: Say = None, label: str = ""
) -> list[tuple[dict[str, Any], list[str]]]:
    """Run the search of one cell on the connected Ray (Tune restores an interrupted one kept in
    ``OUT/tune/CELL``; ``restart`` starts it over, its trials' runs too). Returns every trial's
    values and run ids (a seed each), in Tune's order."""
    from functools import partial

    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from fedray.experiment.validation import from_dict

    # Tune's own console tables: the lines are TrialLines'; its note that TensorBoard's writer is
    # not installed: the trials' record is their runs' rows
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    logging.getLogger("ray.tune.utils.callback").setLevel(logging.ERROR)
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    logging.getLogger("ray.tune.tune").setLevel(
        logging.ERROR
    )  # its "Tuner.restore(...)" advice: the same command is ours
    cell = _absolute(cell)
    names = _names(spec)
    space = {p: _space(spec.search[key]) for p, key in names.items()}
    storage = Path(cell.output) / "tune"
    name = cell_key(cell, spec)
    if restart and (storage / name).exists():
        shutil.rmtree(storage / name)
    resources = {"cpu": cell.num_cpus_per_actor}
    if isinstance(cell.num_gpus_per_actor, (int, float)) and cell.num_gpus_per_actor > 0:
        resources["gpu"] = cell.num_gpus_per_actor
    trainable = tune.with_resources(
        partial(_trial, base=cell.to_dict(), names=names, spec=spec, restart=restart), resources
    )
    if tune.Tuner.can_restore(str(storage / name)):
        tuner = tune.Tuner.restore(
            str(storage / name), trainable, resume_unfinished=True, resume_errored=True
        )
    else:
        scheduler = None
        if spec.scheduler == "asha":
            scheduler = ASHAScheduler(
                time_attr="round",
                max_t=cell.rounds,
                grace_period=min(spec.grace_rounds, cell.rounds),
                reduction_factor=spec.reduction_factor,
            )
        if spec.search_alg == "optuna":
            import optuna
            from ray.tune.search.optuna import OptunaSearch

            optuna.logging.set_verbosity(optuna.logging.WARNING)  # its "study created" line
            searcher: Any = OptunaSearch(seed=spec.seed)
            if spec.max_concurrent_trials:
                searcher = ConcurrencyLimiter(searcher, spec.max_concurrent_trials)
        else:
            searcher = BasicVariantGenerator(
                random_state=spec.seed, max_concurrent=spec.max_concurrent_trials
            )
        tuner = tune.Tuner(
            trainable,
            param_space=space,
            tune_config=tune.TuneConfig(
                metric=spec.metric,
                mode=spec.mode,
                scheduler=scheduler,
                search_alg=searcher,
                num_samples=spec.trials,
            ),
            run_config=tune.RunConfig(
                name=name,
                storage_path=str(storage),
                verbose=0,
                callbacks=[TrialLines(say, spec, names, cell.rounds, label)],
                failure_config=tune.FailureConfig(max_failures=0),
            ),
        )
    grid = tuner.fit()
    # Tune catches a Ctrl-C itself and returns, its state saved with the unfinished trials pending
    saved = tune.ExperimentAnalysis(str(storage / name)).trials
    if unfinished := [t for t in saved if t.status not in ("TERMINATED", "ERROR")]:
        raise KeyboardInterrupt(f"{len(unfinished)} of {len(saved)} trials unfinished")
    failed = [r for r in grid if r.error is not None]
    if failed:
        first = failed[0]
        values = trial_values(first.config, names)
        raise TuneError(
            f"{len(failed)} of {len(grid)} trials failed; the first, at "
            f"{', '.join(f'{k}={_short(v)}' for k, v in values.items())}: {_cause(first.error)}"
        )
    trials = []
    for r in grid:
        values = trial_values(r.config, names)
        trials.append((values, [from_dict(trial_mapping(cell, values, s)).run_id() for s in spec.seeds]))
    return trials


def _cause(error: BaseException) -> str:
    """The trial's own exception, as one line (Tune wraps it)."""
    cause = getattr(error, "cause", None) or error.__cause__ or error
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}"


def run_cells(
    cells: Sequence[tuple[str, Config]],
    spec: TuneSpec,
    *,
    restart: bool = False,
    say: Say = None,
) -> list[dict[str, Any]]:
    """Every cell's search on the connected Ray, each cell's choice from its trials' rows written to
    ``OUT/tuned.yaml`` as it is made. Returns the cells' documents
    (`fedray.sweeps.tuning.tuned_document`)."""
    import pandas as pd

    from fedray.storage.results import run_metric
    from fedray.sweeps.tuning import choose, read_trials, tuned_document, write_tuned

    docs: list[dict[str, Any]] = []
    for i, (label, cell) in enumerate(cells):
        prefix = f"[{i + 1}/{len(cells)} {label}] " if len(cells) > 1 else ""
        trials = search(cell, spec, restart=restart, say=say, label=prefix)
        rows = pd.DataFrame(
            [
                {"run_id": run, "round": rnd, "metric": spec.metric, "scope": "global", "value": value}
                for _, runs in trials
                for run in runs
                for rnd, value in run_metric(cell.output, run, spec.metric)
            ],
            columns=["run_id", "round", "metric", "scope", "value"],
        )
        read = read_trials(rows, trials, spec, cell.rounds)
        chosen = choose(read, spec)
        docs.append(tuned_document(label, cell, spec, chosen, read))
        write_tuned(cell.output, docs)
        if say:
            values = ", ".join(f"{k}={_short(v)}" for k, v in chosen.values.items())
            value = "nan" if math.isnan(chosen.value) else f"{chosen.value:.4f}"
            say(f"{prefix}chosen: {values} ({spec.metric} {value}, {spec.at}, of {len(read)} trials)")
    return docs
