"""What `fedray report` says where it has no table to show (an empty folder, a folder inside a
results folder, runs of the other split), and what a run's done line says of the command's time."""

from __future__ import annotations

import re
import subprocess
import sys
import time

from fedray.records import rec
from jobs.cli import main
from tests.conftest import ROOT, small_config
from tests.helpers import final, write_run


def _report(capsys, *args):
    capsys.readouterr()
    code = main(["report", *map(str, args), "--no-plots"])
    got = capsys.readouterr()
    return code, got.out, got.err


def test_a_folder_inside_a_results_folder_names_the_one_to_give(tmp_path, capsys):
    out = tmp_path / "out"
    write_run(out, {**small_config(tmp_path).to_dict(), "experiment": "t", "hp": {}}, final(0.7))
    for inside in (out / "metrics", f"{out / 'runs'}/"):
        code, stdout, err = _report(capsys, inside)
        assert code == 2 and stdout == ""
        assert err.startswith(f"fedray: error: '{inside}' is the ") and err.count("\n") == 1
        assert err.rstrip().endswith(f"(fedray report {out})")


def test_an_empty_folder_says_what_a_results_folder_holds(tmp_path, capsys):
    code, stdout, _ = _report(capsys, tmp_path)
    assert code == 1
    assert stdout.splitlines()[0] == (
        f"no runs in {tmp_path}/: a results folder holds runs/ (a row per run) and metrics/ (their values "
        "round by round), as fedray run --output DIR and fedray sweep write it; give that folder"
    )


def test_a_metric_of_the_other_split_says_which_metric_reads_the_runs(tmp_path, capsys):
    # Before: `--metric val_accuracy` on a folder whose finished run evaluated on test said only
    # "no finished runs" (the table reads the runs that evaluated on validation), and the default
    # metric on a folder of runs that evaluated on validation said the same.
    cfg = {**small_config(tmp_path).to_dict(), "experiment": "t", "hp": {}}
    on_test, on_val = tmp_path / "test", tmp_path / "val"
    write_run(on_test, cfg, final(0.7))
    val = {**cfg, "evaluate_on": "validation", "validation_fraction": 0.2}
    write_run(on_val, val, {1: [rec("val_accuracy", 0.6)], 2: [rec("val_accuracy", 0.65)]})
    code, stdout, _ = _report(capsys, on_test, "--metric", "val_accuracy")
    assert code == 1
    assert stdout.splitlines()[0] == (
        f"no finished runs evaluated on validation in {on_test}/ (1 run evaluated on test: --metric accuracy "
        "reads it; val_* metrics are recorded by runs with evaluate_on: validation (docs/tuning.md))"
    )
    code, stdout, _ = _report(capsys, on_val)
    assert code == 1
    assert stdout.splitlines()[0] == (
        f"no finished runs evaluated on test in {on_val}/ (1 run evaluated on validation (tuning's trials): "
        "--metric val_accuracy reads it)"
    )
    code, stdout, _ = _report(capsys, on_val, "--metric", "val_accuracy")
    assert code == 0 and "65.0 (1)" in stdout


def test_a_run_that_recorded_a_validation_metric_is_read_for_it_whatever_its_config_says(tmp_path, capsys):
    # an imported run (or one of a fedray before evaluate_on) that recorded val_accuracy
    out = tmp_path / "out"
    cfg = {**small_config(tmp_path).to_dict(), "experiment": "t", "hp": {}}
    write_run(out, cfg, {1: [rec("accuracy", 0.5), rec("val_accuracy", 0.55)]})
    code, stdout, _ = _report(capsys, out, "--metric", "val_accuracy")
    assert code == 0 and "55.0 (1)" in stdout


def test_a_runs_done_line_counts_the_command_from_its_process_start(tmp_path):
    # Before: "5.4 s in all for this command" for a command that took 10.7 s: the clock started after
    # the imports. Here a second passes before jobs.cli is imported: the done line counts it.
    script = (
        "import sys, time; time.sleep(1.5); from jobs.cli import main; "
        f"sys.exit(main(['run', '--local', '--quiet', '--set', 'rounds=1', '--output', {str(tmp_path / 'out')!r}]))"
    )
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr
    (done,) = [line for line in p.stdout.splitlines() if line.startswith("done: ")]
    run_s, in_all = (float(x) for x in re.search(r"the run ([\d.]+) s .*, ([\d.]+) s in all", done).groups())
    assert 1.5 + run_s <= in_all + 0.1 and in_all <= took + 0.1, (done, took)


def test_the_process_age_is_the_time_since_the_process_started():
    from fedray.progress import process_age

    p = subprocess.run(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(1); from fedray.progress import process_age as a; print(a())",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert 1.0 <= float(p.stdout) < 30, p.stdout
    here = process_age()
    assert here is not None and here > 0
