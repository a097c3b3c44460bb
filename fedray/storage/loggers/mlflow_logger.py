"""The MLflow logger (``--logger mlflow``; docs/loggers.md): one MLflow run per fedray run, in the
MLflow experiment named by config key ``experiment``, through an ``MlflowClient`` of its own (never
MLflow's global, fluent API: runs trained together in one process log at once). The tracking URI is
config key ``mlflow_tracking_uri``, by default ``sqlite:///OUTPUT/mlflow.db`` (``mlflow ui
--backend-store-uri sqlite:///OUTPUT/mlflow.db`` shows it). Needs ``pip install 'fedray[mlflow]'``.

Params: the config's keys (``hp.NAME`` for every hyperparameter of the algorithm, defaults
included), as text cut to MLflow's limit; tags: the run's labels, ``fedray_run_id``, ``setting`` (the
setting less the seed), ``job_type`` and ``fedray_attempt`` (what finds the run again after a kill);
the run is named by its setting (`fedray.storage.loggers.base.run_name`). Metrics by round (the
step), timed when the round ended, named as in TensorBoard and W&B (``test/accuracy``,
``test/cluster/3/accuracy``, ``system/seconds``). The end status maps finished / stopped (by a
search) / failed / interrupted to FINISHED / FINISHED / FAILED / KILLED. A run that goes on reopens
the same MLflow run and logs only the steps it does not hold.

The default store ``OUTPUT/mlflow.db`` is made aside and renamed into place (`make_store`): a kill
while MLflow makes its tables leaves none half-made. An existing store fedray cannot log to is
refused in one line that says what to do (`store_problem`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedray.records import Record
from fedray.storage.loggers.base import RunInfo, group, job_type, labels, run_name, series, slash_name

# a run stopped by a search's successive halving ended as asked: FINISHED, as Ray Tune's trials it stops
STATUS = {"finished": "FINISHED", "stopped": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
PARAMS_PER_BATCH = 100  # MLflow's limits on one log_batch call
METRICS_PER_BATCH = 1000


def default_uri(output: str | Path) -> str:
    return f"sqlite:///{(Path(output) / 'mlflow.db').resolve()}"


def clean(name: str) -> str:
    """A name as MLflow takes it: characters it refuses become ``_``, at most 250."""
    return (re.sub(r"[^A-Za-z0-9_.\-/ ]", "_", name).lstrip("./") or "_")[:250]


def metric_name(scope: str, entity: int | None, metric: str) -> str:
    """MLflow's name of a series, as in TensorBoard and W&B: ``test/accuracy``,
    ``test/cluster/3/accuracy`` (`fedray.storage.loggers.base.slash_name`)."""
    return clean(slash_name(scope, entity, metric))


def params(config: dict[str, Any], limit: int, hparams: dict[str, Any] | None = None) -> dict[str, str]:
    """The config as MLflow params: each key's value as text (JSON but for strings), ``hp`` flattened
    into ``hp.NAME`` (every hyperparameter where ``hparams`` has them, defaults included), each cut
    to ``limit`` characters."""
    flat: dict[str, Any] = {}
    for k, v in config.items():
        if k == "hp" and isinstance(v, dict):
            flat.update({f"hp.{hk}": hv for hk, hv in {**v, **(hparams or {})}.items()})
        else:
            flat[k] = v
    out = {}
    for k, v in flat.items():
        text = v if isinstance(v, str) else json.dumps(v, default=str)
        out[clean(str(k))] = text[:limit]
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


def sqlite_path(uri: str) -> Path | None:
    """The file of a ``sqlite:///`` tracking URI (None for any other)."""
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def quiet_store() -> None:
    """No INFO lines of MLflow's store ("Creating initial MLflow database tables") among the run's own."""
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


def store_problem(db: Path) -> str:
    """Why fedray cannot log to the existing SQLite store ``db`` ("" where it can), read only: MLflow's
    own check that every table of its schema is there (where one is missing, MLflow would make the
    tables again over the ones there, and fail). An older schema MLflow refuses itself, saying to run
    ``mlflow db upgrade``; this check leaves that to it (reading MLflow's migrations takes a second)."""
    import sqlalchemy
    from mlflow.store.db import utils

    if db.is_file() and db.stat().st_size == 0:  # nothing there yet: a store is made over it
        return ""
    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    try:
        if not utils._all_tables_exist(engine):
            return "some of MLflow's tables are missing: it was left half-made"
        return ""
    except AttributeError:  # an MLflow without these helpers: its own store says what is wrong
        return ""
    except Exception as e:  # not a database, or a damaged one
        if "locked" in str(e):  # another run writing there at length: MLflow's own client waits
            return ""
        return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    finally:
        engine.dispose()


def make_store(db: Path) -> None:
    """Make the SQLite store ``db`` whole or not at all: MLflow makes its tables in a file beside it,
    which is then renamed into place (a kill while the tables are made leaves no ``db``, only the file
    aside, removed the next time). Called under `one_at_a_time`."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    quiet_store()
    for old in db.parent.glob(f".{db.name}.making-*"):  # a kill's leftovers
        with contextlib.suppress(OSError):
            old.unlink()
    aside = db.with_name(f".{db.name}.making-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    uri = f"sqlite:///{aside}"
    try:
        store = SqlAlchemyStore(uri, (db.parent / "mlflow-artifacts").resolve().as_uri())
        store.engine.dispose()
        getattr(SqlAlchemyStore, "_engine_map", {}).pop(uri, None)  # an engine cached for the file aside
        os.replace(aside, db)
    finally:
        with contextlib.suppress(OSError):
            aside.unlink()


def refuse_store(db: Path, problem: str) -> RuntimeError:
    return RuntimeError(
        f"MLflow store {db} cannot be used ({problem}): move it aside (mv {db} {db}.old) and the "
        f"next run makes a new one, or migrate it (mlflow db upgrade sqlite:///{db}); "
        "the run's Parquet results are whole"
    )


class MLflowLogger:
    """A run's params, tags and metrics as one MLflow run."""

    def __init__(self) -> None:
        self._client: Any = None
        self.uri = ""
        self.run_id = ""
        self.experiment_id = ""
        self.attempt = ""  # the tag fedray_attempt of this fresh start's MLflow run: found by it after a kill
        self.keep: Any = None  # set by `Loggers`: writes `saved()` to the run's logger file at once
        self._has: dict[str, int] = {}  # the last step MLflow holds of each metric (a run gone on)

    def start(self, info: RunInfo) -> None:
        from mlflow.tracking import MlflowClient

        quiet_store()
        self.uri = str(info.options.get("mlflow_tracking_uri") or "") or default_uri(info.output)
        previous = info.previous  # given only where the run goes on (`Loggers`)
        with one_at_a_time(self.uri):
            db = sqlite_path(self.uri)
            if db is not None:
                empty = not db.exists() or db.stat().st_size == 0  # no store yet, or a file with nothing
                if empty and self.uri == default_uri(info.output):
                    make_store(db)
                elif db.exists() and (problem := store_problem(db)):
                    raise refuse_store(db, problem)
            self._client = MlflowClient(tracking_uri=self.uri)
            if previous and self._reopen(previous, info):
                return
            self.experiment_id = self._experiment(info)
            self.attempt = uuid.uuid4().hex
            if callable(self.keep):  # the attempt's tag is in the logger file before the run is made
                self.keep()
            tags = {
                **labels(info.config),
                "fedray_run_id": info.run_id,
                "fedray_attempt": self.attempt,
                "setting": group(info.config, info.run_id),
                "job_type": job_type(info.config),
            }
            if info.parent:  # one run of a sweep or a search: nested under the run that stands for it
                tags["mlflow.parentRunId"] = self._parent(info.parent)
            name = run_name(info.config, info.run_id, info.label)
            start_ms = int(info.started * 1000) if info.started else None  # the run's start, not the logger's
            run = self._client.create_run(self.experiment_id, start_time=start_ms, tags=tags, run_name=name)
            self.run_id = run.info.run_id
        self._log_params(info)

    def _parent(self, parent: str) -> str:
        """The MLflow run that stands for the sweep or search ``parent`` in this experiment (tag
        fedray_parent), made the first time one of its runs starts (under `one_at_a_time` where the
        store is a SQLite file: one such run however many processes start at once). It holds no
        values: it is where the MLflow UI folds the sweep's or search's runs."""
        quoted = parent.replace("\\", "\\\\").replace("'", "\\'")
        found = self._client.search_runs(
            [self.experiment_id], filter_string=f"tags.fedray_parent = '{quoted}'", max_results=1
        )
        if found:
            return found[0].info.run_id
        made = self._client.create_run(self.experiment_id, tags={"fedray_parent": parent}, run_name=parent)
        self._client.set_terminated(made.info.run_id, "FINISHED")
        return made.info.run_id

    def _reopen(self, previous: dict[str, Any], info: RunInfo) -> bool:
        """Go on with the MLflow run ``previous`` names (at this tracking URI, not deleted): by its
        run id, or, where the process was killed before that was kept, by its tag fedray_attempt.
        The steps it holds of each metric are asked for: rounds there already are not logged again."""
        from mlflow.exceptions import MlflowException

        if previous.get("tracking_uri") != self.uri:
            return False
        run = None
        if previous.get("run_id"):
            try:
                run = self._client.get_run(previous["run_id"])
            except MlflowException as e:
                if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
        elif previous.get("attempt"):
            found = self._client.get_experiment_by_name(info.experiment or "fedray")
            if found is not None:
                runs = self._client.search_runs(
                    [found.experiment_id], f"tags.fedray_attempt = '{previous['attempt']}'", max_results=1
                )
                run = runs[0] if runs else None
        if run is None or run.info.lifecycle_stage == "deleted":
            return False
        self.run_id, self.experiment_id = run.info.run_id, run.info.experiment_id
        self.attempt = str(previous.get("attempt") or run.data.tags.get("fedray_attempt", ""))
        self._has = {
            name: max((m.step for m in self._client.get_metric_history(self.run_id, name)), default=0)
            for name in run.data.metrics
        }
        if not previous.get("run_id"):  # made, but killed before its params were logged
            self._log_params(info)
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

    def _log_params(self, info: RunInfo) -> None:
        from mlflow.entities import Param

        try:
            from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH as limit
        except ImportError:
            limit = 500  # MLflow's limit before 2.x raised it
        items = [Param(k, v) for k, v in params(info.config, limit, info.hparams).items()]
        for i in range(0, len(items), PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=items[i : i + PARAMS_PER_BATCH])

    def log_round(self, rnd: int, records: list[Record], ended: float | None = None) -> None:
        """Round ``rnd``'s values at step ``rnd``, timed ``ended`` (when the round ended; now where
        None); a value whose metric MLflow holds at this step or later is not logged again."""
        from mlflow.entities import Metric

        stamp = int((time.time() if ended is None else ended) * 1000)
        items = []
        for s, e, m, v in series(records):
            name = metric_name(s, e, m)
            if self._has.get(name, 0) < rnd:
                items.append(Metric(name, v, stamp, rnd))
        for i in range(0, len(items), METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=items[i : i + METRICS_PER_BATCH])

    def end(self, status: str) -> None:
        if self.run_id:
            self._client.set_terminated(self.run_id, STATUS.get(status, "FAILED"))

    def saved(self) -> dict[str, Any]:
        if not self.run_id:  # before the run is made: what finds it, if the process is killed then
            return {"tracking_uri": self.uri, "attempt": self.attempt} if self.attempt else {}
        out = {"run_id": self.run_id, "tracking_uri": self.uri, "experiment_id": self.experiment_id}
        return {**out, "attempt": self.attempt} if self.attempt else out
