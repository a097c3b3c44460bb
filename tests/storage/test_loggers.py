"""Live loggers (fedray/storage/loggers, docs/loggers.md), driven through `Loggers` with rounds of
records made here, and read back with each library's own reader: TensorBoard's event multiplexer,
MLflow's client on the SQLite file, W&B's offline run file (its records, W&B's own protobuf)."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedray.config.coercion import ConfigError
from fedray.config.keys import Config
from fedray.records import assignment_rec, rec
from fedray.storage.loggers import LOGGERS, Loggers, RunInfo, check_loggers, logger_places, register_logger
from fedray.storage.loggers.base import slash_name
from fedray.storage.writer import ResultsWriter

ROOT = Path(__file__).resolve().parents[2]


def _config() -> dict:
    return {**Config().to_dict(), "experiment": "loggers-test", "hp": {"mu": 0.01}}


def _info(tmp_path: Path, run_id: str, resumed_from: int = 0, **options) -> RunInfo:
    return RunInfo(
        run_id=run_id,
        experiment="loggers-test",
        output=str(tmp_path / "out"),
        config=_config(),
        resumed_from=resumed_from,
        options={"mlflow_tracking_uri": "", "wandb_project": "", **options},
    )


def _records(rnd: int, again: float = 0.0) -> list[dict]:
    """A round's records: global, cluster and client scopes, a value that is not finite (left out) and
    an assignment row (left out). ``again``: added to the global accuracy (a round done again that
    came out otherwise)."""
    return [
        rec("accuracy", 0.5 + rnd / 100 + again),
        rec("loss", 2.0 - rnd / 10),
        rec("accuracy", 0.4 + rnd / 100, scope="cluster", entity=0),
        rec("accuracy", 0.6 + rnd / 100, scope="cluster", entity=1),
        rec("local_accuracy", 0.7 + rnd / 1000, scope="client", entity=5),
        rec("sgd_loss", float("nan")),
        assignment_rec(3, 1),
    ]


# the series each backend names from `_records(rnd)`, and their values
SERIES = {
    ("global", None, "accuracy"): lambda r: 0.5 + r / 100,
    ("global", None, "loss"): lambda r: 2.0 - r / 10,
    ("cluster", 0, "accuracy"): lambda r: 0.4 + r / 100,
    ("cluster", 1, "accuracy"): lambda r: 0.6 + r / 100,
    ("client", 5, "local_accuracy"): lambda r: 0.7 + r / 1000,
}


def _tag(scope: str, entity: int | None, metric: str) -> str:
    """A series' name in all three tools: every metric of `_records` is read from the test sets."""
    return f"test/{metric}" if entity is None else f"test/{scope}/{entity}/{metric}"


# the name MLflow and W&B give a run of `_config()` whose run id ends with "-run"
RUN_NAME = "fedavg dirichlet(0.5) lr=0.05 mu=0.01 s0 run"


def _state(tmp_path: Path, run_id: str) -> dict:
    return json.loads((tmp_path / "out" / "loggers" / f"{run_id}.json").read_text())["loggers"]


def _wait_for(cond, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


@pytest.fixture
def registry():
    """LOGGERS as it was, after the test (a test registers loggers of its own)."""
    kept = dict(LOGGERS)
    yield LOGGERS
    LOGGERS.clear()
    LOGGERS.update(kept)


class Recorder:
    """A plug-in logger that keeps what it is given; ``fail_at``: it raises at that round."""

    made: list[Recorder] = []
    fail_at = 0

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.info: RunInfo | None = None
        Recorder.made.append(self)

    def start(self, info: RunInfo) -> None:
        self.info = info
        self.calls.append(("start", info.resumed_from))

    def log_round(self, rnd: int, records: list[dict]) -> None:
        if rnd == self.fail_at:
            raise OSError(28, "No space left on device")
        self.calls.append(
            ("round", rnd, {r["metric"]: r["value"] for r in records if r.get("scope") == "global"})
        )

    def end(self, status: str) -> None:
        self.calls.append(("end", status))

    def saved(self) -> dict:
        return {"token": "abc"}


def _rounds(calls: list[tuple]) -> list[int]:
    return [c[1] for c in calls if c[0] == "round"]


# --- TensorBoard ------------------------------------------------------------------------------------


def _tensorboard(tb: Path) -> tuple[dict, dict]:
    """Every run's scalars in ``tb`` by run and tag: [(step, value)], as ``tensorboard --logdir tb``
    reads them; and each run's text by tag."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    mux = EventMultiplexer(size_guidance={"scalars": 0, "tensors": 0})
    mux.AddRunsFromDirectory(str(tb))
    mux.Reload()
    scalars, texts = {}, {}
    for run, tags in mux.Runs().items():
        scalars[run] = {t: [(e.step, e.value) for e in mux.Scalars(run, t)] for t in tags["scalars"]}
        texts[run] = {
            t: [(e.step, e.tensor_proto.string_val[0].decode()) for e in mux.Tensors(run, t)]
            for t in tags["tensors"]
            if t.endswith("/text_summary")  # not the HParams plugin's (tests/storage/test_loggers_once.py)
        }
    return scalars, texts


def _expected_slash(rounds: list[int], again: dict[int, float] | None = None) -> dict:
    out = {}
    for (scope, entity, metric), f in SERIES.items():
        tag = _tag(scope, entity, metric)
        out[tag] = [
            (r, f(r) + ((again or {}).get(r, 0.0) if tag == "test/accuracy" else 0.0)) for r in rounds
        ]
    return out


def _close(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for tag in want:
        assert [s for s, _ in got[tag]] == [s for s, _ in want[tag]], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in want[tag]], rel=1e-6), tag


def test_tensorboard_shows_each_round_as_it_ends_and_a_resumed_run_once(tmp_path):
    run, tb = "tb-run", tmp_path / "out" / "tb"
    logs = Loggers(["tensorboard"], _info(tmp_path, run))
    logs.log_round(1, _records(1))
    # flushed at the round's end: the event files show round 1 while the run runs
    _wait_for(lambda: tb.is_dir() and _tensorboard(tb)[0].get(run, {}).get("test/accuracy"))
    for rnd in (2, 3):
        logs.log_round(rnd, _records(rnd))
    logs.end("interrupted")
    scalars, texts = _tensorboard(tb)
    _close(scalars[run], _expected_slash([1, 2, 3]))
    ((step, config),) = texts[run]["config/text_summary"]
    assert step == 0 and "algorithm: fedavg" in config and "mu: 0.01" in config
    assert texts[run]["status/text_summary"] == [(3, "interrupted after round 3")]

    # stopped after round 3, its checkpoint after round 2: round 3 is done again, and came out otherwise
    logs = Loggers(["tensorboard"], _info(tmp_path, run, resumed_from=2))
    logs.log_round(3, _records(3, again=0.25))
    logs.log_round(4, _records(4))
    logs.end("finished")
    scalars, texts = _tensorboard(tb)
    assert list(scalars) == [run]
    _close(scalars[run], _expected_slash([1, 2, 3, 4], again={3: 0.25}))  # each step once, round 3 new
    assert texts[run]["status/text_summary"] == [
        (3, "interrupted after round 3"),
        (4, "finished after round 4"),
    ]
    assert _state(tmp_path, run)["tensorboard"]["last_round"] == 4

    # a fresh start (--force) leaves no curve of the earlier attempt
    logs = Loggers(["tensorboard"], _info(tmp_path, run))
    logs.log_round(1, _records(1))
    logs.end("failed")
    scalars, _ = _tensorboard(tb)
    _close(scalars[run], _expected_slash([1]))


# --- MLflow -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlflow_client():
    from mlflow.tracking import MlflowClient  # imported once: it takes a second

    return MlflowClient


def _history(client, run_id: str, name: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))


def test_mlflow_one_run_per_fedray_run_its_params_tags_metrics_and_status(tmp_path, mlflow_client):
    run = "mlflow-run"
    logs = Loggers(["mlflow"], _info(tmp_path, run))
    for rnd in (1, 2, 3):
        logs.log_round(rnd, _records(rnd))
    logs.end("interrupted")
    client = mlflow_client(tracking_uri=f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("loggers-test")
    (first,) = client.search_runs([experiment.experiment_id])
    assert first.info.status == "KILLED" and first.info.run_name == RUN_NAME
    assert _state(tmp_path, run)["mlflow"] == {
        "run_id": first.info.run_id,
        "tracking_uri": f"sqlite:///{(tmp_path / 'out' / 'mlflow.db').resolve()}",
        "experiment_id": experiment.experiment_id,
        "attempt": first.data.tags["fedray_attempt"],
        "last_round": 3,
    }
    params, tags = first.data.params, first.data.tags
    assert params["algorithm"] == "fedavg" and params["rounds"] == "30" and params["hp.mu"] == "0.01"
    assert params["synthetic_shape"] == "[1, 8, 8]" and params["data_seed"] == "null"
    assert "hp" not in params
    assert {k: tags[k] for k in ("algorithm", "dataset", "partition", "seed", "fedray_run_id")} == {
        "algorithm": "fedavg",
        "dataset": "digits",
        "partition": "dirichlet(0.5)",
        "seed": "0",
        "fedray_run_id": run,
    }

    # goes on after its checkpoint of round 2: the same MLflow run; round 3, logged already, not again
    logs = Loggers(["mlflow"], _info(tmp_path, run, resumed_from=2))
    logs.log_round(3, _records(3, again=0.25))
    logs.log_round(4, _records(4))
    logs.end("finished")
    (again,) = client.search_runs([experiment.experiment_id])
    assert again.info.run_id == first.info.run_id and again.info.status == "FINISHED"
    for (scope, entity, metric), f in SERIES.items():
        name = _tag(scope, entity, metric)
        steps, values = zip(*_history(client, again.info.run_id, name), strict=True)
        assert steps == (1, 2, 3, 4) and values == pytest.approx([f(r) for r in steps]), name
    assert set(again.data.metrics) == {
        "test/accuracy",
        "test/loss",
        "test/cluster/0/accuracy",
        "test/cluster/1/accuracy",
        "test/client/5/local_accuracy",
    }  # no NaN sgd_loss, no assignment

    # a fresh start (--force): a new MLflow run beside the first
    logs = Loggers(["mlflow"], _info(tmp_path, run))
    logs.log_round(1, _records(1))
    logs.end("failed")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2
    (new,) = [r for r in runs if r.info.run_id != first.info.run_id]
    assert new.info.status == "FAILED" and _history(client, new.info.run_id, "test/accuracy") == [(1, 0.51)]
    assert _state(tmp_path, run)["mlflow"]["run_id"] == new.info.run_id


def test_mlflow_runs_logging_at_once_in_one_process_each_get_their_own(tmp_path, mlflow_client):
    """Packed runs: several fedray runs in one process log to one new SQLite file at the same time."""
    runs = [f"packed-{i}" for i in range(3)]
    all_logs = [Loggers(["mlflow"], _info(tmp_path, run)) for run in runs]
    for rnd in (1, 2):
        for i, logs in enumerate(all_logs):
            logs.log_round(rnd, [rec("accuracy", i + rnd / 10)])
    for logs in all_logs:
        logs.end("finished")
    client = mlflow_client(tracking_uri=f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    for i, run in enumerate(runs):
        (found,) = client.search_runs(
            [client.get_experiment_by_name("loggers-test").experiment_id], f"tags.fedray_run_id = '{run}'"
        )
        assert found.info.status == "FINISHED"
        steps, values = zip(*_history(client, found.info.run_id, "test/accuracy"), strict=True)
        assert steps == (1, 2) and values == pytest.approx([i + 0.1, i + 0.2])


# --- W&B --------------------------------------------------------------------------------------------


def _wandb_records(path: Path):
    """The records of an offline run's ``.wandb`` file: W&B's log format (a 7-byte header, then 32 KiB
    blocks of chunks, each a CRC-32C, a length and a type: full, first, middle or last), each record
    W&B's own protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, pending, block = 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending + chunk)
            pending = b""
            yield record
        elif kind in (2, 3):
            pending += chunk


def _wandb_run(folder: Path) -> dict:
    """An offline run folder's run id, name, project, config, history rows by step, exit code."""
    (path,) = folder.glob("run-*.wandb")
    out: dict = {"history": {}}
    for r in _wandb_records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out.update(id=r.run.run_id, name=r.run.display_name, project=r.run.project)
            out["config"] = {i.key: json.loads(i.value_json) for i in r.run.config.update}
        elif kind == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            out["history"][r.history.step.num] = {k: v for k, v in row.items() if not k.startswith("_")}
        elif kind == "exit":
            out["exit"] = r.exit.exit_code
    return out


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # nothing leaves the machine
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))


def test_wandb_offline_run_its_history_and_the_same_run_when_resumed(tmp_path, wandb_offline):
    run = "wandb-run"
    logs = Loggers(["wandb"], _info(tmp_path, run))
    for rnd in (1, 2, 3):
        logs.log_round(rnd, _records(rnd))
    logs.end("interrupted")
    logs = Loggers(["wandb"], _info(tmp_path, run, resumed_from=2))
    logs.log_round(3, _records(3, again=0.25))
    logs.log_round(4, _records(4))
    logs.end("finished")

    state = _state(tmp_path, run)["wandb"]
    assert state["id"].startswith(f"{run}-") and state["mode"] == "offline" and state["last_round"] == 4
    folders = sorted((tmp_path / "out" / "wandb").glob("offline-run-*"))
    assert len(folders) == 2
    runs = sorted((_wandb_run(f) for f in folders), key=lambda r: min(r["history"]))
    assert [r["id"] for r in runs] == [state["id"]] * 2  # the attempt that goes on resumes the same run
    assert [r["name"] for r in runs] == [RUN_NAME] * 2 and runs[0]["project"] == "loggers-test"
    assert runs[0]["config"]["algorithm"] == "fedavg" and runs[0]["config"]["hp"] == {"mu": 0.01}
    assert [sorted(r["history"]) for r in runs] == [[1, 2, 3], [4]]  # round 3 not logged twice
    assert [r["exit"] for r in runs] == [255, 0]
    history = {**runs[0]["history"], **runs[1]["history"]}
    for (scope, entity, metric), f in SERIES.items():
        tag = _tag(scope, entity, metric)
        assert [history[r][tag] for r in (1, 2, 3, 4)] == pytest.approx([f(r) for r in (1, 2, 3, 4)])
    assert all(len(row) == len(SERIES) for row in history.values())

    # a fresh start (--force): a new W&B run id
    logs = Loggers(["wandb"], _info(tmp_path, run))
    logs.log_round(1, _records(1))
    logs.end("failed")
    assert _state(tmp_path, run)["wandb"]["id"] not in (state["id"], "")


WANDB_WITHOUT_A_KEY = """
import sys, time
from fedray.records import rec
from fedray.storage.loggers import Loggers, RunInfo
logs = Loggers(["wandb"], RunInfo("online-run", "e", sys.argv[1], {}, 0, {}), timeout_s=20)
t0 = time.perf_counter()
logs.log_round(1, [rec("accuracy", 0.5)])
logs.end("finished")
print(f"{time.perf_counter() - t0:.1f}")
"""


def test_wandb_online_without_a_key_is_refused_at_once_not_prompted(tmp_path):
    """Online, wandb asks for a key at a terminal: the logger says so and is dropped instead (its own
    process: W&B keeps the mode of its first run in a process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), NETRC=str(tmp_path / "no-netrc"), WANDB_MODE="online")
    env.update(WANDB_CONFIG_DIR=str(tmp_path / "wandb-home"), WANDB_CACHE_DIR=str(tmp_path / "wandb-home"))
    done = subprocess.run(
        [sys.executable, "-c", WANDB_WITHOUT_A_KEY, str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    (said,) = [line for line in done.stderr.splitlines() if line.startswith("fedray: logger wandb")]
    assert "W&B has no API key here: run `wandb login`" in said, done.stderr
    assert float(done.stdout.split()[-1]) < 10


# --- failures, plug-ins, checks ---------------------------------------------------------------------


def test_a_failing_logger_is_said_once_and_dropped_while_the_others_get_every_round(
    tmp_path, capsys, monkeypatch, registry
):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's retries take minutes otherwise
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")

    class Boom(Recorder):
        fail_at = 2

    register_logger("boom", Boom)
    register_logger("mine", Recorder)
    Recorder.made.clear()
    run = "failing-run"
    info = _info(tmp_path, run, mlflow_tracking_uri="http://127.0.0.1:9")  # no server there
    t0 = time.perf_counter()
    logs = Loggers(["boom", "mlflow", "mine"], info)
    for rnd in (1, 2, 3, 4):
        logs.log_round(rnd, _records(rnd))
    handed = time.perf_counter() - t0
    logs.end("finished")
    ended = time.perf_counter() - t0
    assert handed < 0.5 and ended < 20, (handed, ended)
    boom, mine = Recorder.made
    _wait_for(lambda: boom.calls[-1] == ("end", "failed"))  # closed where it can be, after it is dropped
    assert _rounds(boom.calls) == [1]
    assert _rounds(mine.calls) == [1, 2, 3, 4] and mine.calls[-1] == ("end", "finished")
    assert mine.calls[1] == (
        "round",
        1,
        {"accuracy": 0.51, "loss": 1.9, "sgd_loss": pytest.approx(float("nan"), nan_ok=True)},
    )
    err = capsys.readouterr().err.splitlines()
    said = [line for line in err if line.startswith("fedray: logger ")]
    assert len([s for s in said if s.startswith(f"fedray: logger boom of run {run} failed")]) == 1
    assert len([s for s in said if s.startswith(f"fedray: logger mlflow of run {run} failed")]) == 1
    assert "No space left on device" in " ".join(said) and "127.0.0.1:9" in " ".join(said)
    assert logs.names == ["mine"]
    state = _state(tmp_path, run)
    assert state["mine"] == {"token": "abc", "last_round": 4} and "mlflow" not in state


def test_end_waits_a_bounded_time_for_a_slow_logger(tmp_path, capsys, registry):
    release = threading.Event()

    class Slow(Recorder):
        def log_round(self, rnd, records):
            release.wait(10)  # a server that does not answer

    register_logger("slow", Slow)
    logs = Loggers(["slow"], _info(tmp_path, "slow-run"), timeout_s=0.3)
    t0 = time.perf_counter()
    for rnd in (1, 2, 3):
        logs.log_round(rnd, _records(rnd))
    assert time.perf_counter() - t0 < 0.5  # handed over, not logged
    logs.end("finished")
    assert time.perf_counter() - t0 < 2
    logs.end("finished")  # a second end does nothing
    release.set()
    err = capsys.readouterr().err
    assert err.count("logger slow of run slow-run had not finished 0.3 s after the run ended") == 1


def test_a_plugin_logger_goes_on_where_it_was_and_gets_the_rounds_it_lacks_from_the_results(
    tmp_path, registry
):
    """Rounds 1-3 are in the results, the checkpoint is after round 2. A logger that logged 1-3 (and
    kept a token) gets 4 and the token; one added now gets 1-2 from the results, then 3-4."""
    run, out = "plugin-run", tmp_path / "out"
    writer = ResultsWriter(out, run, _config(), flush_every_s=0)
    writer.start()
    for rnd in (1, 2, 3):
        writer.add(rnd, _records(rnd))
    writer.flush()
    writer.release()
    register_logger("mine", Recorder)
    Recorder.made.clear()
    logs = Loggers(["mine"], _info(tmp_path, run))
    for rnd in (1, 2, 3):
        logs.log_round(rnd, _records(rnd))
    logs.end("interrupted")

    register_logger("late", Recorder)
    logs = Loggers(["mine", "late"], _info(tmp_path, run, resumed_from=2))
    logs.log_round(3, _records(3))
    logs.log_round(4, _records(4))
    logs.end("finished")
    first, mine, late = Recorder.made
    assert first.info.previous == {} and _rounds(first.calls) == [1, 2, 3]
    assert mine.info.previous == {"token": "abc", "last_round": 3} and _rounds(mine.calls) == [4]
    assert late.info.previous == {} and _rounds(late.calls) == [1, 2, 3, 4]
    from_results = late.calls[1][2]
    assert from_results["accuracy"] == 0.51 and from_results["loss"] == 1.9  # round 1, read back
    assert _state(tmp_path, run) == {
        "mine": {"token": "abc", "last_round": 4},
        "late": {"token": "abc", "last_round": 4},
    }


def test_register_logger_refuses_a_name_twice(registry):
    with pytest.raises(ValueError, match="'tensorboard' is registered already"):
        register_logger("tensorboard", Recorder)
    with pytest.raises(ValueError, match="a logger's name"):
        register_logger("a, b", Recorder)


def test_check_loggers_refuses_an_unknown_name_and_a_missing_library(monkeypatch, registry):
    check_loggers(["tensorboard", "mlflow", "wandb"])
    with pytest.raises(ConfigError) as e:
        check_loggers(["tensorbord"])
    assert str(e.value).startswith(
        "config key 'loggers': unknown logger 'tensorbord'; did you mean 'tensorboard'?"
    )
    register_logger("mine", Recorder)
    check_loggers(["mine"])
    found = importlib.util.find_spec
    monkeypatch.delitem(sys.modules, "wandb", raising=False)  # as where it was never installed
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else found(name, *a)
    )
    with pytest.raises(ConfigError) as e:
        check_loggers(["wandb", "tensorboard"])
    assert str(e.value) == "config key 'loggers': wandb needs the wandb package: pip install 'fedray[wandb]'"


def test_importing_the_loggers_imports_no_logging_library():
    code = (
        "import sys, fedray.storage.loggers\n"
        "print(sorted(m for m in ('mlflow', 'wandb', 'tensorboard', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_logger_places_names_what_a_results_folder_holds(tmp_path):
    out = tmp_path / "out"
    assert logger_places(str(out)) == []
    (out / "tb" / "r1").mkdir(parents=True)
    (out / "mlflow.db").write_bytes(b"")
    (out / "wandb" / "offline-run-20260101_000000-r1-abc").mkdir(parents=True)
    (out / "loggers").mkdir()
    state = {"loggers": {"mlflow": {"tracking_uri": "http://mlflow.example:5000", "run_id": "x"}}}
    (out / "loggers" / "r2.json").write_text(json.dumps(state))
    (out / "loggers" / "r3.json").write_text(json.dumps({"loggers": {"tensorboard": {"last_round": 2}}}))
    (out / "loggers" / "r4.json").write_text("{damaged")
    assert logger_places(str(out)) == [
        f"TensorBoard: tensorboard --logdir {out}/tb",
        f"MLflow: mlflow ui --backend-store-uri sqlite:///{out}/mlflow.db",
        "MLflow: runs at http://mlflow.example:5000",
        f"W&B: offline runs in {out}/wandb (wandb sync {out}/wandb/offline-run-*)",
    ]


# --- through the round loop: what each library reads back is what the Parquet rows say ---------------


def _parquet_series(out: Path) -> dict[str, list[tuple[int, float]]]:
    """The run's global rows by metric: [(round, value)], timing rows left out."""
    from analysis import load_metrics

    m = load_metrics(out)
    m = m[(m["scope"] == "global") & ~m["metric"].str.contains("seconds")]
    return {k: sorted(zip(g["round"].astype(int), g["value"], strict=True)) for k, g in m.groupby("metric")}


def _run_config(tmp_path: Path, loggers: list[str], **over):
    from tests.conftest import small_config

    keys = dict(rounds=4, checkpoint_every=2, eval_every=1, loggers=loggers)
    return small_config(tmp_path, **{**keys, **over})


def _read_back(out: Path, run_id: str, client) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """The global series each library holds for the run: TensorBoard's event files, MLflow's store,
    W&B's offline run files (every offline folder of the run, in the order written)."""
    scalars, _ = _tensorboard(out / "tb")
    tb = {t: v for t, v in scalars[run_id].items() if t.count("/") == 1}  # the global scope's
    state = json.loads((out / "loggers" / f"{run_id}.json").read_text())
    mlflow_run = state["loggers"]["mlflow"]["run_id"]
    store = client(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    ml = {name: _history(store, mlflow_run, name) for name in tb}
    steps: dict[int, dict] = {}
    for folder in sorted((out / "wandb").glob("offline-run-*")):
        for step, row in _wandb_run(folder)["history"].items():
            steps.setdefault(step, {}).update(row)
    wb = {name: sorted((s, row[name]) for s, row in steps.items() if name in row) for name in tb}
    return {"tensorboard": tb, "mlflow": ml, "wandb": wb}


def _same_as_parquet(got: dict, want: dict) -> None:
    for library, series in got.items():  # timings aside: a round done again takes another time
        series = {k: v for k, v in series.items() if "seconds" not in k}
        assert sorted(series) == sorted(want), library
        for name in want:
            assert [s for s, _ in series[name]] == [s for s, _ in want[name]], (library, name)
            assert [v for _, v in series[name]] == pytest.approx([v for _, v in want[name]], rel=1e-6), (
                library,
                name,
            )


def test_the_three_loggers_hold_the_parquet_rows_of_a_run_stopped_and_resumed(
    tmp_path, mlflow_client, wandb_offline
):
    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import RoundDone, execute

    cfg = _run_config(tmp_path, ["tensorboard", "mlflow", "wandb"])
    events = execute(cfg, make_local_federation)
    for ev in events:
        if isinstance(ev, RoundDone) and ev.round == 3:
            break
    events.close()  # as Ctrl-C: round 3 logged, its checkpoint after round 2
    out, run_id = Path(cfg.output), cfg.run_id()
    first = json.loads((out / "loggers" / f"{run_id}.json").read_text())["loggers"]
    assert all(first[name]["last_round"] == 3 for name in ("tensorboard", "mlflow", "wandb"))
    list(execute(cfg, make_local_federation))  # goes on after round 2: round 3 again, then 4
    want = {slash_name("global", None, k): v for k, v in _parquet_series(out).items()}
    assert want["test/accuracy"] and want["system/bytes_up"]
    _same_as_parquet(_read_back(out, run_id, mlflow_client), want)
    again = json.loads((out / "loggers" / f"{run_id}.json").read_text())["loggers"]
    assert (
        again["mlflow"]["run_id"] == first["mlflow"]["run_id"]
        and again["wandb"]["id"] == first["wandb"]["id"]
    )
    store = mlflow_client(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    assert store.get_run(again["mlflow"]["run_id"]).info.status == "FINISHED"


def test_an_unknown_logger_is_one_line_before_the_run_and_report_names_the_logs(tmp_path, capsys):
    from fedray.config.coercion import ConfigError
    from jobs.cli import main

    out = str(tmp_path / "out")
    assert (
        main(["run", "--local", "--quiet", "--output", out, "--logger", "tensorboard", "--set", "rounds=1"])
        == 0
    )
    assert main(["report", out, "--no-plots"]) == 0
    assert f"TensorBoard: tensorboard --logdir {Path(out) / 'tb'}" in capsys.readouterr().out
    assert main(["run", "--local", "--output", out, "--logger", "tensorbord"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert "config key 'loggers': unknown logger 'tensorbord'; did you mean 'tensorboard'" in err
    with pytest.raises(ConfigError, match="unknown logger 'mine'"):
        _run_config(tmp_path / "x", ["mine"])


@pytest.mark.ray
def test_a_run_on_ray_logs_from_its_coordinator_the_in_process_values(tmp_path, ray_session):
    from fedray.api import run

    keys = dict(rounds=3, num_clients=4, eval_every=1, loggers=["tensorboard"], quiet=True)
    run(output=str(tmp_path / "local"), local=True, **keys)
    done = run(output=str(tmp_path / "ray"), num_actors=2, **keys)
    local, on_ray = (_tensorboard(tmp_path / where / "tb")[0][done.run_id] for where in ("local", "ray"))
    assert local.keys() == on_ray.keys() and "test/accuracy" in local
    for tag in (t for t in local if "seconds" not in t):  # the numbers; not how long rounds took
        assert on_ray[tag] == local[tag], tag
    want = _parquet_series(tmp_path / "ray")["accuracy"]
    assert [s for s, _ in on_ray["test/accuracy"]] == [s for s, _ in want]


def test_the_plugin_logger_docs_show_runs_as_written_and_logs_what_the_parquet_rows_hold(tmp_path, registry):
    """docs/loggers.md's CsvLogger, taken from the page as it is, named by --plugin and --logger."""
    from jobs.cli import main

    page = (ROOT / "docs" / "loggers.md").read_text()
    section = page[page.index("## A logger of your own") :]
    code = section[
        section.index("```python\n") + 10 : section.index("```", section.index("```python\n") + 10)
    ]
    plugin = tmp_path / "csv_logger.py"
    plugin.write_text(code)
    out = tmp_path / "out"
    args = ["run", "--local", "--quiet", "--plugin", str(plugin), "--logger", "csv", "--output", str(out)]
    assert main([*args, "--set", "rounds=2", "--set", "eval_every=1"]) == 0
    (csv,) = (out / "csv").glob("*.csv")
    rows = [line.split(",") for line in csv.read_text().splitlines()]
    logged = {(int(r), m): float(v) for r, s, e, m, v in rows if s == "global" and "seconds" not in m}
    want = {(r, m): v for m, vs in _parquet_series(out).items() for r, v in vs}
    assert logged == pytest.approx(want) and len(want) > 10
