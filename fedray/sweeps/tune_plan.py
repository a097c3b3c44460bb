"""What `fedray tune FILE` does, decided before anything runs (docs/tuning.md).

FILE is a config or a sweep file with a ``tune:`` block (`fedray.sweeps.tuning`). Its cells are the
config itself, or each combination of the sweep's axes but its seeds: every cell is searched on
validation (its trials at ``tune.seeds``). A sweep file's ``seeds:`` then run at each cell's chosen
values on test, as a sweep (``OUT/tune/tuned-sweep.yaml``, written once the choices are made): the
tuned table, whose every cell was tuned the same way and on validation alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedray.config.keys import Config, read_yaml
from fedray.sweeps.tuning import TuneError, TuneSpec, check_base, read_spec, seed_list, split_block

SEED_AXES = ("seeds",)


@dataclass
class TunePlan:
    source: str
    spec: TuneSpec
    cells: list[tuple[str, Config]]  # (label, the cell's config at its file's seed), in the file's order
    seeds: list[int]  # the sweep's seeds, run at the chosen values on test (none for a config file)
    max_concurrent_runs: int = 0

    @property
    def output(self) -> str:
        return self.cells[0][1].output


def open_plan(
    path: str | Path,
    sets: Iterable[str] = (),
    output: str | None = None,
    plugins: Iterable[str] = (),
) -> TunePlan:
    """Read FILE's ``tune:`` block and its cells; check the block, each cell's config and the
    values its space reaches. Every problem is one `ConfigError` (`TuneError`, `SweepError`)."""
    from fedray.experiment.checks import load_config
    from fedray.storage.results import check_writable
    from fedray.sweeps.sweep_file import load_sweep

    source = str(path)
    rest, block = split_block(read_yaml(path))
    sets, tune_sets = _split_sets(sets)
    if tune_sets:
        block = _with_sets(block, tune_sets)
    if block is None:
        raise TuneError(
            f"{source}: no tune: block to search (docs/tuning.md): `fedray run` or `fedray sweep` runs it"
        )
    seeds = rest.pop("seeds", None)
    if any(k in rest for k in ("grid", "cases")):
        sweep = load_sweep(path, sets, output, (), plugins, raw=rest)
        cells = [(_cell_label(r.label), r.config) for r in sweep.runs]
        concurrent = sweep.max_concurrent_runs
    else:
        cells, concurrent = [("", load_config(path, sets, plugins, raw=rest, output=output))], 0
    spec = read_spec(block, sorted({c.algorithm for _, c in cells}))
    for label, cfg in cells:
        try:
            check_base(cfg, spec.for_algorithm(cfg.algorithm))
        except TuneError as e:
            raise TuneError(f"{source}{f' ({label})' if label else ''}: {e}") from None
    _check_distinct(cells, spec, source)
    check_writable(cells[0][1].output)
    return TunePlan(source, spec, cells, _seeds(seeds, source), concurrent)


def _check_distinct(cells: Sequence[tuple[str, Config]], spec: TuneSpec, source: str) -> None:
    """Cells that differ only in what their search sets (a sweep axis that is also a searched key)
    would run the same trials: refused, naming the keys."""
    from fedray.config.keys import flatten

    seen: dict[str, tuple[str, dict[str, Any]]] = {}
    for label, cfg in cells:
        searched = set(spec.for_algorithm(cfg.algorithm).search) | {"seed", "evaluate_on", "experiment"}
        flat = {k: v for k, v in flatten(cfg.to_dict()).items() if k not in searched}
        ident = json.dumps(flat, sort_keys=True, default=str)
        if ident in seen:
            other, theirs = seen[ident]
            keys = sorted(
                k
                for k in set(flatten(cfg.to_dict())) | set(theirs)
                if flatten(cfg.to_dict()).get(k) != theirs.get(k)
            )
            raise TuneError(
                f"{source}: cells {other} and {label} differ only in {', '.join(keys)}, which the search sets: their "
                "trials would be the same runs; drop the axis, or the key from tune.search"
            )
        seen[ident] = (label, flatten(cfg.to_dict()))


def _split_sets(sets: Iterable[str]) -> tuple[list[str], list[str]]:
    """The ``--set``s of config keys, and those of the ``tune:`` block (``tune.KEY=...``)."""
    config, tune = [], []
    for item in sets:
        key = item.split("=", 1)[0].strip()
        (tune if key == "tune" or key.startswith("tune.") else config).append(item)
    return config, tune


def _with_sets(block: Any, sets: Sequence[str]) -> dict[str, Any]:
    """The ``tune:`` block with ``--set tune.KEY=VALUE`` applied, each value read as YAML
    (``--set tune.trials=4``, ``--set tune.scheduler=none``, ``--set 'tune.search.lr={loguniform: [0.01, 0.5]}'``)."""
    import copy

    from fedray.config.coercion import ConfigError
    from fedray.config.keys import load_yaml, set_dotted

    tree = {"tune": copy.deepcopy(block) if block is not None else {}}
    for item in sets:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value")
        key, raw = (p.strip() for p in item.split("=", 1))
        if key == "tune" or not isinstance(tree["tune"], dict):
            raise ConfigError(
                f"--set {key}: set a key of the tune: block (tune.trials=4, tune.search.lr=...)"
            )
        value = load_yaml(raw, f"--set {key}: value {raw!r}") if raw else ""
        set_dotted(tree, key, value, f"--set {key}")
    return tree["tune"]


def describe_plan(plan: TunePlan) -> list[str]:
    """What a search will do, said before it runs (``fedray tune`` and ``fedray.tune`` print it):
    the search, and each kind of cell's trials and schedule."""
    spec = plan.spec
    what = f"{len(plan.cells)} cells" if len(plan.cells) > 1 else "one config"
    draws = (
        f"optuna (TPE, seed {spec.seed}), {spec.batch} trials asked at a time"
        if spec.search_alg == "optuna"
        else f"{spec.search_alg} (seed {spec.seed})"
    )
    lines = [
        f"tune {plan.source}: {what}, searched on validation ({spec.metric}, {spec.mode}, {spec.at_text}; {draws}; "
        f"seeds {list(spec.seeds)}); results in {plan.output}/"
    ]
    kinds: dict[tuple[str, int, int], list[str]] = {}
    for label, cfg in plan.cells:
        kinds.setdefault((cfg.algorithm, cfg.rounds, cfg.eval_every), []).append(label)
    for (algorithm, rounds, eval_every), labels in kinds.items():
        cell = spec.for_algorithm(algorithm)
        who = (
            f"  {algorithm} ({len(labels)} cell{'s' if len(labels) > 1 else ''}): "
            if len(kinds) > 1
            else "  "
        )
        lines.append(who + cell_plan(cell, rounds, eval_every))
    return lines


def cell_plan(spec: TuneSpec, rounds: int, eval_every: int = 1) -> str:
    """``16 trials of lr loguniform[0.001, 1.0]; successive halving: 16 trials to round 3, ...``."""
    from fedray.sweeps.tuning import describe_schedule, rungs

    if not spec.search:
        return "nothing searched: runs on test as it is"
    schedule = rungs(spec, spec.total, rounds, eval_every)
    if spec.scheduler == "none":
        how = f"no early stopping: every trial runs its {rounds} rounds"
    elif len(schedule) == 1:
        how = f"no early stopping ({spec.total} trials are too few to halve at reduction_factor {spec.reduction_factor:g})"
    else:
        how = "successive halving: " + describe_schedule(schedule, len(spec.seeds))
    said = f"{spec.total} trials of {spec.describe()}; {how}"
    if spec.search_alg != "optuna" and all(d.kind in ("choice", "grid") for d in spec.search.values()):
        size = 1
        for d in spec.search.values():
            size *= len(d.args)
        if spec.total > size:
            said += f" ({spec.total} draws of {size} settings: a setting drawn again is one trial, run once)"
    return said


def _cell_label(label: str) -> str:
    return " ".join(p for p in label.split(" ") if not p.startswith("seed="))


def _seeds(seeds: Any, source: str) -> list[int]:
    if seeds is None:
        return []
    if (listed := seed_list(seeds)) is None:
        raise TuneError(f"{source}: seeds: a list of seeds (integers >= 0), got {seeds!r}")
    return listed


def tuned_configs(plan: TunePlan, docs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each cell's config at its chosen values, on test: its keys that differ from the defaults."""
    from fedray.config.keys import set_dotted

    defaults = Config().to_dict()
    out = []
    for (_, cfg), doc in zip(plan.cells, docs, strict=True):
        tree = cfg.to_dict()
        for key, value in doc["chosen"].items():
            set_dotted(tree, key, value, "tuned.yaml")
        out.append({k: v for k, v in tree.items() if v != defaults.get(k)})
    return out


def write_tuned_config(plan: TunePlan, docs: Sequence[Mapping[str, Any]]) -> Path:
    """``OUT/tune/tuned-config.yaml``: a config file's config at the values its search chose (without
    its tune: block), which `fedray run` runs on test."""
    from fedray.sweeps.tuning import write_if_changed

    path = Path(plan.output) / "tune" / "tuned-config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    head = f"# {plan.source} at the values its search chose on validation (tuned.yaml). Written by fedray tune.\n"
    write_if_changed(path, head + yaml.safe_dump(tuned_configs(plan, docs)[0], sort_keys=False))
    return path


def tuned_sweep(plan: TunePlan, docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The sweep of the tuned table: each cell at its chosen values, on test, at the file's seeds."""
    cases = [{k: v for k, v in c.items() if k != "seed"} for c in tuned_configs(plan, docs)]
    # what every cell shares at the top, so a run's label is what sets its cell apart
    shared = {k: v for k, v in cases[0].items() if all(k in c and c[k] == v for c in cases[1:])}
    cells = [{k: v for k, v in c.items() if k not in shared} for c in cases]
    return {**shared, "cases": cells, "seeds": plan.seeds, "max_concurrent_runs": plan.max_concurrent_runs}


def write_tuned_sweep(plan: TunePlan, docs: Sequence[Mapping[str, Any]]) -> Path:
    from fedray.sweeps.tuning import write_if_changed

    path = Path(plan.output) / "tune" / "tuned-sweep.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    head = (
        f"# The tuned table of {plan.source}: each cell at the values its search chose on validation "
        "(tuned.yaml), run on test at the file's seeds. Written by fedray tune.\n"
    )
    write_if_changed(path, head + yaml.safe_dump(tuned_sweep(plan, docs), sort_keys=False))
    return path
