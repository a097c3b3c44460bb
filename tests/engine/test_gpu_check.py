"""The Python parts of the prepared GPU check (scripts/gpu_check.sh) run, here on the CPU and
tiny: a GPU is lent to a session rarely and for minutes, and a script broken by an engine change
(the bench's counting wrapper once was, by a new argument of `train_update`) would waste it."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT

DIGITS = str(ROOT / "jobs" / "configs" / "digits.yaml")


@pytest.mark.parametrize(
    "extra",
    [[], ["--set", "algorithm=fedrc", "--fold-mb", "1", "--stacked-eval", "on"]],
    ids=["fedavg", "fedrc-folded"],
)
def test_bench_batched_times_both_engines(capsys, monkeypatch, extra):
    from fedray.engine import step_options
    from fedray.federation import host
    from jobs.bench.batched import main

    # what the bench sets for its process, put back for the tests after this one
    monkeypatch.setattr(host, "fold_bytes", host.fold_bytes)
    monkeypatch.setattr(step_options, "_options", step_options.current())

    assert main([DIGITS, "--rounds", "2", *extra]) == 0
    out = capsys.readouterr().out
    for engine in ("per-client", "batched"):
        assert any(line.startswith(engine) and "s a round" in line for line in out.splitlines()), out
    assert "stacked work:" in out and "evaluation:" in out


def test_stacked_cnn_times_every_way(capsys):
    from jobs.bench.stacked_cnn import main

    assert main(["--device", "cpu", "--models", "2", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    for way in ("vmap", "vmap-im2col", "grouped", "bmm"):
        assert any(line.startswith(f"{way} ") and "ms a step" in line for line in out.splitlines()), out


def test_stack_widths_times_each_width_and_convolution(capsys):
    from jobs.bench.stack_widths import main

    assert main([DIGITS, "--widths", "1,2", "--conv", "grouped,im2col"]) == 0
    out = capsys.readouterr().out
    assert sum("ms a step" in line for line in out.splitlines()) == 4, out


def test_row_times_estimates_a_finished_runs_full_budget(tmp_path, capsys):
    from jobs.bench.row_times import main
    from jobs.cli import main as cli

    assert cli(["run", "--local", "--quiet", "--set", "rounds=2", "--output", str(tmp_path)]) == 0
    capsys.readouterr()
    main(str(tmp_path), 1)
    out = capsys.readouterr().out
    assert "fedavg finished" in out and "the whole table" in out


def test_bench_pack_times_runs_alone_and_packed(capsys):
    from jobs.bench.pack import main

    assert (
        main([DIGITS, "--runs", "2", "--rounds", "2", "--set", "num_clients=4", "--set", "local_epochs=1"])
        == 0
    )
    out = capsys.readouterr().out
    assert any(line.startswith("alone") and "run-rounds/s" in line for line in out.splitlines()), out
    packed = next(line for line in out.splitlines() if line.startswith("packed"))
    # 2 runs x 2 rounds x 4 clients, each called to train and to evaluate its training split
    assert "16 of 16 client calls stacked with another run's" in packed, out
    assert "speed-up" in out and "largest |difference|" in out
