"""`fedray tune`: a search on Ray Tune over validation alone, its choice, the tuned table, resuming
after a Ctrl-C, and every bad tune: block refused in one line before anything runs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fedray.config.keys import ConfigError
from fedray.sweeps.tune_plan import open_plan
from fedray.sweeps.tuning import TuneError
from tests.helpers import FEDRAY

BASE = {
    "experiment": "tune-test",
    "dataset": "digits",
    "num_clients": 4,
    "rounds": 4,
    "local_epochs": 1,
    "validation_fraction": 0.2,
}


def tune_file(tmp_path: Path, tune: dict, **over) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "tune.yaml"
    body = {**BASE, "output": str(tmp_path / "out"), **over, "tune": tune}
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


LR = {"search": {"lr": {"loguniform": [0.01, 0.5]}}}


@pytest.mark.parametrize(
    "tune, over, message",
    [
        ({**LR, "trails": 4}, {}, r"^tune\.trails: not a tune key; did you mean 'trials'\?"),
        (
            {"search": {"lrr": {"loguniform": [0.01, 0.5]}}},
            {},
            r"^tune\.search\.lrr: lrr is not a config key; did you mean 'lr'\?",
        ),
        (
            {"search": {"algorithm": {"loguniform": [0.01, 0.5]}}},
            {},
            r"^tune\.search\.algorithm: loguniform draws numbers, and algorithm takes str: use choice",
        ),
        ({"search": {}}, {}, r"^tune\.search: the keys to search and their distributions"),
        (
            {**LR, "trials": 20_000},
            {},
            r"^tune\.trials: 20,000 trials; a search runs at most 10,000 \(the sweep limit\)",
        ),
        (
            {**LR, "metric": "accuracy"},
            {},
            r"^tune\.metric: one of val_accuracy, val_loss, val_local_accuracy, got 'accuracy' \(tuning reads validation only: val_accuracy\?\)",
        ),
        (
            LR,
            {"validation_fraction": 0.0},
            r"config key 'validation_fraction': tuning reads validation only, never a test sample",
        ),
        (
            {"search": {"momentum": {"uniform": [0.5, 1.5]}}},
            {},
            r"^.*tune\.search\.momentum: 1\.5 gives no valid run: config key 'momentum': must be in \[0, 1\)",
        ),
        ({"search": {"seed": {"randint": [0, 5]}}}, {}, r"^tune\.search\.seed: seed is fixed in a search"),
        (
            {"search": {"hp.mu": {"choice": [0.1, 1]}}},
            {},
            r"^tune\.search\.hp\.mu: hp\.mu is not a hyperparameter of fedavg",
        ),
        (
            {**LR, "search_alg": "grid"},
            {},
            r"^tune\.search_alg: grid runs the grid's values, and lr is not a grid",
        ),
        (
            {**LR, "scheduler": {"asha": {"grace": 2}}},
            {},
            r"^tune\.scheduler: successive_halving \(asha: the same; with grace_rounds >= 1",
        ),
        (
            {**LR, "scheduler": {"asha": {"grace_rounds": 50}}},
            {"rounds": 3},
            r"^.*tune\.scheduler\.successive_halving\.grace_rounds: 50 is not below rounds \(3\)",
        ),
        ({**LR, "batch": 2}, {}, r"^tune\.batch: only optuna asks for trials in batches"),
        (
            {"search": {"lr": {"grid": [0.1, 0.2]}}, "search_alg": "grid", "trials": 2},
            {},
            r"^tune\.trials: every searched key is a grid",
        ),
        (
            {"search": {"lr": {"loguniform": [0, 0.5]}}},
            {},
            r"^tune\.search\.lr: loguniform takes \[low, high\] above 0",
        ),
    ],
)
def test_a_bad_tune_block_is_one_line_before_anything_runs(tmp_path, tune, over, message):
    with pytest.raises(ConfigError, match=message) as e:
        open_plan(tune_file(tmp_path, tune, **over))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_optuna_asked_for_but_not_installed_names_the_extra(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_optuna(name, *args, **kwargs):
        if name == "optuna":
            raise ImportError("no optuna here")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_optuna)
    with pytest.raises(
        TuneError, match=r"^tune\.search_alg: optuna .* not installed: pip install 'fedray\[optuna\]'"
    ):
        open_plan(tune_file(tmp_path, {**LR, "search_alg": "optuna"}))


def test_a_tune_block_given_to_run_or_sweep_says_fedray_tune(tmp_path):
    from fedray.experiment.checks import load_config
    from fedray.sweeps.sweep_file import SweepError, load_sweep

    path = tune_file(tmp_path, LR)
    with pytest.raises(ConfigError, match=r"^key 'tune' belongs to tuning: run it with `fedray tune`"):
        load_config(path)
    with pytest.raises(SweepError, match=r"key 'tune' belongs to tuning: run it with `fedray tune`"):
        load_sweep(path)


def test_a_sweep_files_cells_are_its_runs_but_the_seeds(tmp_path):
    path = tune_file(
        tmp_path,
        LR,
        grid={"algorithm": ["fedavg", {"algorithm": "fedprox", "hp": {"mu": 0.01}}]},
        seeds=[0, 1, 2],
    )
    plan = open_plan(path)
    assert [label for label, _ in plan.cells] == ["algorithm=fedavg", "algorithm=fedprox,hp.mu=0.01"]
    assert plan.seeds == [0, 1, 2] and all(c.seed == 0 for _, c in plan.cells)


def _best_by_rows(out: Path, doc: dict) -> dict:
    """The chosen trial worked out from the trials' rows here: the highest final val_accuracy
    among the trials that ran every round."""
    from analysis.load import load_metrics, load_runs

    m = load_metrics(out, scope="global")
    runs = load_runs(out).set_index("run_id")
    best, best_value = None, -1.0
    for t in doc["trial_list"]:
        (run,) = t["runs"]
        assert runs.loc[run, "config"]["evaluate_on"] == "validation"
        rows = m[m["run_id"] == run]
        assert not {"accuracy", "loss", "local_accuracy"} & set(rows["metric"])  # no test sample read
        val = rows[rows["metric"] == "val_accuracy"].sort_values("round")
        if int(val["round"].max()) == BASE["rounds"] and val["value"].iloc[-1] > best_value:
            best, best_value = t, float(val["value"].iloc[-1])
    return best


def test_a_tuned_table_searches_each_cell_on_validation_then_runs_its_seeds_on_test(ray_session, tmp_path):
    from analysis.load import load_runs
    from fedray.api import tune
    from fedray.sweeps.search import draw
    from fedray.sweeps.tuning import read_spec

    path = tune_file(
        tmp_path,
        {**LR, "trials": 4, "scheduler": {"asha": {"grace_rounds": 1, "reduction_factor": 2}}, "seed": 3},
        grid={"algorithm": ["fedavg", "fedprox"]},
        seeds=[0, 1],
    )
    docs = tune(path, quiet=True)
    out = tmp_path / "out"
    assert [d["cell"] for d in docs] == ["algorithm=fedavg", "algorithm=fedprox"]
    drawn = draw(read_spec(yaml.safe_load(path.read_text())["tune"], ["fedavg"]))  # the search's seed's
    assert all([t["values"] for t in d["trial_list"]] == drawn for d in docs)
    for doc in docs:
        # successive halving: 4 trials to round 1, the best 2 to round 4: 4 + 2 * 3 trial-rounds
        assert doc["trials"] == 4 and doc["schedule"] == [
            {"round": 1, "trials": 4},
            {"round": 4, "trials": 2},
        ]
        assert doc["trial_rounds"] == 10 and doc["stopped_early"] == 2
        best = _best_by_rows(out, doc)
        assert doc["chosen"] == best["values"] and doc["chosen_runs"] == best["runs"]
    runs = load_runs(out)
    on_test = runs[runs["config"].map(lambda c: c["evaluate_on"] == "test")]
    # each cell's seeds at its chosen lr, on test, filed under the experiment itself
    got = sorted((c["algorithm"], c["seed"], c["lr"]) for c in on_test["config"])
    want = sorted((d["algorithm"], s, d["chosen"]["lr"]) for d in docs for s in (0, 1))
    assert got == want  # the trial's lr itself: a rounded one would be another run
    assert all(
        d["chosen"] == d["trial_list"][[t["runs"] for t in d["trial_list"]].index(d["chosen_runs"])]["values"]
        for d in docs
    )
    assert set(on_test["status"]) == {"finished"} and set(on_test["experiment"]) == {"tune-test"}
    assert set(runs.loc[~runs.index.isin(on_test.index), "experiment"]) == {"tune-test-tune"}
    # the report: the test table, the choices beside it, the trials kept apart
    p = subprocess.run(
        [*FEDRAY, "report", str(out), "--no-plots"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert "tuned on validation" in p.stdout and f"lr={docs[0]['chosen']['lr']}" in p.stdout
    assert "8 runs evaluated on validation (tuning's trials) are not in this table" in p.stdout
    # the same command again: everything is there, nothing runs again
    before = {r: s for r, s in zip(runs["run_id"], runs["started"], strict=True)}
    assert tune(path, quiet=True) == docs
    after = load_runs(out)
    assert {r: s for r, s in zip(after["run_id"], after["started"], strict=True)} == before


def test_optuna_told_each_batch_in_order_asks_for_the_same_trials_when_replayed_from_its_runs(
    ray_session, tmp_path
):
    from fedray.api import tune

    space = {"lr": {"loguniform": [0.01, 0.5]}, "momentum": {"choice": [0.0, 0.9]}}
    block = {"search": space, "trials": 2, "search_alg": "optuna", "batch": 1, "scheduler": "none", "seed": 7}
    path = tune_file(tmp_path, block, rounds=2)
    (first,) = tune(path, quiet=True)
    (tmp_path / "out" / "tuned.yaml").unlink()
    (again,) = tune(path, quiet=True)  # replayed from the runs: nothing runs, the same asks
    assert again == first and len(first["trial_list"]) == 2


@pytest.mark.slow
def test_ctrl_c_in_a_later_rung_then_the_same_command_goes_on_to_the_same_choice(tmp_path):
    """On its own Ray of this machine's CPUs (2 here): the trials start no actor of their own, so
    none waits for room its trial did not reserve. Ctrl-C lands in the second rung (after a fit of
    the first: Tune's handler of that fit must not swallow it); the same command goes on, runs each
    round once, and chooses what the search run without a stop chose."""
    from analysis.load import load_metrics, load_runs

    block = {
        **LR,
        "trials": 9,
        "scheduler": {"successive_halving": {"grace_rounds": 10}},
        "max_concurrent_trials": 1,
    }
    path = tune_file(tmp_path, block, rounds=60, eval_every=10, checkpoint_every=10)
    out = tmp_path / "out"
    env = {**os.environ, "RAY_ADDRESS": "local"}
    p = subprocess.Popen(
        [*FEDRAY, "tune", str(path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # the first rung (round 10) decided, a finalist past round 20
        if (out / "metrics").is_dir() and any((out / "metrics").glob("*.parquet")):
            if load_metrics(out, scope="global")["round"].max() >= 20:
                break
        time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "the same command goes on" in err and "Traceback" not in err
    runs = load_runs(out)
    assert (runs["status"] == "stopped").sum() >= 6 and (runs["status"] == "interrupted").sum() >= 1
    assert "running" not in set(runs["status"])
    kept = dict(zip(runs["run_id"], runs["started"], strict=True))
    q = subprocess.run(
        [*FEDRAY, "tune", str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert q.returncode == 0, q.stderr
    again = load_runs(out).set_index("run_id")
    assert len(again) == 9 and sorted(again["status"]) == ["finished"] * 3 + ["stopped"] * 6
    for run in again.index[again["status"] == "stopped"]:
        assert again.loc[run, "started"] == kept[run]  # decided once, never run again
    m = load_metrics(out, scope="global")
    rows = m[m["metric"] == "val_accuracy"].groupby("run_id")["round"]
    assert (rows.count() == rows.nunique()).all()  # every round once, resumed ones too
    assert sorted(rows.count()) == [1] * 6 + [6] * 3
    doc = yaml.safe_load((out / "tuned.yaml").read_text())["cells"][0]
    best = max(
        (t for t in doc["trial_list"] if not t["stopped"]),
        key=lambda t: (t["value"], -doc["trial_list"].index(t)),
    )
    assert doc["chosen"] == best["values"] and "chosen:" in q.stdout


def _digest(path: Path) -> tuple[str, int]:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


HALVING = {**LR, "trials": 4, "scheduler": {"asha": {"grace_rounds": 1, "reduction_factor": 2}}, "seed": 2}


def test_one_trial_at_a_time_or_several_give_the_same_trials_stops_and_choice_and_a_rerun_changes_no_file(
    ray_session, tmp_path
):
    """The choice is a function of the file: one trial at a time and as many as fit give the same
    tuned.yaml, byte for byte; the search run again runs nothing and rewrites no file. A trial
    stopped at its rung records every round it ran (rows, TensorBoard, its checkpoint) and says
    stopped; the trials that go on resume from there."""
    from analysis.load import load_events, load_metrics, load_runs
    from fedray.api import tune
    from fedray.storage.loggers.base import read_setting
    from tests.storage.test_loggers import _tensorboard

    docs, paths = {}, {}
    for name, concurrent in (("one", 1), ("many", 0)):
        block = {**HALVING, "max_concurrent_trials": concurrent}
        paths[name] = tune_file(tmp_path / name, block, loggers=["tensorboard"])
        docs[name] = tune(paths[name], quiet=True, progress_s=0.5)
    one, many = tmp_path / "one" / "out", tmp_path / "many" / "out"
    assert (one / "tuned.yaml").read_bytes() == (many / "tuned.yaml").read_bytes()
    (doc,) = docs["one"]
    assert doc["schedule"] == [{"round": 1, "trials": 4}, {"round": 4, "trials": 2}]
    assert doc["stopped_early"] == 2 and doc["trial_rounds"] == 4 * 1 + 2 * 3

    runs = load_runs(one).set_index("run_id")
    metrics = load_metrics(one, scope="global")
    scalars, texts = _tensorboard(one / "tb")
    events = load_events(one)
    for t in doc["trial_list"]:
        (run,) = t["runs"]
        # its loggers show it as one trial of the search, by its searched values
        shown = read_setting(one, run)
        assert shown["parent"] == "search in out" and shown["label"].startswith("lr="), shown
        rounds = sorted(set(metrics.loc[metrics["run_id"] == run, "round"]))
        steps = sorted({s for s, _ in scalars[run]["val/accuracy"]})
        mine = events[events["run_id"] == run]
        if t["stopped"]:
            assert runs.loc[run, "status"] == "stopped" and t["rounds"] == 1
            assert rounds == steps == [1]
            assert (one / "checkpoints" / run / "round-000001").is_dir()
            assert mine["event"].tolist() == ["stopped"] and mine["round"].tolist() == [1]
            assert texts[run]["status/text_summary"][-1][1] == "stopped after round 1"
        else:
            assert runs.loc[run, "status"] == "finished" and t["rounds"] == 4
            assert rounds == steps == [1, 2, 3, 4]
            assert mine["event"].tolist() == ["stopped", "resumed"]  # went on from its rung's checkpoint
    assert "running" not in set(runs["status"])

    before = {p: _digest(p) for p in (one / "tuned.yaml", one / "tune" / "tuned-config.yaml")}
    started = dict(zip(runs.index, runs["started"], strict=True))
    assert tune(paths["one"], quiet=True) == docs["one"]
    assert {p: _digest(p) for p in before} == before
    after = load_runs(one)
    assert dict(zip(after["run_id"], after["started"], strict=True)) == started


def test_trials_train_on_the_gpu_share_they_reserve_auto_as_a_sweeps_run_and_pack_where_they_share_it(
    ray_session, tmp_path
):
    """On the suite's Ray (4 CPUs, 2 logical GPUs, no CUDA: a trial given a GPU trains on the CPU),
    a trial's runs record the GPU Ray gave the trial; auto resolves to what a sweep's run gets; the
    trials of a rung that share a GPU (pack_runs: auto) train in one pack, their updates in one stack."""
    from actors.driver import auto_gpus
    from analysis.load import load_runs
    from fedray.api import tune

    grid = {"search": {"lr": {"grid": [0.05, 0.1, 0.2]}}, "search_alg": "grid", "scheduler": "none"}
    path = tune_file(
        tmp_path,
        grid,
        rounds=2,
        num_cpus_per_actor=1,
        pack_runs="auto",
        batched_clients="on",  # stacked on the CPU too (auto stacks on a GPU only)
        grid={"num_gpus_per_actor": ["auto", 0]},
    )
    tune(path, quiet=True)
    runs = load_runs(tmp_path / "out")
    trials = runs[runs["experiment"] == "tune-test-tune"]
    shares = {float(c["num_gpus_per_actor"]) for c in trials["config"]}
    assert shares == {auto_gpus(1), 0.0} and auto_gpus(1) == 0.5
    for config, summary in zip(trials["config"], trials["summary"], strict=True):
        placement = summary["placement"]
        assert placement["mode"] == "tune trial" and placement["device"] == "cpu"
        if config["num_gpus_per_actor"] > 0:
            assert len(placement["gpu_ids"]) == 1  # its share of one GPU
            assert placement.get("packed") and summary["packed_calls"] > 0  # the rung's three in one stack
        else:
            assert placement["gpu_ids"] == [] and not placement.get("packed")


def test_a_choice_drawn_more_often_than_it_has_values_runs_each_once_and_a_diverged_trial_is_kept_last(
    ray_session, tmp_path
):
    from analysis.load import load_runs
    from fedray.api import tune

    block = {"search": {"lr": {"choice": [0.05, 0.1, 1.0e9]}}, "trials": 7, "scheduler": "none", "seed": 1}
    (doc,) = tune(tune_file(tmp_path, block, rounds=2), quiet=True)
    assert doc["trials"] == 3 and doc["draws"] == 7
    assert sorted(t["values"]["lr"] for t in doc["trial_list"]) == [0.05, 0.1, 1.0e9]
    diverged = [t for t in doc["trial_list"] if t["diverged"]]
    assert [t["values"]["lr"] for t in diverged] == [1.0e9] and doc["diverged"] == 1
    assert doc["chosen"]["lr"] in (0.05, 0.1)
    runs = load_runs(tmp_path / "out")
    assert len(runs) == 3  # one run a setting, however often it was drawn


FAILING = """
import fedray
from fedray.algorithms.baselines import fedavg
from fedray.algorithms.baselines.fedavg import Hparams, State, evaluate, init, models  # noqa: F401


def round(state, fed, hp, rnd):
    if rnd == 1 and fed.task.lr > 0.2:
        raise RuntimeError(f"boom at lr {fed.task.lr}")
    return fedavg.round(state, fed, hp, rnd)


fedray.register_algorithm("fedavg_boom", __import__(__name__))
"""


def test_a_trial_that_fails_is_one_line_naming_it_and_its_error(ray_session, tmp_path):
    plugin = tmp_path / "boom.py"
    plugin.write_text(FAILING)
    block = {"search": {"lr": {"grid": [0.1, 0.3]}}, "search_alg": "grid", "scheduler": "none"}
    path = tune_file(tmp_path, block, rounds=3, algorithm="fedavg_boom", plugins=[str(plugin)])
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    p = subprocess.run([*FEDRAY, "tune", str(path)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 1, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr + p.stdout, f"{p.stdout}\n---\n{p.stderr}"
    assert re.fullmatch(
        r"fedray: error: trial lr=0\.3 \(run fedavg_boom-digits-s0-\w+\) failed: RuntimeError: boom at lr 0\.3 "
        r"\(its traceback: .*/runs/, fedray report\)",
        lines[0],
    ), lines[0]


def test_nothing_in_the_results_folder_is_unpickled_and_a_damaged_record_is_named_not_chosen_around(
    ray_session, tmp_path
):
    """What Ray Tune once restored from OUT/tune/ (a pickle anyone could plant there) is never read:
    the search goes on from its runs' records. A tuned.yaml cut short is written again, the same;
    a run's rows damaged stop the search naming the file, never a choice from what is left."""
    import pickle

    from fedray.api import tune
    from fedray.storage.files import DamagedResults

    class Planted:
        def __reduce__(self):
            return (Path.write_text, (tmp_path / "pwned", "ran"))

    path = tune_file(tmp_path, {**HALVING, "trials": 3, "scheduler": "none"}, rounds=2)
    out = tmp_path / "out"
    for folder in ("tune", "tune/0123456789ab", "tune/0123456789ab/step"):
        (out / folder).mkdir(parents=True, exist_ok=True)
        (out / folder / "tuner.pkl").write_bytes(pickle.dumps(Planted()))
    (doc,) = tune(path, quiet=True)
    assert not (tmp_path / "pwned").exists()
    whole = (out / "tuned.yaml").read_bytes()
    (out / "tuned.yaml").write_bytes(whole[: len(whole) // 2])
    assert tune(path, quiet=True) == [doc]
    assert (out / "tuned.yaml").read_bytes() == whole
    (part,) = sorted((out / "metrics").glob(f"{doc['chosen_runs'][0]}-*.parquet"))
    part.write_bytes(part.read_bytes()[:100])
    with pytest.raises(DamagedResults, match=re.escape(str(part))):
        tune(path, quiet=True)
    assert (out / "tuned.yaml").read_bytes() == whole


def test_python_m_jobs_tune_attached_to_a_running_ray_waits_for_another_search_of_the_folder(
    ray_session, tmp_path
):
    """`ray job submit -- python -m jobs.tune FILE`: the search attaches to the cluster it runs on.
    While another search holds the folder (here: this test, holding its lock as a `fedray tune`
    would) it says once that it waits, then searches when that one ends."""
    import threading

    from analysis.load import load_runs
    from fedray.storage.lock import SearchLock

    path = tune_file(tmp_path, {**HALVING, "trials": 3, "scheduler": "none"}, rounds=2)
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    other = SearchLock(tmp_path / "out")
    other.acquire()
    p = subprocess.Popen(
        [sys.executable, "-m", "jobs.tune", str(path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any("waiting for it to end" in line for line in lines) and time.monotonic() < deadline:
            assert p.poll() is None, p.stderr.read()
            time.sleep(0.1)
        assert not (tmp_path / "out" / "runs").exists()  # nothing ran while it waited
    finally:
        other.release()
    err = p.stderr.read()
    assert p.wait(timeout=300) == 0, err
    reader.join(timeout=10)
    out = "".join(lines)
    waits = [line for line in lines if "waiting for it to end" in line]
    assert len(waits) == 1 and re.search(
        r"another fedray tune \(pid \d+ on this machine\) is searching in ", waits[0]
    )
    assert "chosen: lr=" in out and "run it on test: fedray run" in out
    runs = load_runs(tmp_path / "out")
    assert len(runs) == 3 and set(runs["status"]) == {"finished"}


def test_set_tune_keys_on_the_command_line(tmp_path):
    path = tune_file(tmp_path, LR)
    plan = open_plan(
        path, ["tune.trials=5", "tune.scheduler=none", "rounds=3", "tune.search.lr={uniform: [0.1, 0.2]}"]
    )
    assert plan.spec.trials == 5 and plan.spec.scheduler == "none" and plan.cells[0][1].rounds == 3
    assert plan.spec.search["lr"].kind == "uniform" and plan.spec.search["lr"].args == (0.1, 0.2)
    with pytest.raises(TuneError, match=r"^tune\.trials: an integer >= 1, got 0"):
        open_plan(path, ["tune.trials=0"])


def _doc_commands() -> list[list[str]]:
    """The shell blocks of README.md and docs/tuning.md that run `fedray tune`: their `fedray`
    commands, in order, each block's a list."""
    from tests.conftest import ROOT

    blocks = []
    for page in (ROOT / "README.md", ROOT / "docs" / "tuning.md"):
        for block in re.findall(r"^```bash\n(.*?)^```", page.read_text(), re.S | re.M):
            lines = [line.split("#")[0].strip() for line in block.splitlines()]
            lines = [line for line in lines if line.startswith("fedray ")]
            if any(line.startswith("fedray tune ") for line in lines):
                blocks.append(lines)
    return blocks


@pytest.mark.slow
def test_the_readme_and_tuning_pages_tune_commands_run_against_the_folders_they_name(
    ray_session, tmp_path, monkeypatch, capsys
):
    """Every `fedray tune` the pages show, at a budget this suite affords (3 trials of 4 clients, 4
    rounds of one epoch), then the commands after it in its block (report, run) on the folders it
    named; each as `fedray` runs it, in this process on the suite's Ray (a process each costs its
    imports and its attach, a minute over the six)."""
    import shlex

    from jobs.cli import main
    from tests.conftest import ROOT

    monkeypatch.chdir(tmp_path)

    blocks = _doc_commands()
    assert len(blocks) == 2
    small = [
        *("--set", "rounds=4", "--set", "num_clients=4", "--set", "local_epochs=1", "--set", "num_actors=1"),
        *("--set", "tune.trials=3", "--set", "tune.scheduler=none"),
    ]
    seen, ran = set(), set()
    for block in blocks:
        for line in block:
            if line in ran:  # the pages show some commands twice: run once here
                continue
            ran.add(line)
            args = [str(ROOT / a) if a.startswith("jobs/configs/") else a for a in shlex.split(line)[1:]]
            if args[0] == "tune":
                if "--output" in args:
                    seen.add(args[args.index("--output") + 1])
                args += small
            elif args[0] in ("report", "run"):
                folder = args[1].split("/tune/")[0]
                assert folder in seen, f"{line}: names {folder}, which no tune command above wrote"
            code = main(args)
            out, err = capsys.readouterr()
            assert code == 0, f"{line}\n{out[-2000:]}\n{err[-2000:]}"
            if args[0] == "tune":
                assert "chosen: " in out, out
    assert {"out/tune-asha", "out/tune-table"} <= seen


def test_per_algorithm_searches_tune_each_cell_over_its_own_set_and_run_the_rest_as_they_are(
    ray_session, tmp_path
):
    """A table whose baselines are each tuned over their own set (FedConcat's Table 1 tunes FedProx's
    mu, MOON's mu and FedLC's tau): FedProx's cell searches its mu on validation, FedAvg's has
    nothing to search and runs on test as it is."""
    from analysis.load import load_runs
    from fedray.algorithms import ALGORITHMS
    from fedray.api import tune

    block = {"search": {}, "per_algorithm": {"fedprox": {"hp.mu": {"grid": [0.001, 0.1]}}}}
    path = tune_file(tmp_path, block, rounds=2, grid={"algorithm": ["fedavg", "fedprox"]}, seeds=[0])
    fedavg, fedprox = tune(path, quiet=True)
    assert fedavg["trials"] == 0 and fedavg["chosen"] == {} and "nothing searched" in fedavg["note"]
    assert fedprox["trials"] == 2 and fedprox["chosen"]["hp.mu"] in (0.001, 0.1)
    runs = load_runs(tmp_path / "out")
    on_validation = runs[runs["experiment"] == "tune-test-tune"]
    assert sorted(c["algorithm"] for c in on_validation["config"]) == ["fedprox", "fedprox"]
    on_test = {c["algorithm"]: c for c in runs[runs["experiment"] == "tune-test"]["config"]}
    assert set(on_test) == {"fedavg", "fedprox"}
    hp = ALGORITHMS["fedprox"].full_hparams(on_test["fedprox"]["hp"])  # a default is not written out
    assert hp["mu"] == fedprox["chosen"]["hp.mu"]
    p = subprocess.run(
        [*FEDRAY, "report", str(tmp_path / "out"), "--no-plots"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert "algorithm=fedavg: nothing searched (its config as it is)" in p.stdout


RAY_EXIT_NOISE = [
    "Exception ignored in: <function WeakSet.__init__.<locals>._remove at 0x7f6b06f2a7a0>",
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3.11/_weakrefset.py", line 39, in _remove',
    "    def _remove(item, selfref=ref(self)):",
    "",
    '  File "/venv/lib/python3.11/site-packages/ray/_private/worker.py", line 1063, in sigterm_handler',
    "    raise_sys_exit_with_custom_error_message(",
    '  File "python/ray/_raylet.pyx", line 712, in ray._raylet.raise_sys_exit_with_custom_error_message',
    "SystemExit: 1",
]


WANDB_EXIT_NOISE = [
    "Exception ignored in atexit callback: <function _start_and_connect_service.<locals>.teardown_atexit>",
    "Traceback (most recent call last):",
    '  File "/venv/lib/python3.11/site-packages/wandb/sdk/lib/service/service_connection.py", line 79, in '
    "teardown_atexit",
    "    conn.teardown(hooks.exit_code)",
    '  File "/usr/lib/python3.11/asyncio/streams.py", line 166, in _drain_helper',
    "    raise ConnectionResetError('Connection lost')",
    "ConnectionResetError: Connection lost",
]


def test_a_trial_workers_sigterm_in_a_finalizer_is_not_printed_and_its_own_lines_are():
    # seen once in CI: a trial's worker stopped after its fit printed Ray's SystemExit from inside a
    # WeakSet callback, ten lines before the search's one line naming the failed trial
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    from actors.tune import _QuietWorkerExits, _without_worker_exits

    own = ["Traceback (most recent call last):", '  File "boom.py", line 3, in f', "RuntimeError: boom"]
    assert _without_worker_exits(["round 1", *RAY_EXIT_NOISE, *own, "done"]) == ["round 1", *own, "done"]
    # W&B's exit hook in a trial worker stopped with its service (seen with --logger wandb)
    assert _without_worker_exits([*WANDB_EXIT_NOISE, *own]) == own
    lost = ["Traceback (most recent call last):", '  File "f.py", line 2, in g', "ConnectionResetError: x"]
    assert _without_worker_exits(lost) == lost  # a lost connection of the trial's own: kept
    # a SystemExit that is not Ray's handler's, and a block cut between two batches, are kept
    other = ["Traceback (most recent call last):", '  File "x.py", line 1, in main', "SystemExit: 1"]
    assert _without_worker_exits(other) == other
    assert _without_worker_exits(RAY_EXIT_NOISE[:4]) == RAY_EXIT_NOISE[:4]

    printed: list[list[str]] = []
    saved = dispatcher.handlers  # the suite's own Ray prints through it too: put back after
    dispatcher.handlers = [("ray_print_logs", lambda data: printed.append(data["lines"]))]
    try:
        with _QuietWorkerExits():
            dispatcher.emit({"lines": RAY_EXIT_NOISE, "pid": 1, "is_err": True})
            dispatcher.emit({"lines": ["a line", *RAY_EXIT_NOISE], "pid": 1, "is_err": True})
        dispatcher.emit({"lines": RAY_EXIT_NOISE, "pid": 1, "is_err": True})  # Ray's own handler again
    finally:
        dispatcher.handlers = saved
    assert printed == [["a line"], RAY_EXIT_NOISE]
