"""What a new user meets first (issue 22): bad input fails in seconds, before Ray, naming the key;
defaults that run; every algorithm a table can show."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedray.config.keys import ConfigError
from fedray.experiment.checks import from_dict
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import execute
from fedray.records import TIMING_METRICS
from tests.conftest import ROOT, small_config

# The CLI in a fresh interpreter; fails if Ray was imported on the way to the answer.
NO_RAY = (
    "import sys; from jobs.cli import main; rc = main(sys.argv[1:]); "
    "assert 'ray' not in sys.modules, 'ray was imported'; sys.exit(rc)"
)


def cli(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", NO_RAY, *args], cwd=ROOT, capture_output=True, text=True, timeout=180
    )


@pytest.mark.parametrize("command", ["run", "sweep", "sweep --dry-run"])
def test_an_output_folder_that_cannot_be_written_is_refused_before_anything_starts(tmp_path, command):
    command, *flags = command.split()
    target = ["jobs/configs/digits_sweep.yaml"] if command == "sweep" else []
    p = cli(tmp_path, command, *target, *flags, "--output", "/proc/fedray-cannot-write-here")
    assert p.returncode == 2, p.stderr
    assert "config key 'output': cannot write results to '/proc/fedray-cannot-write-here'" in p.stderr
    assert "recorded" not in p.stderr  # nothing claims a record that was not written


def test_a_dry_run_leaves_the_disk_as_it_was(tmp_path):
    out = tmp_path / "not" / "yet"
    p = cli(tmp_path, "sweep", "jobs/configs/digits_sweep.yaml", "--dry-run", "--output", str(out))
    assert p.returncode == 0, p.stderr
    assert "4 new; to run: 4" in p.stdout
    assert list(tmp_path.iterdir()) == []  # no results folder, no probe left behind


def test_a_partition_that_cannot_be_drawn_fails_before_ray(tmp_path):
    # Dir(0.5) over 100 clients of 600 samples: some client always ends below 10 samples.
    p = cli(
        tmp_path,
        "run",
        "--set",
        "dataset=synthetic",
        "--set",
        "synthetic_size=600",
        "--set",
        "num_clients=100",
        "--output",
        str(tmp_path / "out"),
    )
    assert p.returncode == 2, p.stderr
    assert "config key 'partition_beta': Dir(0.5) over 100 clients gave a client with fewer than" in p.stderr
    assert not (tmp_path / "out" / "runs").exists()


def run(cfg) -> list:
    return [ev for ev in execute(cfg, make_local_federation)]


def test_layercfl_runs_on_every_model_by_default(tmp_path):
    cfg = small_config(tmp_path, algorithm="layercfl", rounds=2)  # an MLP: no convolutions
    assert cfg.hp == {}  # the default, auto: the first FC layer here, the convolutions on a CNN
    assert run(cfg)[-1].summary["rounds_done"] == 2
    with pytest.raises(ConfigError, match=r"'conv' finds no such layer in EncoderHead.*set hp.layers to fc"):
        small_config(tmp_path, algorithm="layercfl", hp={"layers": "conv"})


@pytest.mark.parametrize("algorithm", ["clusterfedavg", "ifca", "cfl", "fesem", "fedsoft"])
def test_clustered_algorithms_record_a_global_accuracy_by_the_lowest_loss_rule(tmp_path, algorithm):
    hp = {"groups": "kmeans", "num_clusters": 2} if algorithm == "clusterfedavg" else {}
    if algorithm in ("ifca", "fesem", "fedsoft"):
        hp = {"num_clusters": 2}
    events = run(small_config(tmp_path, algorithm=algorithm, rounds=2, hp=hp))
    assert "final_accuracy" in events[-1].summary
    from analysis import load_metrics

    m = load_metrics(tmp_path / "out")
    last = m[m["round"] == 2]
    cl = last[last["scope"] == "cluster"].pivot_table(index="entity", columns="metric", values="value")
    best = cl["loss"].idxmin()
    glob = last[last["scope"] == "global"].set_index("metric")["value"]
    assert glob["accuracy"] == cl.loc[best, "accuracy"] and glob["loss"] == cl.loc[best, "loss"]
    assert glob["global_model"] == best


def test_a_shift_preset_keeps_fedrcs_test_split_unless_the_user_sets_one():
    base = {
        "dataset": "fmnist",
        "model": "fedrc_cnn",
        "num_clients": 300,
        "partition": "clientwise_dirichlet",
        "partition_beta": 1.0,
    }
    assert from_dict({**base, "shift": "fedrc_code"}).client_test_fraction == 0.1
    assert from_dict({**base, "shift": "fedrc_code", "client_test_fraction": 0.2}).client_test_fraction == 0.2
    assert from_dict({**base, "shift": "fedrc_code", "client_test_fraction": 0}).client_test_fraction == 0.0
    assert from_dict(base).client_test_fraction == 0.0


def test_fedconcat_rounds_follow_its_stages_unless_set():
    cfg = from_dict({"algorithm": "fedconcat", "hp": {"encoder_rounds": 12, "classifier_rounds": 57}})
    assert cfg.rounds == 69
    assert (
        from_dict({"algorithm": "fedconcat_id", "hp": {"encoder_rounds": 2, "classifier_rounds": 3}}).rounds
        == 5
    )
    assert (
        from_dict(
            {"algorithm": "fedconcat", "hp": {"encoder_rounds": 12, "classifier_rounds": 57}, "rounds": 69}
        ).rounds
        == 69
    )
    with pytest.raises(
        ConfigError,
        match="hp.encoder_rounds \\+ hp.classifier_rounds = 12 \\+ 57 = 69 rounds, but rounds is 70",
    ):
        from_dict(
            {"algorithm": "fedconcat", "hp": {"encoder_rounds": 12, "classifier_rounds": 57}, "rounds": 70}
        )


def _pooled_train_accuracy(cfg, model_of) -> float:
    """Worked out apart from the algorithm: every training client's predictor (``model_of(cid)``) on
    its own training split, pooled over the samples."""
    import torch

    from fedray.data import build_federated_data

    data = build_federated_data(cfg)
    correct = total = 0
    for cid, ix in data.clients.items():
        x = data.dataset.spec.to_tensor(data.dataset.train.x[ix.train])
        with torch.no_grad():
            pred = model_of(cid)(x).argmax(1).numpy()
        correct += int((pred == data.dataset.train.y[ix.train]).sum())
        total += len(ix.train)
    return correct / total


@pytest.mark.parametrize("algorithm", ["fedavg", "ifca"])
def test_train_accuracy_is_each_clients_predictor_on_its_training_split(tmp_path, algorithm):
    # One definition for every algorithm (the FedRC code's, which `--at best-train` reads): after the
    # round, the model each client predicts with, on its own training split, pooled. Not the running
    # accuracy of local SGD (sgd_accuracy), which differs.
    from analysis import load_assignments, load_metrics, load_models

    hp = {"num_clusters": 2} if algorithm == "ifca" else {}
    cfg = small_config(tmp_path, algorithm=algorithm, rounds=2, hp=hp)
    run(cfg)
    m = load_metrics(cfg.output, scope="global")
    last = m[m["round"] == 2].set_index("metric")["value"]
    models = load_models(cfg.output, cfg.run_id())
    if algorithm == "fedavg":
        expected = _pooled_train_accuracy(cfg, lambda cid: models["global"])
    else:
        a = load_assignments(cfg.output)
        final = a[a["round"] == a["round"].max()].set_index("client")["cluster"]
        expected = _pooled_train_accuracy(cfg, lambda cid: models[f"cluster-{final[cid]}"])
    assert last["train_accuracy"] == pytest.approx(expected, abs=1e-12)
    assert "sgd_accuracy" in last  # the running accuracy of the round's SGD steps, under its own name


def test_eval_train_false_skips_only_the_training_split_evaluation(tmp_path):
    # eval_train: false drops train_accuracy/train_loss (a pass over the whole training set each
    # evaluation) and nothing else: the same run's other numbers are bit-identical, and a config that
    # leaves the key at its default keeps the run id it had before the key existed.
    from analysis import load_metrics

    on = small_config(tmp_path / "on", rounds=2)
    off = small_config(tmp_path / "off", rounds=2, eval_train=False)
    run(on)
    run(off)
    a, b = (load_metrics(c.output, scope="global").set_index(["round", "metric"])["value"] for c in (on, off))
    assert {"train_accuracy", "train_loss"} <= set(a.index.get_level_values("metric"))
    assert not {"train_accuracy", "train_loss"} & set(b.index.get_level_values("metric"))
    timing = TIMING_METRICS
    keep = [k for k in a.index if k[1] not in timing | {"train_accuracy", "train_loss"}]
    assert a[keep].equals(b[keep])
    assert on.run_id() != off.run_id()
    assert on.run_id() == "fedavg-synthetic-s0-70e32ccd87"  # the id this config had before eval_train existed


# ------------------------------------------------------------------------------------------------
# The front door, second pass (issue 42)
# ------------------------------------------------------------------------------------------------


def test_fedray_bench_passes_its_options_on(capsys):
    from jobs.cli import main

    with pytest.raises(SystemExit) as e:  # the benchmark's own --help: its options reached it
        main(["bench", "--help"])
    assert e.value.code == 0 and "--memory-format" in capsys.readouterr().out


def test_help_sets_the_maintainers_commands_apart(capsys):
    from jobs.cli import build_parser, main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "{run,sweep,tune,report,bench}" in out and "    tune " in out and "maintainers' commands" in out
    listed = out.split("maintainers' commands")[0]
    assert all(f"    {c} " not in listed for c in ("fidelity", "docs", "reference"))
    assert build_parser().parse_args(["docs", "--check"]).check  # still there for those who use them


def test_runs_last_line_says_how_to_look_and_report_says_when_runs_are_left_out(tmp_path, capsys):
    from fedray.storage.writer import ResultsWriter
    from jobs.cli import main

    out = tmp_path / "out"
    assert (
        main(["run", "--local", "--set", "rounds=1", "--set", "eval_train=false", "--output", str(out)]) == 0
    )
    assert capsys.readouterr().out.rstrip().endswith(f"results in {out}/ (fedray report {out})")
    only_unfinished = tmp_path / "unfinished"
    cfg = small_config(only_unfinished)
    w = ResultsWriter(cfg.output, cfg.run_id(), cfg.to_dict())
    w.acquire()
    w.start()
    w.fail("RuntimeError: boom", {})
    assert main(["report", str(cfg.output), "--no-plots"]) == 1  # no table: a script can tell
    assert (
        "no finished runs in" in (text := capsys.readouterr().out)
        and "1 not finished: --all includes them" in text
    )


def test_an_unreachable_ray_address_fails_before_ray_tries_it_naming_it(tmp_path, monkeypatch):
    # Not minutes of Ray's own retries: one probe of CONNECT_TIMEOUT_S, and ray.init never called.
    from actors import driver

    probes = []
    answers = driver._answers
    monkeypatch.setattr(driver, "CONNECT_TIMEOUT_S", 1.0)
    monkeypatch.setattr(driver, "_answers", lambda address: probes.append(address) or answers(address))
    monkeypatch.setattr(driver.ray, "is_initialized", lambda: False)  # as in a fresh `fedray run` process
    monkeypatch.setattr(driver.ray, "init", lambda **kw: pytest.fail(f"ray.init was called: {kw}"))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(
        ConnectionError, match=r"cannot reach the Ray cluster at 127.0.0.1:9 \(RAY_ADDRESS\).*--address local"
    ):
        driver.connect()
    assert probes == ["127.0.0.1:9"]


def test_ctrl_c_before_the_first_checkpoint_promises_none(tmp_path, monkeypatch, capsys):
    from fedray import api
    from jobs.cli import main

    def interrupted(*args, **kwargs):  # stopped during Ray's start-up, before any round
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(api, "events", lambda *a, **k: interrupted())
    assert main(["run", "--set", "rounds=1", "--output", str(tmp_path / "out")]) == 130
    err = capsys.readouterr().err
    assert "before run" in err and "wrote a checkpoint" in err and "starts it from the beginning" in err
    assert "goes on from" not in err


def test_a_batchnorm_model_meeting_a_batch_of_one_is_refused_before_the_run_naming_the_client(tmp_path):
    # 600 samples over 6 clients: 100 each, and 100 = 3 x 33 + 1 leaves every client a last batch of
    # one sample, on which BatchNorm cannot train ("Expected more than 1 value per channel").
    from fedray.api import prepare

    over = dict(
        dataset="synthetic",
        synthetic_size=600,
        synthetic_shape=[3, 16, 16],
        model="resnet18",
        num_clients=6,
        partition="iid",
        batch_size=33,
        output=str(tmp_path / "out"),
    )
    with pytest.raises(
        ConfigError,
        match=r"config key 'drop_last': model resnet18 has BatchNorm \(encoder\.bn1\).* client 0's 100 training "
        r"samples leave a last batch of one at batch_size 33 \(6 client\(s\)",
    ):
        prepare(over)
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]  # nothing written
    prepare({**over, "drop_last": True})  # the key, or the algorithm's own hp.drop_last
    prepare({**over, "hp": {"drop_last": True}})
    prepare({**over, "batch_size": 32})  # 100 = 3 x 32 + 4


def test_drop_last_is_the_algorithms_own_drop_last_for_every_algorithm(tmp_path):
    # The config key drops each epoch's last partial batch in every local update: for FedAvg it is
    # its hp.drop_last value for value, and it changes the numbers of a run that keeps them.
    from tests.helpers import round_metrics

    base = dict(num_clients=4, rounds=2, batch_size=24, partition="iid", synthetic_size=600)
    runs = {}
    for name, over in {
        "key": {"drop_last": True},
        "hp": {"hp": {"drop_last": True}},
        "kept": {},
    }.items():
        cfg = small_config(tmp_path / name, **base, **over)
        list(execute(cfg, make_local_federation))
        runs[name] = round_metrics(cfg.output)
    timing = ("seconds", "bytes")
    key, hp, kept = (r[~r.metric.str.contains("|".join(timing))] for r in runs.values())
    assert key.reset_index(drop=True).equals(hp.reset_index(drop=True))
    assert not key.reset_index(drop=True).equals(kept.reset_index(drop=True))
