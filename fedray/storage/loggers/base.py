"""What a live logger is given and what every logger shares (docs/loggers.md): `RunInfo` (the run it
logs), the `RunLogger` protocol, the scalar series a round's records hold (`series`), the small
JSON file that keeps each logger's identity for a resume (``OUTPUT/loggers/RUN_ID.json``) and the
rounds of a run already in its results (`recorded_rounds`).

The backends (``tensorboard_logger``, ``mlflow_logger``, ``wandb_logger``) import this module, never
the package's ``__init__`` (which imports them when a logger of their kind is made).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fedray.records import EVALUATED_ON_TEST, GLOBAL_ENTITY, TIMING_METRICS, Record, is_assignment

# Client-scope values are logged for a metric of a round only where that round holds at most this many
# clients' values of it (a cross-device run evaluates thousands: those stay in the Parquet results).
MAX_CLIENT_SERIES = 100


@dataclass(frozen=True)
class RunInfo:
    """The run a logger logs."""

    run_id: str
    experiment: str  # config key `experiment`
    output: str  # the results folder (config key `output`)
    # the run's recorded config (flat; "hp": the algorithm's hyperparameters), less the keys its
    # partition and dataset do not read
    config: dict[str, Any]
    resumed_from: int = 0  # rounds already done (0: a fresh start, --restart and --force included)
    # logger settings from the config: mlflow_tracking_uri ("" = OUTPUT/mlflow.db), wandb_project ("" =
    # the experiment's name)
    options: dict[str, Any] = field(default_factory=dict)
    # what this logger kept the last time (its `saved()`, and ``last_round``) where the run goes on
    # (resumed_from > 0, or continued) and ``OUTPUT/loggers/RUN_ID.json`` names it; {} otherwise
    previous: dict[str, Any] = field(default_factory=dict)
    # every hyperparameter of the algorithm, defaults included (config["hp"] holds only those the
    # config sets); {} where the round loop did not say
    hparams: dict[str, Any] = field(default_factory=dict)
    # where a sweep or a search launched the run (`write_setting`): the values that make it its own
    # there ("lr=0.0412", "partition=labels,partition_k=2 seed=0"), and the sweep or search it is one
    # run of ("sweep digits_sweep.yaml"); "" for a run alone
    label: str = ""
    parent: str = ""
    # the run goes on from an earlier attempt of it, not started over (--restart, --force): its
    # loggers' runs go on too, where they are, even where no checkpoint was made (resumed_from 0;
    # the rounds done again give the same numbers, and a tool's rounds are not logged twice)
    continued: bool = False
    # when this attempt of the run started (seconds since the epoch; 0: not said): a tool's run
    # made for it starts then, not when its logger got round to it
    started: float = 0.0


class RunLogger(Protocol):
    """A live logger: made with no arguments, then driven on a thread of its own (`Loggers`).

    Optional, read where present: ``saved() -> dict`` (JSON-able: what identifies its own run, kept
    for a resume and handed back as ``RunInfo.previous``), ``replaces_rounds = True`` (it is given
    the rounds a resumed run does again and shows the new values in their place, as TensorBoard does;
    otherwise rounds it logged already are not given again), an attribute ``keep`` (set to a function
    that writes ``saved()`` to the run's logger file at once: called in ``start`` before the tool's
    run is made, so a kill then still finds it) and an ``ended`` parameter of ``log_round`` (given the
    time the round ended, seconds since the epoch; None for a round taken from the results).

    ``log_round`` returns once the tool has the round: only then is it counted logged."""

    def start(self, info: RunInfo) -> None: ...

    def log_round(self, rnd: int, records: list[Record]) -> None: ...  # (..., ended=None) optional

    def end(self, status: str) -> None: ...  # "finished" | "stopped" | "failed" | "interrupted"


def series(records: Iterable[Record]) -> list[tuple[str, int | None, str, float]]:
    """The scalar values of a round's records as ``(scope, entity, metric, value)``; entity None for
    the global scope. Assignment rows, non-numbers and non-finite values are left out, and client-scope
    values of a metric where the round holds more than `MAX_CLIENT_SERIES` clients' of it. A value
    named twice in a round counts once (the last)."""
    values: dict[tuple[str, int | None, str], float] = {}
    for r in records:
        if is_assignment(r) or "metric" not in r:
            continue
        try:
            value = float(r["value"])
        except (KeyError, TypeError, ValueError):
            continue
        if not math.isfinite(value):
            continue
        scope = str(r.get("scope", "global"))
        entity = r.get("entity", GLOBAL_ENTITY)
        entity = None if scope == "global" or entity is None or entity == GLOBAL_ENTITY else int(entity)
        values[(scope, entity, str(r["metric"]))] = value
    clients: dict[str, int] = {}
    for scope, _, metric in values:
        if scope == "client":
            clients[metric] = clients.get(metric, 0) + 1
    return [
        (scope, entity, metric, value)
        for (scope, entity, metric), value in values.items()
        if scope != "client" or clients[metric] <= MAX_CLIENT_SERIES
    ]


def namespace(metric: str) -> tuple[str, str]:
    """The section a metric is shown in, and its name there, the same in every tool: ``test`` for what
    an evaluation reads from the test sets (``accuracy``, ``loss``, ...), ``val`` for the same read from
    validation splits (``val_accuracy`` -> ``val``, ``accuracy``), ``train`` for training values
    (``train_loss`` -> ``train``, ``loss``; ``sgd_loss``, update norms), ``system`` for wall times and
    bytes (``seconds``, ``bytes_up``), ``algorithm`` for the rest (participants, clusters, ...)."""
    if metric in EVALUATED_ON_TEST:
        return "test", metric
    if metric.startswith("val_") and metric[4:] in EVALUATED_ON_TEST:
        return "val", metric[4:]
    if metric in TIMING_METRICS or metric.startswith("bytes_"):
        return "system", metric
    if metric.startswith("train_"):
        return "train", metric[len("train_") :]
    if metric.startswith("sgd_") or metric.endswith("_update_norm"):
        return "train", metric
    return "algorithm", metric


def slash_name(scope: str, entity: int | None, metric: str) -> str:
    """A series' name in every tool: ``test/accuracy`` (global scope), ``test/cluster/3/accuracy``,
    ``val/client/12/local_accuracy``, ``system/seconds`` (`namespace` says the section)."""
    section, name = namespace(metric)
    return f"{section}/{name}" if entity is None else f"{section}/{scope}/{entity}/{name}"


def labels(config: Mapping[str, Any]) -> dict[str, str]:
    """The run's labels (the config keys declared to label runs, `fedray.config.keys.LABEL_KEYS`), the partition as the results name it (``dirichlet(0.5)``...)."""
    from fedray.config.keys import LABEL_KEYS

    out = {k: str(config[k]) for k in LABEL_KEYS if config.get(k) is not None}
    try:
        from fedray.data import partition_label

        out["partition"] = partition_label(dict(config))
    except Exception:  # a config a plug-in's data set reads otherwise: its partition key as it is
        pass
    return out


def setting(config: Mapping[str, Any], run_id: str = "") -> str:
    """The run's setting as a name shows it, the seed left out (a W&B group: seeds plot together):
    the algorithm, the partition, the learning rate and the hyperparameters the config sets, e.g.
    ``fedprox dirichlet(0.5) lr=0.05 mu=0.01``."""
    label = labels(config)
    parts = [label.get("algorithm", ""), label.get("partition", "")]
    if config.get("lr") is not None:
        parts.append(f"lr={config['lr']:g}" if isinstance(config["lr"], float) else f"lr={config['lr']}")
    hp = config.get("hp")
    if isinstance(hp, Mapping):
        parts += [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(hp.items())]
    return " ".join(p for p in parts if p) or run_id


def group(config: Mapping[str, Any], run_id: str = "") -> str:
    """The setting less the seed, as one name (a W&B group): `setting` and a short hash of every
    config key that changes numbers but the seed, so two settings that read alike keep apart."""
    import hashlib

    from fedray.config.keys import NOT_IN_RUN_ID

    rest = {k: v for k, v in config.items() if k not in ("seed", "loggers", *NOT_IN_RUN_ID)}
    digest = hashlib.sha256(json.dumps(rest, sort_keys=True, default=str).encode()).hexdigest()[:6]
    return f"{setting(config, run_id)} {digest}"


def run_name(config: Mapping[str, Any], run_id: str, label: str = "") -> str:
    """A run's name in MLflow and W&B: its setting, the seed, and the end of its run id (two runs
    that differ in a key not shown keep apart), e.g. ``fedavg dirichlet(0.5) lr=0.05 s0 5103f0``.
    A run of a sweep or a search (``label``: the values it was launched with) is named by those:
    ``fedavg lr=0.0412 s0 5103f0``."""
    seed = f" s{config['seed']}" if config.get("seed") is not None and "seed=" not in label else ""
    tail = run_id.rsplit("-", 1)[-1][:6]
    if label:
        algorithm = str(config.get("algorithm") or "")
        return f"{algorithm} {label}{seed} {tail}".strip()
    return f"{setting(config, run_id)}{seed} {tail}".strip()


def setting_path(output: str | Path, run_id: str) -> Path:
    """``OUTPUT/loggers/RUN_ID.setting.json``: where a sweep or a search launched the run."""
    return Path(output) / "loggers" / f"{run_id}.setting.json"


def write_setting(output: str | Path, run_id: str, label: str, parent: str) -> None:
    """Say, before a sweep or a search launches a run, what the loggers show it as (`RunInfo.label`,
    `RunInfo.parent`): the run's own process reads it as it starts (`read_setting`), wherever it
    runs that sees the results folder. Rewritten only where it says something else."""
    from fedray.storage.files import write_text_atomic

    path = setting_path(output, run_id)
    text = json.dumps({"label": label, "parent": parent, "run_id": run_id}, sort_keys=True) + "\n"
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(text, path)


def read_setting(output: str | Path, run_id: str) -> dict[str, str]:
    """What `write_setting` said of the run ({} for a run alone, a file that cannot be read, or one
    that names another run, copied here: the loggers then name it by its config)."""
    try:
        got = json.loads(setting_path(output, run_id).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(got, dict) or got.get("run_id") != run_id:
        return {}
    return {k: str(got[k]) for k in ("label", "parent") if isinstance(got.get(k), str)}


def job_type(config: Mapping[str, Any]) -> str:
    """``trial`` for a run evaluated on validation splits (how a search runs its trials), else ``test``."""
    return "trial" if config.get("evaluate_on") == "validation" else "test"


def state_path(output: str | Path, run_id: str) -> Path:
    """``OUTPUT/loggers/RUN_ID.json``: each logger's identity and the last round it logged."""
    return Path(output) / "loggers" / f"{run_id}.json"


def read_state(output: str | Path, run_id: str) -> dict[str, dict[str, Any]]:
    """The loggers' entries of a run's state file, by logger name; {} where there is none."""
    path = state_path(output, run_id)
    if not path.is_file():
        return {}
    loggers = json.loads(path.read_text()).get("loggers", {})
    if not isinstance(loggers, dict):
        raise ValueError(f"{path}: 'loggers' is not a mapping")
    return {str(k): dict(v) for k, v in loggers.items() if isinstance(v, dict)}


def recorded_rounds(output: str | Path, run_id: str, through: int) -> dict[int, list[Record]]:
    """The run's metric rows of rounds 1 .. ``through`` from its results (``OUTPUT/metrics/``), by
    round, as records (`fedray.records.rec`'s keys): what a logger that has not logged them is given
    when the run goes on after them."""
    from fedray.storage.files import read_checked
    from fedray.storage.results import run_parts

    out: dict[int, list[Record]] = {}
    columns = ["round", "stage", "scope", "entity", "metric", "value"]
    for path in run_parts(output, run_id, "metrics"):
        t = read_checked(path, columns).to_pydict()
        for rnd, stage, scope, entity, metric, value in zip(*(t[c] for c in columns), strict=True):
            if rnd is not None and 1 <= rnd <= through:
                out.setdefault(int(rnd), []).append(
                    {"metric": metric, "value": value, "scope": scope, "entity": entity, "stage": stage or ""}
                )
    return dict(sorted(out.items()))
