"""fedray from Python: fedray.run and fedray.sweep give the command line's numbers and return the
results as pandas; a researcher's own arrays or torch Dataset is a data set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fedray
from fedray.config.keys import ConfigError
from tests.conftest import ROOT


def values(metrics):
    m = metrics[~metrics["metric"].str.contains("seconds|bytes")]
    return m.set_index(["round", "metric", "scope", "entity"])["value"].sort_index()


def test_run_gives_the_clis_numbers_and_returns_its_results(tmp_path, capsys):
    from jobs.cli import main

    cfg = ROOT / "jobs" / "configs" / "digits.yaml"
    assert main(["run", str(cfg), "--local", "--set", "rounds=2", "--output", str(tmp_path / "cli")]) == 0
    cli_lines = [
        line.split("  ")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("round")
    ]
    res = fedray.run(cfg, local=True, rounds=2, output=str(tmp_path / "api"))
    # a notebook sees the run as the command line shows it: a line a round, then the summary
    out = capsys.readouterr().out
    assert [line.split("  ")[0] for line in out.splitlines() if line.startswith("round")] == cli_lines
    assert cli_lines == ["round 1/2", "round 2/2"] and "done: final accuracy" in out
    from analysis import load_metrics

    assert values(res.metrics).equals(values(load_metrics(tmp_path / "cli")))
    assert res.status == "finished" and res.final_accuracy == res.curve().iloc[-1] and len(res.curve()) == 2
    with pytest.raises(KeyError, match=r"recorded no global 'acuracy' \(it has: accuracy, "):
        res.curve("acuracy")  # once an empty Series, silently
    assert len(res.clients) == res.config.num_clients and res.output == tmp_path / "api"
    # a mapping, with --set strings and keyword overrides; the finished run is found, not run again
    again = fedray.run(
        {"dataset": "digits", "rounds": 2}, sets=["lr=0.05"], local=True, output=str(tmp_path / "api")
    )
    assert again.run_id == fedray.load_config(None, ["rounds=2"]).run_id()
    as_config = fedray.run(fedray.load_config(None, ["rounds=2"]), local=True, output=str(tmp_path / "api"))
    assert as_config.run_id == again.run_id and as_config.status == "finished"  # a Config is a config too
    with pytest.raises(ConfigError, match="'learning_rate'.*did you mean 'lr'"):
        fedray.run(local=True, learning_rate=0.1)


def test_sweep_returns_every_runs_results(tmp_path, capsys):
    path = tmp_path / "sweep.yaml"
    path.write_text("dataset: digits\nrounds: 1\ngrid:\n  lr: [0.05, 0.1]\nseeds: [0]\n")
    results = fedray.sweep(path, local=True, output=str(tmp_path / "out"), quiet=True)
    assert capsys.readouterr().out == ""  # quiet: nothing printed
    assert [r.status for r in results] == ["finished", "finished"]
    assert {r.config.lr for r in results} == {0.05, 0.1}
    fedray.sweep(path, local=True, output=str(tmp_path / "out"), force=True)  # as `fedray sweep` shows it
    out = capsys.readouterr().out
    assert "#1 start" in out and "#2 done   [2/2]" in out


def test_sweep_restart_and_an_unwritable_output_folder_behave_as_fedray_sweep_does(tmp_path, capsys):
    # one sweep flow serves both (fedray.sweeps.flow): fedray.sweep had no restart, and never
    # checked its results folder before the runs (each then failed to record itself)
    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import RoundDone, execute
    from fedray.sweeps.sweep_file import load_sweep
    from jobs.cli import main

    path = tmp_path / "sweep.yaml"
    path.write_text("dataset: digits\nrounds: 3\ncheckpoint_every: 1\nnum_clients: 4\nseeds: [0]\n")

    def stopped_after_round_2(output: str) -> None:  # stopped as Ctrl-C stops it, its checkpoint kept
        (run,) = load_sweep(path, output=output).runs
        events = execute(run.config, make_local_federation)
        next(ev for ev in events if isinstance(ev, RoundDone) and ev.round == 2)
        events.close()

    def events_of(result) -> list[str]:
        return [e["event"] for e in result.summary.get("events", [])]

    api, cli, resumed = (str(tmp_path / name) for name in ("api", "cli", "resumed"))
    for output in (api, cli, resumed):
        stopped_after_round_2(output)
    (goes_on,) = fedray.sweep(path, local=True, output=resumed, quiet=True)
    assert events_of(goes_on) == ["interrupted", "resumed"]  # without restart: from its checkpoint
    (restarted,) = fedray.sweep(path, local=True, output=api, restart=True, quiet=True)
    assert main(["sweep", str(path), "--local", "--output", cli, "--restart"]) == 0
    (by_cli,) = fedray.sweep(path, local=True, output=cli, quiet=True)  # found finished: read back
    assert restarted.status == by_cli.status == "finished"
    assert events_of(restarted) == events_of(by_cli) == []  # started over: nothing of the stopped attempt
    assert restarted.final_accuracy == by_cli.final_accuracy == goes_on.final_accuracy
    capsys.readouterr()
    unwritable = "/proc/fedray-cannot-write-here"
    with pytest.raises(OSError, match="config key 'output': cannot write results to '/proc/fedray-cannot"):
        fedray.sweep(path, local=True, output=unwritable, quiet=True)
    assert main(["sweep", str(path), "--local", "--output", unwritable]) == 2
    assert "config key 'output': cannot write results to '/proc/fedray-cannot" in capsys.readouterr().err


def test_num_gpus_per_actor_auto_is_resolved_where_the_run_goes_and_said(tmp_path, capsys):
    import yaml

    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import execute
    from fedray.sweeps.scheduler import LocalLauncher, run_sweep
    from fedray.sweeps.sweep_file import load_sweep

    out = str(tmp_path / "out")
    # in this process: the CPU, so the run is the one num_gpus_per_actor 0 names, saved as 0
    res = fedray.run(local=True, rounds=1, num_gpus_per_actor="auto", output=out)
    assert "num_gpus_per_actor auto: 0 (in this process, --local" in capsys.readouterr().out
    assert res.status == "finished" and res.run_id == fedray.load_config(None, ["rounds=1"]).run_id()
    saved = yaml.safe_load((tmp_path / "out" / "configs" / f"{res.run_id}.yaml").read_text())
    assert saved["num_gpus_per_actor"] == 0.0
    # a sweep: auto and 0 set by hand are then the same run, found finished
    path = tmp_path / "sweep.yaml"
    path.write_text("rounds: 1\ncases:\n  - {num_gpus_per_actor: auto}\n  - {num_gpus_per_actor: 0}\n")
    assert len(load_sweep(path, output=out).runs) == 2
    (again,) = fedray.sweep(path, local=True, output=out, quiet=True)
    assert again.run_id == res.run_id and again.status == "finished"
    # what did not go through the front door is refused, not run under an id that says nothing
    auto = fedray.load_config(None, ["rounds=1", "num_gpus_per_actor=auto"], output=out)
    with pytest.raises(ValueError, match="num_gpus_per_actor is auto"):
        next(execute(auto, make_local_federation))
    with pytest.raises(ValueError, match=r"runs \[1\] have num_gpus_per_actor auto"):
        next(run_sweep(load_sweep(path, output=out).runs[:1], LocalLauncher()))


def test_your_own_arrays_and_torch_datasets_are_a_data_set(tmp_path):
    import torch

    rng = np.random.default_rng(0)
    means = rng.uniform(0, 1, (3, 1, 6, 6))

    def draw(n):
        y = rng.integers(0, 3, n)
        return (means[y] + rng.normal(0, 0.05, (n, 1, 6, 6))).astype(np.float32), y

    (xtr, ytr), (xte, yte) = draw(300), draw(60)
    data = fedray.from_arrays(xtr, ytr, xte, yte, folder=tmp_path / "data")
    res = fedray.run(local=True, rounds=5, num_clients=4, output=str(tmp_path / "out"), **data)
    assert res.status == "finished" and res.final_accuracy > 0.8  # three well-separated classes
    # the same content elsewhere is the same run; a torch Dataset of the same pairs is the same data
    moved = fedray.from_arrays(xtr, ytr, xte, yte, folder=tmp_path / "elsewhere")
    assert fedray.load_config(None, ["rounds=5", "num_clients=4"], **moved).run_id() == res.run_id
    train = torch.utils.data.TensorDataset(torch.from_numpy(xtr), torch.from_numpy(ytr))
    test = torch.utils.data.TensorDataset(torch.from_numpy(xte), torch.from_numpy(yte))
    from_torch = fedray.from_torch(train, test, folder=tmp_path / "torch")
    assert fedray.load_config(None, ["rounds=5", "num_clients=4"], **from_torch).run_id() == res.run_id
    with pytest.raises(ValueError, match="y_train: integer class labels"):
        fedray.from_arrays(xtr, ytr.astype(np.float32), xte, yte, folder=tmp_path / "bad")
    with pytest.raises(Exception, match="is not a file"):
        fedray.run(local=True, dataset="arrays", data_root=str(tmp_path / "missing.npz"))


def test_a_run_another_process_is_writing_is_refused_by_the_cli_and_the_api_alike(tmp_path, capsys):
    # fedray run and fedray.run decide this in one place (fedray.api.begin): neither touches it
    from fedray.storage.results import run_state
    from fedray.storage.writer import ResultsWriter
    from jobs.cli import EXIT_FAILED, main

    cfg = fedray.load_config(None, ["rounds=2", f"output={tmp_path / 'out'}"])
    live = ResultsWriter(cfg.output, cfg.run_id(), cfg.to_dict())
    live.start()  # this process holds the run's lock: a live writer
    try:
        assert main(["run", "--local", "--set", "rounds=2", "--output", cfg.output]) == EXIT_FAILED
        assert f"run {cfg.run_id()} is being written into {cfg.output}/" in capsys.readouterr().err
        with pytest.raises(ConfigError, match="is being written into .* by another live process"):
            fedray.run(cfg, local=True)
        assert run_state(cfg.output, cfg.run_id()) == "running"
    finally:
        live.finish({})
    # a run record that cannot be read is said as such (the file named), not as a Ray failure
    record = next((Path(cfg.output) / "runs").glob("*.parquet"))
    record.write_bytes(b"PAR1 not a parquet file PAR1")
    assert main(["run", "--local", "--set", "rounds=2", "--output", cfg.output]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.startswith("fedray: error: results file") and record.name in err, err
