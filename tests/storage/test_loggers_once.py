"""Live loggers through kills (docs/loggers.md, "Runs that stop and go on"): every round in each tool
exactly once after a kill -9 at any point and a resume, read back with each tool's own reader; the
default MLflow store made whole or not at all, and a store fedray cannot use said in one line; the
time each value carries; TensorBoard's writer thread failing quietly."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedray.storage.loggers import Loggers, logger_places
from fedray.storage.writer import ResultsWriter
from tests.storage.test_loggers import (
    SERIES,
    _config,
    _info,
    _records,
    _tag,
    _tensorboard,
    _wandb_records,
    _wandb_run,
    wandb_offline,  # noqa: F401 (a fixture)
)

ROOT = Path(__file__).resolve().parents[2]
THREE = ["tensorboard", "mlflow", "wandb"]

# a run's loggers in a process of their own, killed (SIGKILL, nothing closed or flushed) once every
# logger's file says round KILL_AFTER is logged
KILLED = """
import json, os, sys, time
from pathlib import Path
from fedray.storage.loggers import Loggers, RunInfo
from tests.storage.test_loggers import _records
out, run, kill_after, config = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
info = RunInfo(run, "loggers-test", out, config, 0, {"mlflow_tracking_uri": "", "wandb_project": ""})
logs = Loggers(["tensorboard", "mlflow", "wandb"], info)
for rnd in range(1, kill_after + 1):
    logs.log_round(rnd, _records(rnd))
state = Path(out) / "loggers" / f"{run}.json"
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        entries = json.loads(state.read_text())["loggers"]
        if len(entries) == 3 and all(e.get("last_round") == kill_after for e in entries.values()):
            break
    except (OSError, ValueError, KeyError):
        pass
    time.sleep(0.02)
print("logged", flush=True)
os.kill(os.getpid(), 9)
"""


def _results(tmp_path: Path, run: str, rounds: range) -> None:
    """The run's Parquet rows of ``rounds``: what a resumed run's loggers take rounds they lack from."""
    writer = ResultsWriter(tmp_path / "out", run, _config(), flush_every_s=0)
    writer.start()
    for rnd in rounds:
        writer.add(rnd, _records(rnd))
    writer.flush()
    writer.release()


def _env(tmp_path: Path) -> dict[str, str]:
    # not WANDB_SERVICE: this process's W&B service, which would outlive the killed one's runs
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", PYTHONPATH=str(ROOT))
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        env[var] = str(tmp_path / "wandb-home")
    return env


def _steps_in_each_tool(tmp_path: Path, run: str) -> dict[str, dict[str, list[int]]]:
    """Every series' steps as each tool's own reader gives them, a step as often as it is there."""
    from mlflow.tracking import MlflowClient

    out = tmp_path / "out"
    tb = {tag: [s for s, _ in v] for tag, v in _tensorboard(out / "tb")[0][run].items()}
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "loggers-test"]
    (found,) = client.search_runs([experiment.experiment_id])  # one MLflow run for the fedray run
    ml = {
        name: sorted(m.step for m in client.get_metric_history(found.info.run_id, name))
        for name in found.data.metrics
    }
    wb: dict[str, list[int]] = {}
    runs = [_wandb_run(f) for f in sorted((out / "wandb").glob("offline-run-*"))]
    assert len({r["id"] for r in runs}) == 1, [r["id"] for r in runs]  # one W&B run id
    for r in runs:
        for step, row in r["history"].items():
            for tag in row:
                wb.setdefault(tag, []).append(step)
    return {"tensorboard": tb, "mlflow": ml, "wandb": {k: sorted(v) for k, v in wb.items()}}


@pytest.mark.parametrize("ledger", ["behind", "before-the-tool-runs-were-kept"])
def test_a_kill_then_a_resume_logs_every_round_once_in_each_tool(tmp_path, wandb_offline, ledger):  # noqa: F811
    """Killed (SIGKILL) after round 4, its checkpoint after round 3: the resumed run does round 4
    again, then 5-7. The loggers' file is set back as a kill at another moment leaves it: ``behind``
    (the tools had rounds 3-4 when the process died, the file says 2) or from before each tool's run
    was kept (its MLflow run found by its tag, its W&B run by the id kept before it was made). Each
    tool holds every step 1..7 once, in one MLflow run and one W&B run id."""
    run = "killed-run"
    _results(tmp_path, run, range(1, 5))
    done = subprocess.run(
        [sys.executable, "-c", KILLED, str(tmp_path / "out"), run, "4", json.dumps(_config())],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL and done.stdout.strip() == "logged", done.stderr
    path = tmp_path / "out" / "loggers" / f"{run}.json"
    state = json.loads(path.read_text())
    entries = state["loggers"]
    if ledger == "behind":
        for entry in entries.values():
            entry["last_round"] = 2
    else:
        entries["mlflow"] = {
            "tracking_uri": entries["mlflow"]["tracking_uri"],
            "attempt": entries["mlflow"]["attempt"],
        }
        entries["wandb"] = {
            "id": entries["wandb"]["id"],
            "project": entries["wandb"]["project"],
            "last_round": 0,
        }
        entries["tensorboard"]["last_round"] = 0
    path.write_text(json.dumps(state))

    _resume_then_steps_1_to_7_once(tmp_path, run, resumed_from=3)
    final = json.loads(path.read_text())["loggers"]
    assert all(final[name]["last_round"] == 7 for name in THREE)


# the same, killed from outside at whatever moment it has reached (starting the loggers, between
# rounds, while a logger sends): rounds handed over a 0.2 s apart
RUNNING = """
import json, sys, time
from fedray.storage.loggers import Loggers, RunInfo
from tests.storage.test_loggers import _records
out, run, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
info = RunInfo(run, "loggers-test", out, config, 0, {"mlflow_tracking_uri": "", "wandb_project": ""})
logs = Loggers(["tensorboard", "mlflow", "wandb"], info)
print("started", flush=True)
for rnd in range(1, 8):
    logs.log_round(rnd, _records(rnd))
    time.sleep(0.2)
logs.end("finished")
"""


@pytest.mark.parametrize("after_s, resumed_from", [(1.0, 2), (3.0, 2), (2.0, 0)])
def test_a_kill_at_any_moment_then_a_resume_logs_every_round_once(
    tmp_path,
    wandb_offline,  # noqa: F811 (the fixture)
    after_s,
    resumed_from,
):
    """Killed ``after_s`` after it started, wherever it was; resumed from a checkpoint after round 2
    (the results hold rounds 1-7), or, killed before any checkpoint, run again from round 1 (not
    --restart: the same tool runs go on): each tool holds every step 1..7 once, one MLflow run, one
    W&B id."""
    run = "any-moment"
    _results(tmp_path, run, range(1, 8))
    script = [RUNNING, str(tmp_path / "out"), run, json.dumps(_config())]
    _killed_after(script, _env(tmp_path), "started", after_s)
    _resume_then_steps_1_to_7_once(tmp_path, run, resumed_from=resumed_from)


MAKING_THE_STORE = """
import sys
from pathlib import Path
from fedray.storage.loggers.mlflow_logger import make_store
print("making", flush=True)
make_store(Path(sys.argv[1]))
print("made", flush=True)
"""


def _killed_after(script: list[str], env: dict[str, str], said: str, delay_s: float) -> None:
    """``python -c SCRIPT ARGS...`` killed (SIGKILL) ``delay_s`` after its first line, ``said``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", *script], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == said
    time.sleep(delay_s)
    proc.kill()
    proc.wait(30)


def _resume_then_steps_1_to_7_once(tmp_path, run, resumed_from):
    """The run goes on after round ``resumed_from`` to round 7: every tool then holds steps 1..7 of
    each series once."""
    info = dataclasses.replace(_info(tmp_path, run, resumed_from=resumed_from), continued=True)
    logs = Loggers(THREE, info)
    for rnd in range(resumed_from + 1, 8):
        logs.log_round(rnd, _records(rnd))
    logs.end("finished")
    assert logs.names == THREE
    got = _steps_in_each_tool(tmp_path, run)
    once = list(range(1, 8))
    assert got["tensorboard"] == {_tag(s, e, m): once for s, e, m in SERIES}
    assert got["mlflow"] == got["tensorboard"]
    assert got["wandb"] == got["tensorboard"]


def test_a_kill_while_the_mlflow_store_is_made_leaves_none_and_a_rerun_logs_every_round(tmp_path):
    """Killed 0-1.5 s into making OUT/mlflow.db: no half-made store is left (a whole one, or none
    and the file aside, removed later); the run started again logs every round there."""
    from mlflow.tracking import MlflowClient

    db = tmp_path / "out" / "mlflow.db"
    db.parent.mkdir(parents=True)
    for delay in (0.0, 1.5):
        _killed_after([MAKING_THE_STORE, str(db)], dict(os.environ, PYTHONPATH=str(ROOT)), "making", delay)
        assert not db.exists() or sqlite3.connect(db).execute("select count(*) from experiments").fetchone()
    run = "after-a-kill"
    logs = Loggers(["mlflow"], _info(tmp_path, run))
    for rnd in (1, 2, 3):
        logs.log_round(rnd, _records(rnd))
    logs.end("finished")
    assert logs.names == ["mlflow"]
    assert not list(db.parent.glob(".mlflow.db.making-*"))
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    (found,) = client.search_runs([client.get_experiment_by_name("loggers-test").experiment_id])
    assert sorted(m.step for m in client.get_metric_history(found.info.run_id, "test/accuracy")) == [1, 2, 3]


def test_a_half_made_mlflow_store_is_said_in_one_line_with_what_to_do_and_the_run_goes_on(tmp_path, capsys):
    from fedray.storage.loggers.mlflow_logger import make_store

    db = tmp_path / "out" / "mlflow.db"
    db.parent.mkdir(parents=True)
    make_store(db)
    with sqlite3.connect(db) as c:  # as an interrupted first run of an older fedray left it
        c.execute("drop table trace_info")
    for run in ("first", "second"):
        logs = Loggers(["mlflow", "tensorboard"], _info(tmp_path, run))
        logs.log_round(1, _records(1))
        logs.end("finished")
        assert logs.names == ["tensorboard"]
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "mlflow" in line.lower()]
    assert len(said) == 2, err  # one line a run
    assert "Traceback" not in err
    for run, line in zip(("first", "second"), said, strict=True):
        assert line.startswith(f"fedray: logger mlflow of run {run} failed"), line
        assert (
            f"MLflow store {db} cannot be used (some of MLflow's tables are missing: it was left half-made)"
            in line
        )
        assert f"mv {db} {db}.old" in line and f"mlflow db upgrade sqlite:///{db}" in line
    assert "trace_info" not in {r[0] for r in sqlite3.connect(db).execute("select name from sqlite_master")}
    # fedray report's pointer says what to do with it, not to open it in mlflow ui
    (place,) = [line for line in logger_places(str(db.parent)) if line.startswith("MLflow")]
    assert place.startswith(f"MLflow: MLflow store {db} cannot be used") and "mlflow ui" not in place, place


def test_each_mlflow_value_is_timed_when_its_round_ended(tmp_path):
    """A value's MLflow timestamp is when the round loop handed its round over (the round's end),
    not when the logger's thread sent it (MLflow starting takes seconds); the MLflow run starts when
    the fedray run started (`RunInfo.started`), not when its logger made it."""
    from mlflow.tracking import MlflowClient

    run = "timed-run"
    started = time.time() - 100.0  # as a run whose data took 100 s to build
    logs = Loggers(["mlflow"], dataclasses.replace(_info(tmp_path, run), started=started))
    ended = {}
    for rnd in (1, 2, 3):
        ended[rnd] = time.time()
        logs.log_round(rnd, _records(rnd))
        time.sleep(0.3)
    logs.end("finished")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    run_id = json.loads((tmp_path / "out" / "loggers" / f"{run}.json").read_text())["loggers"]["mlflow"][
        "run_id"
    ]
    for m in client.get_metric_history(run_id, "test/accuracy"):
        assert abs(m.timestamp / 1000 - ended[m.step]) < 0.1, (m.step, m.timestamp / 1000 - ended[m.step])
    assert client.get_run(run_id).info.start_time == int(started * 1000)


TB_DISK_FULL = """
import sys
from tensorboard.summary.writer import record_writer
from fedray.storage.loggers import Loggers, RunInfo
from tests.storage.test_loggers import _records
logs = Loggers(["tensorboard"], RunInfo("full-disk", "e", sys.argv[1], {}, 0, {}))
logs.log_round(1, _records(1))
def full(self, data):
    raise OSError(28, "No space left on device")
import json, time
from pathlib import Path
state = Path(sys.argv[1]) / "loggers" / "full-disk.json"
while not (state.is_file() and json.loads(state.read_text())["loggers"]["tensorboard"]["last_round"] == 1):
    time.sleep(0.02)
record_writer.RecordWriter.write = full
for rnd in (2, 3, 4):
    logs.log_round(rnd, _records(rnd))
logs.end("finished")
print(logs.names)
"""


def test_a_full_disk_under_tensorboard_is_one_line_and_no_traceback_from_its_thread(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", TB_DISK_FULL, str(tmp_path / "out")],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == "[]", done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert (
        lines[0].startswith("fedray: logger tensorboard of run full-disk failed")
        and "No space left" in lines[0]
    )


def _named_records(rnd: int) -> list[dict]:
    from fedray.records import rec

    return [
        rec("val_accuracy", 0.5 + rnd / 100),
        rec("val_loss", 1.0),
        rec("val_accuracy", 0.4, scope="cluster", entity=0),
        rec("train_loss", 0.9),
        rec("sgd_loss", 0.8),
        rec("bytes_up", 1000.0),
        rec("seconds", 0.1),
        rec("participants", 4.0),
    ]


NAMED = {
    "val/accuracy",
    "val/loss",
    "val/cluster/0/accuracy",
    "train/loss",
    "train/sgd_loss",
    "system/bytes_up",
    "system/seconds",
    "algorithm/participants",
}


def test_names_sections_and_groups_read_alike_in_the_three_tools(tmp_path, wandb_offline):  # noqa: F811
    """Two seeds of one setting evaluated on validation (a search's trials): every value in the same
    section under the same name in TensorBoard, MLflow and W&B; MLflow and W&B name each run by its
    setting and seed, W&B groups the two seeds, job type trial; MLflow's params hold every
    hyperparameter, defaults included."""
    from dataclasses import replace

    from mlflow.tracking import MlflowClient

    hparams = {"mu": 0.01, "server_lr": 1.0, "drop_stragglers": False}
    runs = {0: "names-s0-1a2b3c4d5e", 1: "names-s1-9f8e7d6c5b"}
    for seed, run in runs.items():
        info = _info(tmp_path, run)
        info = replace(
            info, config={**info.config, "seed": seed, "evaluate_on": "validation"}, hparams=hparams
        )
        logs = Loggers(THREE, info)
        for rnd in (1, 2):
            logs.log_round(rnd, _named_records(rnd))
        logs.end("finished")
        assert logs.names == THREE

    out = tmp_path / "out"
    scalars, _ = _tensorboard(out / "tb")
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "loggers-test"]
    found = {r.data.tags["fedray_run_id"]: r for r in client.search_runs([experiment.experiment_id])}
    wb = {(r := _wandb_run(f))["id"].rsplit("-", 1)[0]: r for f in (out / "wandb").glob("offline-run-*")}
    for seed, run in runs.items():
        assert set(scalars[run]) == NAMED
        assert set(found[run].data.metrics) == NAMED
        assert set(wb[run]["history"][1]) == NAMED
        name = f"fedavg dirichlet(0.5) lr=0.05 mu=0.01 s{seed} {run.rsplit('-', 1)[1][:6]}"
        assert found[run].info.run_name == name and wb[run]["name"] == name
        params, tags = found[run].data.params, found[run].data.tags
        assert {k: params[k] for k in ("hp.mu", "hp.server_lr", "hp.drop_stragglers")} == {
            "hp.mu": "0.01",
            "hp.server_lr": "1.0",
            "hp.drop_stragglers": "false",
        }
        assert tags["job_type"] == "trial" and tags["setting"].startswith(
            "fedavg dirichlet(0.5) lr=0.05 mu=0.01 "
        )
        assert wb[run]["config"]["hp"] == hparams
    assert found[runs[0]].data.tags["setting"] == found[runs[1]].data.tags["setting"]

    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import api_pb2, metadata

    mux = EventMultiplexer()  # TensorBoard's HParams view: each run's session, seeds in one group
    mux.AddRunsFromDirectory(str(out / "tb"))
    mux.Reload()
    content = mux.PluginRunToTagToContent("hparams")
    starts = {
        run: metadata.parse_session_start_info_plugin_data(content[run][metadata.SESSION_START_INFO_TAG])
        for run in runs.values()
    }
    for seed, run in runs.items():
        hp = {
            k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
            for k, v in starts[run].hparams.items()
        }
        assert hp == {
            "algorithm": "fedavg",
            "dataset": "digits",
            "partition": "dirichlet(0.5)",
            "model": found[run].data.tags["model"],
            "seed": float(seed),
            "lr": 0.05,
            "hp.mu": 0.01,
            "hp.server_lr": 1.0,
            "hp.drop_stragglers": False,
        }
        end = metadata.parse_session_end_info_plugin_data(content[run][metadata.SESSION_END_INFO_TAG])
        assert end.status == api_pb2.STATUS_SUCCESS
    assert starts[runs[0]].group_name == starts[runs[1]].group_name == found[runs[0]].data.tags["setting"]

    records = {}  # each W&B run record: its group, job type and tags
    for f in (out / "wandb").glob("offline-run-*"):
        (record,) = [
            r.run for r in _wandb_records(next(f.glob("run-*.wandb"))) if r.WhichOneof("record_type") == "run"
        ]
        records[record.run_id.rsplit("-", 1)[0]] = record
    assert records[runs[0]].run_group == records[runs[1]].run_group == found[runs[0]].data.tags["setting"]
    assert {r.job_type for r in records.values()} == {"trial"}
    assert "algorithm:fedavg" in records[runs[0]].tags and "partition:dirichlet(0.5)" in records[runs[0]].tags


def test_a_run_gives_mlflow_every_hyperparameter_defaults_included(tmp_path):
    """Through the round loop: the params hold hp.NAME for each of the algorithm's hyperparameters."""
    from mlflow.tracking import MlflowClient

    from fedray.algorithms import ALGORITHMS
    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import execute
    from tests.storage.test_loggers import _run_config

    cfg = _run_config(tmp_path, ["mlflow"], rounds=2, algorithm="fedprox", hp={"mu": 0.01})
    list(execute(cfg, make_local_federation))
    client = MlflowClient(tracking_uri=f"sqlite:///{Path(cfg.output) / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name(cfg.experiment).experiment_id])
    want = ALGORITHMS["fedprox"].full_hparams({"mu": 0.01})
    assert len(want) > 1 and {k[3:] for k in run.data.params if k.startswith("hp.")} == set(want)
    assert run.data.params["hp.mu"] == "0.01"
    # the keys the run reads: not partition_k (a Dirichlet partition's runs do not read it), nor the
    # keys of another dataset (emnist_split)
    assert {"partition_beta", "lr", "seed"} <= set(run.data.params), sorted(run.data.params)
    assert not {"partition_k", "emnist_split", "partition_clusters"} & set(run.data.params)
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "test/accuracy")) == [1, 2]


WANDB_DISABLED = """
import sys, time
from fedray.storage.loggers import Loggers, RunInfo
from tests.storage.test_loggers import _records
logs = Loggers(["wandb"], RunInfo("disabled-run", "e", sys.argv[1], {}, 0, {}), timeout_s=20)
t0 = time.perf_counter()
for rnd in (1, 2):
    logs.log_round(rnd, _records(rnd))
logs.end("finished")
print(f"{time.perf_counter() - t0:.1f}", logs.names)
"""


def test_wandb_disabled_writes_no_file_and_no_round_waits_for_one(tmp_path):
    """WANDB_MODE=disabled: W&B writes no run file, so a round is not waited for there."""
    env = {**_env(tmp_path), "WANDB_MODE": "disabled"}
    done = subprocess.run(
        [sys.executable, "-c", WANDB_DISABLED, str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seconds, names = done.stdout.split(maxsplit=1)
    assert names.strip() == "['wandb']" and float(seconds) < 10, done.stderr


def test_a_sweeps_runs_nest_under_one_mlflow_run_named_by_their_values(tmp_path):
    """A run a sweep or a search launched (`write_setting`, before its process starts) is named in
    MLflow by the values it was launched with and nested under one run standing for the sweep; a
    run alone stays on its own, named by its setting."""
    from mlflow.tracking import MlflowClient

    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import execute
    from fedray.storage.loggers.base import read_setting, setting_path, write_setting
    from tests.storage.test_loggers import _run_config

    cfgs = [_run_config(tmp_path, ["mlflow"], rounds=1, seed=seed) for seed in (0, 1)]
    for cfg in cfgs:
        write_setting(cfg.output, cfg.run_id(), f"lr=0.05 seed={cfg.seed}", "sweep grid.yaml")
        list(execute(cfg, make_local_federation))
    assert read_setting(cfgs[0].output, cfgs[0].run_id()) == {
        "label": "lr=0.05 seed=0",
        "parent": "sweep grid.yaml",
    }
    # a run's file copied over another's names the run it was written for: not read as this one's
    copied = setting_path(cfgs[0].output, cfgs[1].run_id())
    shutil.copy(setting_path(cfgs[0].output, cfgs[0].run_id()), copied)
    assert read_setting(cfgs[0].output, cfgs[1].run_id()) == {}
    copied.unlink()
    alone = _run_config(tmp_path, ["mlflow"], rounds=1, seed=2)
    list(execute(alone, make_local_federation))

    client = MlflowClient(tracking_uri=f"sqlite:///{Path(alone.output) / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(alone.experiment).experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("fedray_parent") == "sweep grid.yaml"]
    assert parent.info.run_name == "sweep grid.yaml" and not parent.data.metrics
    nested = {r.data.tags["fedray_run_id"]: r for r in runs if r.data.tags.get("mlflow.parentRunId")}
    assert set(nested) == {c.run_id() for c in cfgs}
    for cfg in cfgs:
        run = nested[cfg.run_id()]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        tail = cfg.run_id().rsplit("-", 1)[-1][:6]
        assert run.info.run_name == f"{cfg.algorithm} lr=0.05 seed={cfg.seed} {tail}"
    (own,) = [r for r in runs if r.data.tags.get("fedray_run_id") == alone.run_id()]
    assert "mlflow.parentRunId" not in own.data.tags and " s2 " in own.info.run_name
