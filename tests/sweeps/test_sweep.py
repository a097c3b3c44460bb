"""fedray sweep: expansion of grid / cases / seeds, validation before anything starts, what a
re-submission runs, and runs that fail without stopping the others (in-process launcher)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from analysis import load_runs
from fedray.config.keys import ConfigError
from fedray.experiment.checks import from_dict
from fedray.storage.lock import RunLock
from fedray.storage.results import run_state
from fedray.storage.writer import ResultsWriter
from fedray.sweeps.scheduler import LocalLauncher, RunEnded, RunLaunched, run_sweep
from fedray.sweeps.sweep_file import SweepError, load_sweep, plan
from tests.conftest import ROOT
from tests.helpers import SWEEP_BASE, sweep_file


def settings(sweep, *keys):
    return [tuple(r.config.to_dict()[k] if k != "hp" else r.config.hp for k in keys) for r in sweep.runs]


def test_grid_is_a_cartesian_product_first_axis_outermost_seeds_innermost(tmp_path):
    sw = load_sweep(
        sweep_file(tmp_path, "grid:\n  lr: [0.01, 0.1]\n  batch_size: [16, 32, 64]\nseeds: [0, 1]\n")
    )
    assert len(sw.runs) == 12
    assert settings(sw, "lr", "batch_size", "seed")[:4] == [
        (0.01, 16, 0),
        (0.01, 16, 1),
        (0.01, 32, 0),
        (0.01, 32, 1),
    ]
    assert sw.runs[-1].label == "lr=0.1 batch_size=64 seed=1"
    assert [r.index for r in sw.runs] == list(range(1, 13))
    assert len({r.run_id for r in sw.runs}) == 12


def test_cases_vary_several_keys_together_and_carry_their_own_hp_grid(tmp_path):
    sw = load_sweep(
        sweep_file(
            tmp_path,
            """\
            hp: {server_lr: 1.0}
            grid:
              partition:
                - {partition: labels, partition_k: 2}
                - {partition: dirichlet, partition_beta: 0.1}
              algorithm:
                - fedavg
                - {algorithm: fedavg, grid: {hp.server_lr: [0.5, 0.25]}}
            seeds: [3]
            """,
        )
    )
    got = settings(sw, "partition", "partition_k", "partition_beta", "hp")
    assert got == [  # server_lr 1.0 is FedAvg's default: the resolved hp leaves it out
        ("labels", 2, 0.5, {}),
        ("labels", 2, 0.5, {"server_lr": 0.5}),
        ("labels", 2, 0.5, {"server_lr": 0.25}),
        ("dirichlet", 2, 0.1, {}),
        ("dirichlet", 2, 0.1, {"server_lr": 0.5}),
        ("dirichlet", 2, 0.1, {"server_lr": 0.25}),
    ]
    assert sw.runs[1].label == "partition=labels,partition_k=2 algorithm=fedavg,hp.server_lr=0.5 seed=3"


def test_top_level_cases_and_an_hp_axis_of_mappings(tmp_path):
    sw = load_sweep(
        sweep_file(
            tmp_path,
            """\
            hp: {server_lr: 0.5}
            cases:
              - {rounds: 1, local_epochs: 2}
              - {rounds: 3}
            grid:
              hp: [{}, {server_lr: 0.1}]
            """,
        )
    )
    # the hp axis merges into the file's hp; its empty mapping leaves it as it is
    assert settings(sw, "rounds", "local_epochs", "hp") == [
        (1, 2, {"server_lr": 0.5}),
        (1, 2, {"server_lr": 0.1}),
        (3, 1, {"server_lr": 0.5}),
        (3, 1, {"server_lr": 0.1}),
    ]
    assert [r.label for r in sw.runs[:2]] == [
        "rounds=1,local_epochs=2 hp={}",
        "rounds=1,local_epochs=2 hp.server_lr=0.1",
    ]


def test_set_applies_to_every_run_and_identical_runs_are_run_once(tmp_path):
    path = sweep_file(tmp_path, "grid:\n  lr: [0.01, 0.1]\nseeds: [0, 1, 2]\n")
    sw = load_sweep(path, sets=["rounds=1", "seed=0"], output=str(tmp_path / "elsewhere"))
    assert [r.config.rounds for r in sw.runs] == [1, 1]
    assert settings(sw, "lr", "seed") == [(0.01, 0), (0.1, 0)]
    assert sw.collapsed == 4 and sw.output == str(tmp_path / "elsewhere")
    # a label shows the value the run uses where --set replaced its axis value
    assert [r.label for r in sw.runs] == ["lr=0.01 seed=0 (--set seed=0)", "lr=0.1 seed=0 (--set seed=0)"]
    set_lr = load_sweep(path, sets=["lr=0.5", "rounds=1"])
    assert [r.label for r in set_lr.runs] == [f"lr=0.01 seed={s} (--set lr=0.5)" for s in (0, 1, 2)]
    only = load_sweep(path, only=["lr=0.1", "seed=2"])
    assert [r.label for r in only.runs] == ["lr=0.1 seed=2"] and only.runs[0].index == 6
    with pytest.raises(SweepError, match=r"no run has lr=0.5 \(--only\)$"):
        load_sweep(path, only=["lr=0.5"])
    named = sweep_file(tmp_path / "named", "grid:\n  partition: [iid, dirichlet]\n")
    with pytest.raises(
        SweepError, match=r"no run has partition=dirichle \(--only\); did you mean 'partition=dirichlet'\?$"
    ):
        load_sweep(named, only=["partition=dirichle"])
    # auto becomes a share only where the runs go: --only is told which value it can match
    with pytest.raises(
        SweepError, match=r"no run has num_gpus_per_actor=0.5 \(--only\); .* is auto .*=auto picks them$"
    ):
        load_sweep(path, sets=["num_gpus_per_actor=auto"], only=["num_gpus_per_actor=0.5"])
    # ... and only where =auto would pick runs
    for only in (["num_gpus_per_actor=0.5", "lr=0.5"], ["num_gpus_per_actor=auto", "lr=0.5"]):
        with pytest.raises(SweepError, match=r"\(--only\)$"):
            load_sweep(path, sets=["num_gpus_per_actor=auto"], only=only)
    assert len(load_sweep(path, sets=["num_gpus_per_actor=auto"], only=["num_gpus_per_actor=auto"]).runs) == 6
    with pytest.raises(SweepError, match=r"--only lrr: unknown config key; did you mean 'lr'\?"):
        load_sweep(path, only=["lrr=0.1"])
    with pytest.raises(ConfigError, match=r"--only 'lr': expected key=value"):
        load_sweep(path, only=["lr"])


@pytest.mark.parametrize(
    "body, pattern",
    [
        ("grid: [1, 2]\n", r"grid: expected a mapping"),
        ("grid:\n  lr: 0.1\n", r"grid.lr: expected a non-empty list"),
        ("grid:\n  lr: []\n", r"grid.lr: expected a non-empty list"),
        ("seeds: [0, -1]\n", r"seeds: expected a non-empty list of integers >= 0"),
        ("cases: [1, 2]\n", r"cases\[0\]: a case must be a mapping"),
        ("max_concurrent_runs: -1\n", r"max_concurrent_runs: expected an integer >= 0"),
        (
            "grid:\n  partition_beta: [0.1]\n  partition: [{partition: dirichlet, partition_beta: 0.5}]\n",
            r"key 'partition_beta' is set by two axes, 'partition_beta' and 'partition'",
        ),
        ("grid:\n  seed: [1]\nseeds: [0]\n", r"key 'seed' is set by two axes, 'seed' and 'seeds'"),
        (
            "grid:\n  algorithm: [{algorithm: fedavg, hp.server_lr: 1, grid: {hp.server_lr: [2]}}]\n",
            r"key 'hp.server_lr' is set by two axes",
        ),
    ],
)
def test_malformed_sweeps_are_rejected_naming_the_key(tmp_path, body, pattern):
    with pytest.raises(SweepError, match=pattern) as e:
        load_sweep(sweep_file(tmp_path, body))
    assert str(e.value).count("is set by two axes") <= 1  # once: not by the grid and the sweep both


BAD = """\
grid:
  partition:
    - {partition: labels, partition_k: 2}
    - {partition: labels, partition_k: 11}
  algorithm:
    - fedavg
    - {algorithm: fedavg, hp: {server_lr: -1}}
    - {algorithm: fedavgg}
seeds: [0, 1]
"""


def test_every_invalid_run_is_listed_at_once_naming_the_run_and_the_key(tmp_path):
    with pytest.raises(SweepError) as info:
        load_sweep(sweep_file(tmp_path, BAD))
    msg = str(info.value)
    # 12 runs: 6 with k=11 and 4 more with a bad algorithm or hp among the k=2 ones
    assert "10 of 12 runs are invalid; nothing was started" in msg
    # with --only, the invalid ones counted are those it picks, and the message says so
    with pytest.raises(SweepError, match=r"2 of 12 runs are invalid \(of those --only picks\); nothing"):
        load_sweep(sweep_file(tmp_path, BAD), only=["partition_k=11", "algorithm=fedavg", "hp.server_lr=1.0"])
    assert "config key 'partition_k': #C=k needs 1 <= k <= 10" in msg
    assert "in run [partition=labels,partition_k=11 algorithm=fedavg seed=1]" in msg
    assert "config key 'hp.server_lr': must be > 0, got -1.0" in msg
    assert "in run [partition=labels,partition_k=2 algorithm=fedavg,hp.server_lr=-1 seed=0]" in msg
    assert "unknown value 'fedavgg'; did you mean 'fedavg'?" in msg
    assert "in run [partition=labels,partition_k=2 algorithm=fedavgg seed=1]" in msg


def test_the_cli_rejects_an_invalid_sweep_before_importing_ray_and_writes_nothing(tmp_path):
    from tests.helpers import CHECK_NO_RAY

    path = sweep_file(tmp_path, BAD)
    p = subprocess.run(
        [sys.executable, "-c", CHECK_NO_RAY, "sweep", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2, p.stderr
    assert "10 of 12 runs are invalid" in p.stderr and "partition_k" in p.stderr and "fedavgg" in p.stderr
    assert not (tmp_path / "out").exists()


def test_a_missing_dataset_is_reported_for_the_runs_that_read_it(tmp_path):
    body = "grid:\n  dataset: [synthetic, fmnist]\n  model: [mlp]\ndata_root: /nonexistent\n"
    with pytest.raises(
        SweepError, match=r"(?s)1 of 2 runs is invalid.*fmnist.*in run \[dataset=fmnist model=mlp\]"
    ):
        load_sweep(sweep_file(tmp_path, body))


def _collect(events):
    out = []
    for ev in events:
        out.append(ev)
    return out


def test_a_failing_run_leaves_the_others_finished_and_a_resubmission_reruns_only_it(tmp_path):
    # lr 1e30 diverges to non-finite values in its first round: a failure from inside the run.
    path = sweep_file(tmp_path, "grid:\n  lr: [0.05, 1.0e30, 0.1]\n")
    sw = load_sweep(path)
    assert [p.state for p in plan(sw)] == ["new"] * 3
    events = _collect(run_sweep(sw.runs, LocalLauncher()))
    ended = {e.run.index: e for e in events if isinstance(e, RunEnded)}
    assert ended[1].ok and ended[3].ok and "final_accuracy" in ended[1].summary
    assert isinstance(ended[2].error, FloatingPointError)
    runs = load_runs(sw.output).set_index("run_id")
    assert [runs.loc[r.run_id, "status"] for r in sw.runs] == ["finished", "failed", "finished"]

    again = plan(load_sweep(path))
    assert [(p.state, p.action) for p in again] == [
        ("finished", "skip"),
        ("failed", "run"),
        ("finished", "skip"),
    ]
    assert [p.action for p in plan(load_sweep(path), force=True)] == ["run"] * 3
    first_start = runs.loc[sw.runs[1].run_id, "started"]
    rerun = [p.run for p in again if p.action == "run"]
    events = _collect(run_sweep(rerun, LocalLauncher()))
    assert [e.run.index for e in events if isinstance(e, RunLaunched)] == [2]
    assert load_runs(sw.output).set_index("run_id").loc[sw.runs[1].run_id, "started"] > first_start


def test_interrupted_runs_are_rerun_but_a_run_another_process_is_writing_is_left_alone(tmp_path):
    sw = load_sweep(sweep_file(tmp_path, "grid:\n  lr: [0.05, 0.1]\n"))
    a, b = sw.runs
    # a: started and never finished, its process gone (no lock held) -> interrupted
    ResultsWriter(a.config.output, a.run_id, a.config.to_dict())._write_run("running")
    # b: being written right now by a live writer (this process holds its lock)
    live = ResultsWriter(b.config.output, b.run_id, b.config.to_dict())
    live.start()
    try:
        assert run_state(sw.output, a.run_id) == "interrupted"
        assert run_state(sw.output, b.run_id) == "running"
        # the report (analysis.load_runs) tells the two apart the same way, and probing writes nothing
        lockfile = Path(sw.output) / "runs" / f".{b.run_id}.lock"
        before = lockfile.read_bytes()
        runs = load_runs(sw.output).set_index("run_id")["status"]
        assert (runs[a.run_id], runs[b.run_id]) == ("interrupted", "running")
        assert lockfile.read_bytes() == before
        assert [(p.state, p.action) for p in plan(sw, force=True)] == [
            ("interrupted", "run"),
            ("running", "skip"),
        ]
    finally:
        live.finish({})
    assert run_state(sw.output, b.run_id) == "finished"


def test_a_second_writer_of_a_live_run_fails_at_once_and_deletes_nothing(tmp_path):
    from fedray.records import rec
    from fedray.storage.lock import RunLocked

    out = tmp_path / "out"
    cfg = {
        "experiment": "x",
        "algorithm": "fedavg",
        "dataset": "d",
        "partition": "iid",
        "model": "mlp",
        "seed": 0,
        "num_clients": 2,
        "rounds": 1,
    }
    first = ResultsWriter(out, "r", cfg, flush_every_s=0)
    first.start()
    first.add(1, [rec("accuracy", 0.5)])
    with pytest.raises(RunLocked, match=r"run r is being written .* by another process \(pid \d+"):
        ResultsWriter(out, "r", cfg).start()
    # the first writer's part file is still there
    assert len(list((out / "metrics").glob("r-*.parquet"))) == 1
    first.finish({})
    assert not RunLock(out, "r").held_elsewhere()


def test_only_matches_an_hp_value_the_config_leaves_at_its_default(tmp_path):
    # FedLC's default tau is 1.0: the run with hp.tau=1.0 names no tau in its (canonical) config,
    # and --only hp.tau=1.0 must still find it, and only it.
    path = sweep_file(tmp_path, "algorithm: fedlc\ngrid:\n  hp.tau: [0.1, 1.0, 5.0]\n")
    sw = load_sweep(path)
    assert [r.config.hp for r in sw.runs] == [{"tau": 0.1}, {}, {"tau": 5.0}]
    only = load_sweep(path, only=["hp.tau=1.0"])
    assert [r.index for r in only.runs] == [2]
    assert [r.index for r in load_sweep(path, only=["hp.tau=5"]).runs] == [3]  # 5 == 5.0
    with pytest.raises(SweepError, match=r"--only hp.tauu: unknown config key; did you mean 'hp.tau'\?"):
        load_sweep(path, only=["hp.tauu=1"])


def test_a_sweeps_invalid_runs_list_every_mistake_with_the_runs_it_is_in(tmp_path):
    # Each run's mistakes are all told (not only its first), each once, with the runs that have it.
    path = sweep_file(tmp_path, "grid:\n  local_epochs: [0, 1]\n  batch_size: [0]\nseeds: [0]\n")
    with pytest.raises(SweepError) as e:
        load_sweep(path)
    assert str(e.value).splitlines()[1:] == [
        "  config key 'local_epochs': must be >= 1, got 0",
        "    in run [local_epochs=0 batch_size=0 seed=0]",
        "  config key 'batch_size': must be >= 1, got 0",
        "    in all 2 runs",
    ]
    assert "2 of 2 runs are invalid" in str(e.value)


def test_a_mistake_in_every_run_says_so_and_where_its_value_was_set(tmp_path):
    # A run's label shows its axes' values only: a value set by --set or at the file's top level is
    # named where it was set, and a mistake every run has reads "in all N runs", not N labels.
    path = sweep_file(tmp_path, "rounds: 0\ngrid:\n  lr: [0.05, -0.1]\nseeds: [0, 1]\n")
    with pytest.raises(SweepError) as e:
        load_sweep(path, sets=["local_epochs=-1"])
    assert str(e.value).splitlines()[1:] == [
        "  config key 'rounds': must be >= 1, got 0 (set at the file's top level)",
        "    in all 4 runs",
        "  config key 'local_epochs': must be >= 1, got -1 (set by --set local_epochs=-1)",
        "    in all 4 runs",
        "  config key 'lr': must be > 0, got -0.1",
        "    in run [lr=-0.1 seed=0]",
        "    in run [lr=-0.1 seed=1]",
    ]
    # --set over an axis's key: every run has its value. An hp key the algorithm lacks is told in the
    # same message as a wrong type (each key's own checks, all at once).
    with pytest.raises(SweepError) as e:
        load_sweep(path, sets=["rounds=2", "lr=abc", "hp.mu=1"])
    assert str(e.value).splitlines()[1:] == [
        "  config key 'lr': expected a number, got 'abc' (set by --set lr=abc)",
        "    in all 4 runs",
        "  unknown config key 'hp.mu' for algorithm fedavg (its hp keys: drop_last, drop_stragglers, "
        "persistent_optimizer, server_lr, stragglers) (set by --set hp.mu=1)",
        "    in all 4 runs",
    ]
    # every --set echoes back as typed: YAML reads on as true (once echoed "pack_runs=true"), -1.0e+2
    # as -100.0
    clean = sweep_file(tmp_path, "rounds: 1\nseeds: [0, 1]\n")
    for typed in ("pack_runs=on", "lr=-1.0e+2"):
        with pytest.raises(SweepError) as e:
            load_sweep(clean, sets=[typed])
        assert f"(set by --set {typed})" in str(e.value), str(e.value)


def test_a_quiet_sweep_prints_its_plan_and_summary_not_each_runs_lines(tmp_path, capsys):
    from jobs.cli import main

    path = sweep_file(tmp_path, "rounds: 1\ngrid:\n  lr: [0.05, 1.0e30]\n")  # the second diverges
    assert main(["sweep", str(path), "--local", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "2 new; to run: 2" in out and "sweep done in" in out and "1 finished, 1 failed, 0 skipped" in out
    assert "  FAILED #2 lr=1.0e30" in out and "FloatingPointError" in out  # a failure is still told
    assert "#1 start" not in out and "#1 done" not in out


def test_only_is_not_blocked_by_a_run_it_leaves_out(tmp_path):
    # A sweep with some invalid runs runs the valid ones --only asks for (the user is told of
    # the others when they ask for them); partitions and data are checked for the chosen runs only.
    path = sweep_file(tmp_path, "grid:\n  local_epochs: [1, 0]\nseeds: [0]\n")
    with pytest.raises(SweepError, match=r"(?s)1 of 2 runs is invalid.*'local_epochs'"):
        load_sweep(path)
    only = load_sweep(path, only=["local_epochs=1"])
    assert [r.label for r in only.runs] == ["local_epochs=1 seed=0"] and only.runs[0].index == 1
    with pytest.raises(SweepError, match=r"'local_epochs'"):
        load_sweep(path, only=["local_epochs=0"])


# ------------------------------------------------------------------------------------------------
# Keys only some partitions (datasets) read
# ------------------------------------------------------------------------------------------------

PARTITIONS_AXIS = """\
grid:
  partition: [labels, dirichlet]
"""


def test_a_key_set_for_the_whole_grid_counts_only_for_the_runs_that_read_it(tmp_path):
    with_k = load_sweep(sweep_file(tmp_path / "a", "partition_k: 3\n" + PARTITIONS_AXIS))
    without = load_sweep(sweep_file(tmp_path / "b", PARTITIONS_AXIS))
    assert settings(with_k, "partition", "partition_k") == [("labels", 3), ("dirichlet", 2)]
    # the Dirichlet run is the run it is without partition_k: same config, same run id
    assert with_k.runs[1].run_id == without.runs[1].run_id
    assert with_k.runs[0].run_id != without.runs[0].run_id
    # --set for every run is the same: partition_k=3 counts for the labels runs only
    via_set = load_sweep(sweep_file(tmp_path / "c", PARTITIONS_AXIS), sets=["partition_k=3"])
    assert [r.run_id for r in via_set.runs] == [r.run_id for r in with_k.runs]
    # datasets too: synthetic_size is the synthetic dataset's key
    data = load_sweep(sweep_file(tmp_path / "d", "grid:\n  dataset: [synthetic, digits]\n"))
    # 2000: the default
    assert settings(data, "dataset", "synthetic_size") == [
        ("synthetic", 600),
        ("digits", 2000),
    ]
    digits = {k: v for k, v in yaml.safe_load(SWEEP_BASE).items() if k != "synthetic_size"}
    assert data.runs[1].run_id == from_dict({**digits, "dataset": "digits"}).run_id()


def test_runs_that_differ_only_in_a_key_their_partition_does_not_read_are_one_run(tmp_path):
    sw = load_sweep(sweep_file(tmp_path, "grid:\n  partition: [labels, dirichlet]\n  partition_k: [2, 3]\n"))
    assert settings(sw, "partition", "partition_k") == [("labels", 2), ("labels", 3), ("dirichlet", 2)]
    assert sw.collapsed == 1 and len({r.run_id for r in sw.runs}) == 3


@pytest.mark.parametrize(
    "body,sets,message",
    [  # an axis over a key no run's partition reads
        (
            "grid:\n  partition_k: [2, 3]\n",
            [],
            "grid.partition_k: config key 'partition_k' is not read by partition 'dirichlet' (it is read by: labels)",
        ),
        (
            "grid:\n  partition: [iid, rotation]\n  partition_min_size: [5, 20]\n",
            [],
            "grid.partition_min_size: config key 'partition_min_size' is not read by partitions 'iid', 'rotation' "
            "(it is read by: dirichlet, quantity)",
        ),
        # a case that sets a key its own partition does not read (another case reads it)
        (
            "grid:\n  partition:\n    - {partition: labels, partition_k: 3}\n    - {partition: dirichlet, partition_k: 4}\n",
            [],
            "grid.partition[1]: config key 'partition_k' is not read by partition 'dirichlet'",
        ),
        # the file's top level, and --set, reaching no run that reads the key
        (
            "partition_beta: 0.1\ngrid:\n  partition: [iid, labels]\n",
            [],
            "config key 'partition_beta' is not read by partitions 'iid', 'labels'",
        ),
        (
            "grid:\n  lr: [0.1, 0.2]\n",
            ["partition_k=3"],
            "--set: config key 'partition_k' is not read by partition 'dirichlet' (it is read by: labels)",
        ),
        (
            "grid:\n  emnist_split: [letters, digits]\n",
            [],
            "grid.emnist_split: config key 'emnist_split' is not read by dataset 'synthetic' (it is read by: emnist)",
        ),
    ],
)
def test_a_key_no_run_reads_is_an_error_naming_where_it_is_set(tmp_path, body, sets, message):
    with pytest.raises(SweepError) as e:
        load_sweep(sweep_file(tmp_path, body), sets=sets)
    assert message in str(e.value) and "invalid sweep; nothing was started" in str(e.value)


def test_a_set_partition_lets_the_files_keys_for_its_own_partitions_go(tmp_path):
    path = sweep_file(tmp_path, "partition_beta: 0.1\ngrid:\n  lr: [0.1, 0.2]\n")
    sw = load_sweep(path, sets=["partition=labels", "partition_k=3"])
    assert settings(sw, "partition", "partition_k", "partition_beta") == [("labels", 3, 0.5)] * 2


def test_two_sweeps_over_one_folder_at_once_both_exit_0_each_counting_what_it_ran(tmp_path):
    # Before: no run was done twice and the numbers were right, but both exited 1 naming runs
    # "FAILED ... RunLocked", and one counted a run the other finished as its own.
    import re

    # rounds enough that the two overlap (a sweep that starts once the other is done finds nothing
    # to run, and says so: counted 0)
    path = sweep_file(tmp_path, "rounds: 30\nnum_clients: 6\nseeds: [0, 1, 2, 3]\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "jobs.cli", "sweep", str(path), "--local", "--output", str(out)]
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [out[-2000:] + err[-2000:] for out, err in outs]
    ran = []
    for stdout, _ in outs:
        assert "FAILED" not in stdout and "RunLocked" not in stdout, stdout
        done = re.search(r"sweep done in \S+: (\d+) finished, 0 failed, (\d+) skipped", stdout)
        assert done or "4 finished; to run: 0" in stdout, stdout
        ran.append(int(done[1]) if done else 0)
    assert sum(ran) == 4  # every run once, counted by the sweep that ran it
    runs = load_runs(out)
    assert sorted(runs["status"]) == ["finished"] * 4
    from analysis import load_metrics

    m = load_metrics(out)
    assert not m.duplicated(["run_id", "round", "metric", "scope", "entity"]).any()  # no run done twice


def test_hostile_or_huge_yaml_is_refused_in_one_line_within_limits(tmp_path):
    # Before: a billion-laughs alias bomb as a value took about 3 GB and 80 s before a MemoryError; a
    # 5,000-level flow mapping gave a 3,000-line RecursionError; a 20 MB file took 137 s and 2.5 GB;
    # a NUL in a key went raw to the terminal; a 10^6-run grid's dry run answered nothing in minutes.
    import time

    from fedray.config.keys import MAX_FILE_BYTES
    from fedray.sweeps.sweep_file import MAX_RUNS

    def refused(text: str, match: str) -> str:
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        t0 = time.perf_counter()
        with pytest.raises(ConfigError, match=match) as e:
            load_sweep(path)
        assert time.perf_counter() - t0 < 30 and "\n" not in str(e.value).split("nothing was started:")[0]
        return str(e.value)

    laughs = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    laughs += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    refused(
        "\n".join(laughs) + "\nrounds: 1\n",
        r"refused: more than 100,000 values once its aliases are expanded",
    )
    refused("x: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", r"refused: nested more than 32 levels deep")
    big = "rounds: 1\nnote: '" + "x" * (MAX_FILE_BYTES + 10) + "'\n"
    refused(big, rf"is {len(big):,} bytes; a config or sweep file is at most {MAX_FILE_BYTES:,}")
    said = refused('rounds: 1\n"ke\\0y": 1\n', r"unknown config key")
    assert "\x00" not in said and "\\x00" in said  # escaped, never written raw to a terminal
    said = refused("rounds: 1\nlr: '" + "9" * 5000 + "'\n", r"config key 'lr'")
    assert "more characters)" in said and len(max(said.splitlines(), key=len)) < 1100
    axis = "[" + ", ".join(str(i) for i in range(1, 11)) + "]"
    grid = "".join(
        f"  {k}: {axis}\n"
        for k in ("rounds", "local_epochs", "batch_size", "num_clients", "seed", "eval_every")
    )
    refused(f"grid:\n{grid}", rf"expands to 1,000,000 runs; a sweep file makes at most {MAX_RUNS:,}")


HOLDER = """
import os, sys, time
from pathlib import Path
from fedray.storage.writer import ResultsWriter
from fedray.sweeps.sweep_file import load_sweep
path, out, when = sys.argv[1:4]
runs = load_sweep(path, output=out).runs
w = ResultsWriter(out, runs[0].run_id, runs[0].config.to_dict(), flush_every_s=0)
w.start()  # run #1 is being written: its row says running, its lock is held
print("held", flush=True)
# stopped (killed, as it were) while the sweep runs #2, or once the sweep waits for #1
mark = Path(out) / "runs" / f"{runs[1].run_id}.parquet" if when == "running-2" else Path(sys.argv[4])
while not mark.exists():
    time.sleep(0.05)
os._exit(3)
"""


@pytest.mark.parametrize("when", ["running-2", "waiting"])
def test_a_sweep_is_not_done_while_runs_another_process_was_writing_are_unfinished(tmp_path, when):
    # Before: the other process killed after this sweep planned, the sweep said "1 finished, 0 failed,
    # 1 skipped" and exited 0 with a run left interrupted. A run another process still writes is
    # waited for (two sweeps over one folder both exit 0 once every run is done: the test above).
    path = sweep_file(tmp_path, "rounds: 6\nnum_clients: 6\nseeds: [0, 1]\n")
    out, stop = tmp_path / "out", tmp_path / "stop"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(out), when, str(stop)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        sweep = subprocess.Popen(
            [sys.executable, "-m", "jobs.cli", "sweep", str(path), "--local", "--output", str(out)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if when == "waiting":
            lines = []
            for line in sweep.stdout:  # the sweep ran #2 and waits for #1: then its writer stops
                lines.append(line)
                if line.startswith("waiting for 1 runs another process is writing (#1)"):
                    stop.touch()
                    break
            rest, err = sweep.communicate(timeout=300)
            stdout = "".join(lines) + rest
        else:
            stdout, err = sweep.communicate(timeout=300)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
    assert sweep.returncode == 1, stdout + err
    assert "NOT FINISHED #1 seed=0 (" in stdout and "interrupted by the process that was writing it" in stdout
    assert "1 run of this sweep that another process was writing is not finished" in stdout
    assert load_runs(out).set_index("seed").loc[1, "status"] == "finished"
