"""What a Ray that fedray starts for a run exposes (docs/running.md#what-a-run-exposes)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.conftest import ROOT

LISTENERS = """
import json, os, stat, time
from pathlib import Path
import ray
import psutil  # Ray's own copy (ray/thirdparty_files), on the path once ray is imported
from actors.driver import connect

said = []
assert connect("local", say=said.append)
time.sleep(2)  # the agents bind their ports once they are up
ours = {p.pid: p.name() for p in psutil.Process().children(recursive=True)}
ours[os.getpid()] = "driver"
listening = [
    [c.laddr.ip, c.laddr.port, ours[c.pid]]
    for c in psutil.net_connections(kind="tcp")
    if c.status == psutil.CONN_LISTEN and c.pid in ours
]
token = Path.home() / ".ray" / "auth_token"
mode = stat.S_IMODE(token.stat().st_mode) if token.exists() else None
niceness = ray.get(ray.remote(num_cpus=0)(lambda: os.nice(0)).remote())
ray.shutdown()
print(json.dumps({"listening": listening, "token_mode": mode, "worker_niceness": niceness, "said": said}))
"""


def test_a_private_ray_exports_no_metrics_keeps_its_token_to_its_owner_and_its_workers_at_normal_priority():
    # Before: the metrics agent listened on 0.0.0.0 and answered without Ray's token, and
    # ~/.ray/auth_token was readable by every user of the machine (0644).
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    p = subprocess.run(
        [sys.executable, "-c", LISTENERS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.splitlines()[-1])
    # token authentication on is what a private Ray should have: Ray's WARNING saying so is not shown
    assert "Token authentication is enabled" not in p.stderr, p.stderr[-2000:]
    assert got["listening"], "the private Ray listens nowhere: nothing measured"
    # the metrics agent's export port is gone (docs/running.md#what-a-run-exposes)
    agent = [s for s in got["listening"] if s[0] == "0.0.0.0" and s[2] == "ray::DashboardAgent"]
    assert not agent, got["listening"]
    # every server of a private Ray on loopback (before: the dashboard agent's HTTP port, whose health
    # endpoints answer without a token, and the runtime-env agent listened on the host's address, and
    # the GCS, raylet and workers on every interface)
    outside = [s for s in got["listening"] if s[0] not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
    assert not outside, outside
    assert got["token_mode"] in (None, 0o600), oct(got["token_mode"])
    # Ray's default niceness for workers is 15: then any busy process beside them took the run's
    # actors minutes to start (issue: attaching took 105 s on a busy machine)
    assert got["worker_niceness"] == 0
    # the first minute on a busy machine was silent while Ray started: it is said at once, and then
    # how long the start took
    starting, started = got["said"]
    assert (
        starting
        == f"starting a local Ray with this machine's {os.cpu_count()} CPUs (no cluster to attach to) ..."
    )
    assert re.fullmatch(r"local Ray started in \d+\.\d s", started), started


def test_the_jobs_workers_run_at_normal_priority_unless_its_submitter_said_otherwise(monkeypatch):
    from actors.driver import job_runtime_env

    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert job_runtime_env() == {"env_vars": {"RAY_worker_niceness": "0"}}
    # where the submitted job's runtime_env has it already (Ray's job manager gives the job's
    # process its supervisor's 0 where the job asks for entrypoint resources) it stands: ray.init
    # would refuse the two as a conflict
    submitted = {"runtime_env": {"env_vars": {"RAY_worker_niceness": "10"}, "working_dir": "x"}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(submitted))
    assert job_runtime_env() == {}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "x"}}))
    assert job_runtime_env() == {"env_vars": {"RAY_worker_niceness": "0"}}
