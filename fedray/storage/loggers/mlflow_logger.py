"""The MLflow logger (``--logger mlflow``; docs/loggers.md): one MLflow run per fedray run, in the
MLflow experiment named by config key ``experiment``, through an ``MlflowClient`` of its own (never
MLflow's global, fluent API: runs trained together in one process log at once). The tracking URI is
config key ``mlflow_tracking_uri``, by default ``sqlite:///OUTPUT/mlflow.db`` (``mlflow ui
--backend-store-uri sqlite:///OUTPUT/mlflow.db`` shows it). Needs ``pip install 'fedray[mlflow]'``.

Params: the config's keys (``hp.NAME`` for the algorithm's), as text cut to MLflow's limit; tags: the
run's labels and ``fedray_run_id``; metrics by round (the step): ``accuracy`` for the global scope,
``cluster.3.accuracy`` and the like for the others. The end status maps finished / stopped (by a
search) / failed / interrupted to FINISHED / FINISHED / FAILED / KILLED. A run that goes on reopens the same MLflow run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedray.records import Record
from fedray.storage.loggers.base import RunInfo, labels, series

# a run stopped by a search's successive halving ended as asked: FINISHED, as Ray Tune's trials it stops
STATUS = {"finished": "FINISHED", "stopped": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
PARAMS_PER_BATCH = 100  # MLflow's limits on one log_batch call
METRICS_PER_BATCH = 1000


def default_uri(output: str | Path) -> str:
    return f"sqlite:///{(Path(output) / 'mlflow.db').resolve()}"


def metric_name(scope: str, entity: int | None, metric: str) -> str:
    """MLflow's name of a series: ``accuracy`` (global), ``cluster.3.accuracy``; characters MLflow
    refuses in a name become ``_``."""
    name = metric if entity is None else f"{scope}.{entity}.{metric}"
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", name).lstrip(".") or "_"
    return name[:250]


def params(config: dict[str, Any], limit: int) -> dict[str, str]:
    """The config as MLflow params: each key's value as text (JSON but for strings), ``hp`` flattened
    into ``hp.NAME``, each cut to ``limit`` characters."""
    flat: dict[str, Any] = {}
    for k, v in config.items():
        if k == "hp" and isinstance(v, dict):
            flat.update({f"hp.{hk}": hv for hk, hv in v.items()})
        else:
            flat[k] = v
    out = {}
    for k, v in flat.items():
        text = v if isinstance(v, str) else json.dumps(v, default=str)
        out[metric_name("global", None, str(k))] = text[:limit]
    return out


@contextlib.contextmanager
def one_at_a_time(uri: str) -> Iterator[None]:
    """Where ``uri`` is a SQLite file, one process or thread at a time (a lock file beside it): the
    first run to open a new file makes its tables, and two doing that at once collide."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    db = Path(uri[len("sqlite:///") :])
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(f".{db.name}.lock"), "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class MLflowLogger:
    """A run's params, tags and metrics as one MLflow run."""

    def __init__(self) -> None:
        self._client: Any = None
        self.uri = ""
        self.run_id = ""
        self.experiment_id = ""

    def start(self, info: RunInfo) -> None:
        from mlflow.tracking import MlflowClient

        for name in ("mlflow", "alembic"):  # its store's INFO lines ("Creating initial MLflow database
            logging.getLogger(name).setLevel(logging.WARNING)  # tables") between the run's own
        self.uri = str(info.options.get("mlflow_tracking_uri") or "") or default_uri(info.output)
        with one_at_a_time(self.uri):
            self._client = MlflowClient(tracking_uri=self.uri)
            if info.resumed_from > 0 and self._reopen(info.previous):
                return
            self.experiment_id = self._experiment(info)
            tags = {**labels(info.config), "fedray_run_id": info.run_id}
            run = self._client.create_run(self.experiment_id, tags=tags, run_name=info.run_id)
            self.run_id = run.info.run_id
        self._log_params(info.config)

    def _reopen(self, previous: dict[str, Any]) -> bool:
        """Go on with the MLflow run ``previous`` names (at this tracking URI, not deleted)."""
        from mlflow.exceptions import MlflowException

        if not previous.get("run_id") or previous.get("tracking_uri") != self.uri:
            return False
        try:
            run = self._client.get_run(previous["run_id"])
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise
        if run.info.lifecycle_stage == "deleted":
            return False
        self.run_id, self.experiment_id = run.info.run_id, run.info.experiment_id
        self._client.update_run(self.run_id, status="RUNNING")
        return True

    def _experiment(self, info: RunInfo) -> str:
        from mlflow.exceptions import MlflowException

        name = info.experiment or "fedray"
        found = self._client.get_experiment_by_name(name)
        if found is None:
            location = None
            if self.uri == default_uri(info.output):  # not the process's working folder
                location = (Path(info.output).resolve() / "mlflow-artifacts").as_uri()
            try:
                return self._client.create_experiment(name, artifact_location=location)
            except MlflowException:  # made meanwhile by another process
                found = self._client.get_experiment_by_name(name)
                if found is None:
                    raise
        if found.lifecycle_stage == "deleted":
            raise RuntimeError(
                f"MLflow experiment {name!r} at {self.uri} is deleted: restore it there "
                "(mlflow experiments restore), or name another experiment (config key experiment)"
            )
        return found.experiment_id

    def _log_params(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        try:
            from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH as limit
        except ImportError:
            limit = 500  # MLflow's limit before 2.x raised it
        items = [Param(k, v) for k, v in params(config, limit).items()]
        for i in range(0, len(items), PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=items[i : i + PARAMS_PER_BATCH])

    def log_round(self, rnd: int, records: list[Record]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(metric_name(s, e, m), v, now, rnd) for s, e, m, v in series(records)]
        for i in range(0, len(items), METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=items[i : i + METRICS_PER_BATCH])

    def end(self, status: str) -> None:
        if self.run_id:
            self._client.set_terminated(self.run_id, STATUS.get(status, "FAILED"))

    def saved(self) -> dict[str, Any]:
        if not self.run_id:
            return {}
        return {"run_id": self.run_id, "tracking_uri": self.uri, "experiment_id": self.experiment_id}
