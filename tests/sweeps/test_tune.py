"""`fedray tune`: a search on Ray Tune over validation alone, its choice, the tuned table, resuming
after a Ctrl-C, and every bad tune: block refused in one line before anything runs."""

from __future__ import annotations

import os
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
        ({**LR, "scheduler": {"asha": {"grace": 2}}}, {}, r"^tune\.scheduler: asha \(with grace_rounds >= 1"),
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
    from fedray.experiment.validation import load_config
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

    path = tune_file(
        tmp_path,
        {**LR, "trials": 3, "scheduler": {"asha": {"grace_rounds": 1, "reduction_factor": 2}}, "seed": 3},
        grid={"algorithm": ["fedavg", "fedprox"]},
        seeds=[0, 1],
    )
    docs = tune(path, quiet=True)
    out = tmp_path / "out"
    assert [d["cell"] for d in docs] == ["algorithm=fedavg", "algorithm=fedprox"]
    for doc in docs:
        assert doc["trials"] == 3 and doc["trial_rounds"] <= 3 * BASE["rounds"]
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
    assert "6 runs evaluated on validation (tuning's trials) are not in this table" in p.stdout
    # the same command again: everything is there, nothing runs again
    before = {r: s for r, s in zip(runs["run_id"], runs["started"], strict=True)}
    assert tune(path, quiet=True) == docs
    after = load_runs(out)
    assert {r: s for r, s in zip(after["run_id"], after["started"], strict=True)} == before


def test_a_seeded_search_draws_the_same_trials_random_and_optuna(ray_session, tmp_path):
    from fedray.api import tune

    for alg in ("random", "optuna"):
        space = {"lr": {"loguniform": [0.01, 0.5]}, "momentum": {"choice": [0.0, 0.9]}}
        block = {"search": space, "trials": 2, "search_alg": alg, "scheduler": "none", "seed": 7}
        block["max_concurrent_trials"] = 1  # TPE's draws follow the results before them
        a = tune(tune_file(tmp_path / f"{alg}-a", block, rounds=2), quiet=True)
        b = tune(tune_file(tmp_path / f"{alg}-b", block, rounds=2), quiet=True)
        values = [[t["values"] for t in d["trial_list"]] for d in (a[0], b[0])]
        assert values[0] == values[1] and len(values[0]) == 2, alg
        assert a[0]["chosen"] == b[0]["chosen"]


@pytest.mark.slow
def test_ctrl_c_then_the_same_command_keeps_finished_trials_and_resumes_the_rest(tmp_path):
    """On its own Ray of this machine's CPUs (2 here): the trials start no actor of their own, so
    none waits for room its trial did not reserve."""
    from analysis.load import load_metrics, load_runs

    path = tune_file(
        tmp_path,
        {**LR, "trials": 3, "scheduler": "none", "max_concurrent_trials": 1},
        rounds=240,
        eval_every=10,
        checkpoint_every=10,
    )
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
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # the first trial finished, and the second on its way
        runs = load_runs(out) if (out / "runs").is_dir() else None
        if runs is not None and (runs["status"] == "finished").sum() >= 1 and len(runs) >= 2:
            m = load_metrics(out, scope="global")
            if m[~m["run_id"].isin(runs.loc[runs["status"] == "finished", "run_id"])]["round"].max() >= 20:
                break
        time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "the same command goes on" in err
    runs = load_runs(out)
    finished = runs.loc[runs["status"] == "finished", ["run_id", "started"]]
    assert len(finished) >= 1 and (runs["status"] == "interrupted").sum() >= 1
    q = subprocess.run(
        [*FEDRAY, "tune", str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert q.returncode == 0, q.stderr
    again = load_runs(out).set_index("run_id")
    assert len(again) == 3 and set(again["status"]) == {"finished"}
    for run, started in zip(finished["run_id"], finished["started"], strict=True):
        assert again.loc[run, "started"] == started  # kept, not run again
    m = load_metrics(out, scope="global")
    rows = m[m["metric"] == "val_accuracy"].groupby("run_id")["round"]
    assert (rows.count() == 24).all() and (rows.nunique() == 24).all()  # every round once, resumed ones too
    assert "chosen:" in q.stdout and sys.executable
