"""The commands a user types: README's first two lines, fedray run / report, python -m jobs.run on Ray."""

from __future__ import annotations

import json
import re
import sys

import pandas as pd
import pytest

from tests.conftest import ROOT
from tests.helpers import clis_without_ray, run


def readme_commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("```bash")
    return [ln.split("#")[0].strip() for ln in lines[start + 1 : start + 3]]


def test_readme_opens_with_setup_and_run_and_setup_and_test_commands():
    run, test = readme_commands()
    assert run == "bash scripts/setup.sh && .venv/bin/fedray run"
    assert test == "bash scripts/setup.sh && .venv/bin/python -m pytest -q"
    ci = (ROOT / ".ci" / "run").read_text()
    assert test in ci.splitlines(), ".ci/run must call the README's test command"
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert '"torch==2.14.1" "torchvision==0.29.1"' in setup and '-e ".[test]"' in setup


def test_readmes_first_run_prints_the_numbers_readme_shows(tmp_path):
    # README's sample output had drifted once (its partition's label): every line it shows is checked
    # here against a run, the times aside. Its numbers are checked to the last digit but one: the same
    # commit prints train_acc 0.8377 on one kind of CPU and 0.8369 on another (MKL picks its matrix
    # kernels by processor, and they sum in another order), each bit-identical from run to run.
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("$ fedray run --local --set rounds=3")
    shown = lines[start + 1 : lines.index("```", start)]
    ((rc, err, printed),) = clis_without_ray(
        [["run", "--local", "--set", "rounds=3", "--output", str(tmp_path / "out")]], tmp_path, stdout=True
    )
    assert rc == 0, err

    def numbers(text_lines):
        keep = []
        for line in text_lines:
            if line.startswith("run ") or line.startswith("round "):
                keep.append(re.sub(r"\s+[\d.]+s$", "", line))  # the round's seconds
            elif line.startswith("done: "):
                keep.append(line.split(";")[0])  # the accuracy, not the times or the folder
        return keep

    got, want = numbers(printed.splitlines()), numbers(shown)
    assert len(want) == 5
    decimal = re.compile(r"\d+\.\d+")
    assert [decimal.sub("#", g) for g in got] == [decimal.sub("#", w) for w in want]
    for g, w in zip(got, want, strict=True):
        assert [float(x) for x in decimal.findall(g)] == pytest.approx(
            [float(x) for x in decimal.findall(w)], abs=0.0015
        ), (g, w)


def test_fedray_run_local_then_skip_then_report(tmp_path):
    # the four commands in turn in one process (`fedray run --local` and `fedray report` import no Ray)
    out = tmp_path / "out"
    first = ["run", "--local", "--set", "rounds=2", "--output", str(out)]
    (rc, err, p), (rc_again, _, again), _, (rc_rep, err_rep, rep) = clis_without_ray(
        [first, first, [*first, "--set", "seed=1", "--quiet"], ["report", str(out)]], ROOT, stdout=True
    )
    assert rc == 0, err
    assert "round 1/2" in p and "done: final accuracy" in p
    # the done line says which times it gives: the run's own (runs/ total_seconds, as recorded), and
    # the command's in all (once only "in all", which the runs table's total_seconds is not)
    from analysis import load_runs

    said = re.search(
        r"; the run (\d+\.\d) s \(runs/ total_seconds\), (\d+\.\d) s in all for this command; ", p
    )
    run_id = re.search(r"^run (\S+):", p, re.M)[1]
    summary = load_runs(out).set_index("run_id")["summary"][run_id]
    assert said and float(said[1]) == round(summary["total_seconds"], 1) <= float(said[2]) + 0.05, p
    df = pd.read_parquet(out / "metrics")
    acc = df[(df.metric == "accuracy") & (df.scope == "global")]
    # the two seeds' runs, each its two rounds (the repeated command added none)
    assert acc.groupby("run_id")["round"].apply(list).tolist() == [[1, 2], [1, 2]]
    assert acc["dataset"].unique().tolist() == ["digits"]
    assert rc_again == 0 and "already finished" in again
    assert rc_rep == 0, err_rep
    # two seeds: mean ± std
    assert "fedavg" in rep and "dirichlet(0.5)" in rep and "±" in rep
    assert "(2)" in rep and "runs: 2 finished" in rep  # a cell of two seeds
    png = out / "plots" / "default-accuracy.png"
    assert f"plots: {png}" in rep and png.stat().st_size > 5000  # one curve with a ±std band


JOINS = r"""
import os, subprocess, sys
from ray.cluster_utils import Cluster

# A cluster as `ray start` leaves one on this machine: recorded as the machine's current cluster,
# with token authentication (its token in ~/.ray/auth_token), and a (logical) GPU to tell it by.
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 1})
# a new shell's `fedray run`: no address, and nothing said of authentication
shell = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
try:
    p = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "run", "--set", "rounds=1", "--set", "num_actors=1", "--output", sys.argv[1]],
        env=shell, capture_output=True, text=True, timeout=240,
    )
    print(p.stdout)
    print(p.stderr, file=sys.stderr)
    sys.exit(p.returncode)
finally:
    cluster.shutdown()
"""


def test_fedray_run_joins_the_cluster_ray_start_left_on_this_machine_without_an_address(tmp_path):
    # docs/running.md: with no address, fedray joins the cluster `ray start` runs here. It once passed
    # that cluster's address to ray.init, which then sends no token, and the cluster (token
    # authentication is `ray start`'s default) refused it after 20 s of retries.
    import os
    import subprocess
    import tempfile

    record = tempfile.mkdtemp(prefix="fr", dir="/tmp")  # short: Ray's socket paths live under it
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"RAY_TMPDIR": record, "RAY_AUTH_MODE": "token"}  # the machine's cluster record here, not /tmp/ray
    try:
        p = subprocess.run(
            [sys.executable, "-c", JOINS, str(tmp_path / "out")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        subprocess.run(["rm", "-rf", record], check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "done: final accuracy" in p.stdout
    assert "the Ray cluster has 1 GPU(s)" in p.stderr  # that cluster's, not a Ray of its own


@pytest.mark.ray
def test_jobs_run_attaches_to_a_running_ray(ray_session, tmp_path):
    """`RAY_ADDRESS=... python -m jobs.run CONFIG`: the entry point `ray job submit` runs, here as
    a job that ships a module of its own (``--runtime-env-json '{"py_modules": [...]}'``) which
    the run's plug-in imports."""
    address = ray_session.get_runtime_context().gcs_address
    out = tmp_path / "out"
    helper = tmp_path / "shipped" / "lab_helpers"
    helper.mkdir(parents=True)
    (helper / "__init__.py").write_text("WIDTH = 48\n")
    plugin = tmp_path / "lab_plugin.py"
    plugin.write_text(
        "import os\n\nimport lab_helpers\n\nassert lab_helpers.WIDTH == 48 and os.environ['LAB_FLAG'] == 'on'\n"
    )
    # the job's runtime_env as Ray's job supervisor gives it to the job's own process: its modules
    # uploaded (gcs:// URIs, as `ray job submit` uploads them) and its env_vars
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed

    shipped = upload_py_modules_if_needed({"py_modules": [str(helper)]}, True, str(tmp_path))["py_modules"]
    assert shipped[0].startswith("gcs://")
    job = {"runtime_env": {"py_modules": shipped, "env_vars": {"LAB_FLAG": "on"}}}
    p = run(
        [
            sys.executable,
            "-m",
            "jobs.run",
            str(ROOT / "jobs" / "configs" / "digits.yaml"),
            "--set",
            "rounds=2",
            "--set",
            "num_actors=1",  # each actor more costs the suite its start-up and checks nothing more
            "--output",
            str(out),
            "--plugin",
            str(plugin),
        ],
        cwd=ROOT,
        env={
            "RAY_ADDRESS": address,
            "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(job),
            "PYTHONPATH": str(helper.parent),  # the job's process has its py_modules on its path
            "LAB_FLAG": "on",  # and its env_vars
        },
    )
    # Ray refuses a ray.init runtime_env that sets a field the job set (py_modules for the
    # plug-in): fedray's keeps the job's modules and lets it replace them; the client actors
    # import the plug-in, and it imports the job's module and reads the job's env_vars
    assert p.returncode == 0, p.stderr
    assert "1 actor on 1 node " in p.stdout and "done: final accuracy" in p.stdout
    # the session's 2 (logical) GPUs go unused by a config that asks for none: said once
    assert "fedray: the Ray cluster has 2 GPU(s) and num_gpus_per_actor is 0" in p.stderr
    assert "num_gpus_per_actor: auto shares the GPUs" in p.stderr
    runs = pd.read_parquet(out / "runs")
    assert runs["status"].tolist() == ["finished"]


def test_sigterm_while_the_command_imports_is_one_line_not_a_traceback(tmp_path):
    """`ray job stop` or a scheduler's kill as `fedray run` is still importing torch: once the
    command's SIGTERM handler is in place, it says it stopped in one line (before: a 30-53-line
    traceback from inside an import)."""
    import signal
    import subprocess
    import time

    for delay in (0.6, 1.2, 2.0):  # somewhere in the command's imports (torch's take seconds here)
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobs.cli",
                "run",
                "--local",
                "--set",
                "rounds=1",
                "--output",
                str(tmp_path / "out"),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(delay)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
        assert "Traceback" not in err, err
        # said (130), or killed before the handler (-SIGTERM). -SIGINT is 130 to a shell too: CPython
        # ends itself with SIGINT after a KeyboardInterrupt was raised inside code an extension ran
        # (pybind11's exec during torch's import), even one that main() caught and said
        assert p.returncode in (130, -signal.SIGINT, -signal.SIGTERM), (p.returncode, err)
        if p.returncode != -signal.SIGTERM:
            assert err.strip().splitlines()[-1] in (
                "fedray: stopped (SIGTERM); the same command run again goes on where it was",
                *(line for line in err.splitlines() if line.startswith("fedray: interrupted")),
            ), err
