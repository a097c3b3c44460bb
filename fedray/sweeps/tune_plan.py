"""What `fedray tune FILE` does, decided before anything runs (docs/tuning.md).

FILE is a config or a sweep file with a ``tune:`` block (`fedray.sweeps.tuning`). Its cells are the
config itself, or each combination of the sweep's axes but its seeds: every cell is searched on
validation (its trials at ``tune.seeds``). A sweep file's ``seeds:`` then run at each cell's chosen
values on test, as a sweep (``OUT/tune/tuned-sweep.yaml``, written once the choices are made): the
tuned table, whose every cell was tuned the same way and on validation alone.
"""

from __future__ import annotations

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
    from fedray.experiment.validation import load_config
    from fedray.storage.results import check_writable
    from fedray.sweeps.sweep_file import load_sweep

    source = str(path)
    rest, block = split_block(read_yaml(path))
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
            check_base(cfg, spec)
        except TuneError as e:
            raise TuneError(f"{source}{f' ({label})' if label else ''}: {e}") from None
    check_writable(cells[0][1].output)
    return TunePlan(source, spec, cells, _seeds(seeds, source), concurrent)


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
    from fedray.storage.files import write_text_atomic

    path = Path(plan.output) / "tune" / "tuned-config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    head = f"# {plan.source} at the values its search chose on validation (tuned.yaml). Written by fedray tune.\n"
    write_text_atomic(head + yaml.safe_dump(tuned_configs(plan, docs)[0], sort_keys=False), path)
    return path


def tuned_sweep(plan: TunePlan, docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The sweep of the tuned table: each cell at its chosen values, on test, at the file's seeds."""
    cases = [{k: v for k, v in c.items() if k != "seed"} for c in tuned_configs(plan, docs)]
    # what every cell shares at the top, so a run's label is what sets its cell apart
    shared = {k: v for k, v in cases[0].items() if all(k in c and c[k] == v for c in cases[1:])}
    cells = [{k: v for k, v in c.items() if k not in shared} for c in cases]
    return {**shared, "cases": cells, "seeds": plan.seeds, "max_concurrent_runs": plan.max_concurrent_runs}


def write_tuned_sweep(plan: TunePlan, docs: Sequence[Mapping[str, Any]]) -> Path:
    from fedray.storage.files import write_text_atomic

    path = Path(plan.output) / "tune" / "tuned-sweep.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    head = (
        f"# The tuned table of {plan.source}: each cell at the values its search chose on validation "
        "(tuned.yaml), run on test at the file's seeds. Written by fedray tune.\n"
    )
    write_text_atomic(head + yaml.safe_dump(tuned_sweep(plan, docs), sort_keys=False), path)
    return path
