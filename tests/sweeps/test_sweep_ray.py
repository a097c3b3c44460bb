"""fedray sweep on a real local Ray (the shared session: 4 logical CPUs, 2 logical GPUs)."""

from __future__ import annotations

import sys
import time

import pytest

from analysis import load_runs
from fedray.experiment.loop import RoundDone
from fedray.sweeps.scheduler import RunEnded, RunLaunched, RunProgress, run_sweep
from fedray.sweeps.sweep_file import load_sweep
from tests.conftest import ROOT
from tests.helpers import run, stored_metrics, sweep_file

pytestmark = pytest.mark.ray


def test_runs_share_the_cluster_concurrently_and_failures_stay_contained(ray_session, tmp_path):
    from actors.sweep import RayLauncher

    path = sweep_file(
        tmp_path,
        """\
        num_gpus_per_actor: 0.5
        rounds: 16         # long enough to overlap whatever their actors' start-up took (2, then 6 once did not)
        local_epochs: 4
        cases:
          - {lr: 0.05}
          - {lr: 0.1}
          - {lr: 1.0e30}                                                     # diverges in round 1
          - {num_actors: 3, num_gpus_per_actor: 1, placement_timeout_s: 2}  # 3 GPUs: never fits
        """,
    )
    sw = load_sweep(path)
    launcher = RayLauncher()  # attaches to the session
    assert not launcher.started
    events, at = [], {}
    for e in run_sweep(sw.runs, launcher, poll_s=0.5):  # when each run was launched and ended
        events.append(e)
        if isinstance(e, (RunLaunched, RunEnded)):
            at[(type(e).__name__, e.run.index)] = time.monotonic()
    kinds = [(type(e).__name__, e.run.index) for e in events if isinstance(e, (RunLaunched, RunEnded))]
    launched = {e.run.index: e.actors for e in events if isinstance(e, RunLaunched)}
    ended = {e.run.index: e for e in events if isinstance(e, RunEnded)}

    # 4 CPUs and 2 GPUs at 0.5 per actor = 4 actor slots, shared by the 3 runs that fit: 2 + 1 + 1,
    # all three started before any ended; the run that fits no cluster of this size goes last, alone.
    assert kinds[:3] == [("RunLaunched", 1), ("RunLaunched", 2), ("RunLaunched", 3)]
    assert launched == {1: 2, 2: 1, 3: 1, 4: 3}
    assert kinds[-2:] == [("RunLaunched", 4), ("RunEnded", 4)]
    assert ended[1].ok and ended[2].ok
    assert ended[1].summary["placement"]["actors"] == 2 and ended[2].summary["placement"]["actors"] == 1
    assert type(ended[3].error).__name__ == "FloatingPointError"
    assert type(ended[4].error).__name__ == "PlacementError"

    # the two held the cluster at once: each was launched (its actors placed) before the other
    # ended. (Their rows' start times, once compared, also count their actors' start-up, which on a
    # loaded 2-core machine outlasted the other run's 16 rounds.)
    assert at[("RunLaunched", 1)] < at[("RunEnded", 2)] and at[("RunLaunched", 2)] < at[("RunEnded", 1)]
    runs = load_runs(sw.output).set_index("run_id")
    a, b = (runs.loc[r.run_id] for r in sw.runs[:2])
    assert a["started"] < a["finished"] and b["started"] < b["finished"]
    status = [runs.loc[r.run_id, "status"] for r in sw.runs]
    assert status == ["finished", "finished", "failed", "failed"]
    # the unplaceable run failed before its coordinator existed: the sweep recorded it
    assert "could not place 3 client actors" in runs.loc[sw.runs[3].run_id, "error"]
    assert ray_session.available_resources().get("GPU") == 2  # every actor and placement group freed


def test_on_a_ray_that_cannot_grow_a_run_that_never_fits_fails_at_once(ray_session, tmp_path):
    # `fedray sweep` on the private Ray it started (which cannot grow): a run whose actors exceed the
    # cluster fails at once, naming the keys, as `fedray run` does there. It waited placement_timeout_s
    # (300 s a run by default) for nodes that never come, Ray's autoscaler saying so every 35 s.
    from actors.sweep import RayLauncher

    sw = load_sweep(sweep_file(tmp_path, "num_gpus_per_actor: 3\nplacement_timeout_s: 30\n"))  # 2 GPUs here
    launcher = RayLauncher()
    launcher.fixed = True  # as on a Ray it started (the suite's Ray is shared: not started by it)
    ended = [e for e in run_sweep(sw.runs, launcher, poll_s=0.2) if isinstance(e, RunEnded)]
    assert type(ended[0].error).__name__ == "PlacementError", ended[0].error
    assert "do not fit the local Ray fedray started on this machine" in str(ended[0].error)
    assert "num_gpus_per_actor" in str(ended[0].error)


def test_python_m_jobs_sweep_attached_to_a_running_ray_then_resubmitted(ray_session, tmp_path):
    """`ray job submit -- python -m jobs.sweep CONFIG`: the driver attaches to the cluster it runs on."""
    address = ray_session.get_runtime_context().gcs_address
    path = sweep_file(tmp_path, "grid:\n  lr: [0.05, 0.1]\n")
    cmd = [
        sys.executable,
        "-m",
        "jobs.sweep",
        str(path),
        "--set",
        "rounds=1",
        "--set",
        "num_cpus_per_actor=2",
        "--set",
        "num_gpus_per_actor=auto",  # the session's node: 4 CPUs, 2 GPUs: a GPU an actor
        "--max-concurrent-runs",
        "1",
        "--verbose",
    ]
    p = run(cmd, cwd=ROOT, env={"RAY_ADDRESS": address})
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "num_gpus_per_actor auto: 1 (the Ray cluster has GPUs: 1 client actor(s) of 2 CPU(s) a GPU)" in out
    assert "2 new; to run: 2" in out and "at most 1 run at once" in out
    # one run at a time gets the whole cluster
    assert "#1 start  lr=0.05  (" in out and "2 actors; 1 running)" in out
    assert "#1 round 1/1  acc" in out and "#2 done   [2/2] acc" in out
    assert "sweep done in" in out and "2 finished, 0 failed, 0 skipped" in out

    again = run(cmd[:-1], cwd=ROOT, env={"RAY_ADDRESS": address})
    assert again.returncode == 0, again.stderr
    # auto resolves as before on the same cluster: the same run ids, found finished
    assert "2 finished; to run: 0" in again.stdout and "skip" in again.stdout
    assert {r["num_gpus_per_actor"] for r in load_runs(tmp_path / "out")["config"]} == {1.0}


@pytest.mark.parametrize("mode", ["local", "ray"])
def test_ctrl_c_stops_the_sweep_cleanly_and_frees_what_it_held(ray_session, tmp_path, mode):
    import os
    import signal
    import subprocess
    import time

    from fedray.storage.results import run_state

    # one client actor a run: each one more costs the suite its start-up and checks nothing more
    path = sweep_file(tmp_path, "num_actors: 1\ngrid:\n  lr: [0.05, 0.1]\n")
    cmd = [sys.executable, "-m", "jobs.cli", "sweep", str(path), "--set", "rounds=100000", "--verbose"]
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    if mode == "local":
        cmd.append("--local")
    # Ctrl-C as a terminal delivers it. A shell without job control (CI running the suite in the
    # background) starts it with SIGINT ignored, and the sweep would inherit that: restore it first.
    sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    p = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint
    )
    deadline = time.monotonic() + 120
    seen = []
    for line in p.stdout:  # wait until the first run is training (on Ray the second may be first)
        seen.append(line)
        if line.startswith("#1 round ") or time.monotonic() > deadline:
            break
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()  # a sweep that ignores Ctrl-C must not outlive the test and hold the cluster
        _, err = p.communicate()
        pytest.fail(f"the sweep did not stop within 60 s of Ctrl-C; stderr:\n{err[-3000:]}")
    assert p.returncode == 130, err
    assert "sweep interrupted" in err and "terminate called" not in err
    states = [run_state(tmp_path / "out", r.run_id) for r in load_sweep(path, sets=["rounds=100000"]).runs]
    # in-process the run records its own interruption; on Ray it does too when its coordinator sees
    # the stream close first, or its coordinator is killed first and the run reads as interrupted
    # (its writer's lock is gone): the same either way, and a re-submission runs it again
    assert states[0] == "interrupted"
    # on Ray, the session's (logical) GPUs that the sweep leaves unused are said once, before it runs
    hint = "the Ray cluster has 2 GPU(s) and num_gpus_per_actor is 0"
    assert sum(hint in line for line in seen) == (mode == "ray"), seen
    if mode == "ray":
        for _ in range(50):
            if ray_session.available_resources().get("CPU") == 4:
                break
            time.sleep(0.2)
        assert ray_session.available_resources().get("CPU") == 4  # actors and placement groups freed


def test_a_second_sweep_waits_for_the_first_instead_of_failing_placement(ray_session, tmp_path):
    """Two sweeps on one cluster: the second sees what the first holds and waits for it. Without
    that, its placement group would wait in Ray and fail after placement_timeout_s (2 s here)."""
    import threading

    from actors.sweep import RayLauncher
    from fedray.sweeps.scheduler import Waiting

    # one actor a run, of all the session's 4 CPUs, then of 2 (each actor more costs its start-up)
    first = load_sweep(
        sweep_file(tmp_path / "a", "num_actors: 1\nnum_cpus_per_actor: 4\nrounds: 25\ncases: [{lr: 0.05}]\n")
    )
    second = load_sweep(
        sweep_file(
            tmp_path / "b",
            "num_actors: 1\nnum_cpus_per_actor: 2\nplacement_timeout_s: 2\ncases: [{lr: 0.1}]\n",
        )
    )
    events_a: list = []
    runner = threading.Thread(
        target=lambda: events_a.extend(run_sweep(first.runs, RayLauncher(), poll_s=0.2))
    )
    runner.start()
    try:
        # until the first sweep's run has trained a round: its actor holds the session's 4 CPUs
        # (and 24 rounds are left to it), however fast actors start on this machine
        deadline = time.monotonic() + 120
        while not any(isinstance(e, RunProgress) and isinstance(e.event, RoundDone) for e in events_a):
            assert runner.is_alive() and time.monotonic() < deadline, events_a
            time.sleep(0.05)
        events_b = list(run_sweep(second.runs, RayLauncher(), poll_s=0.2))
    finally:
        runner.join(timeout=120)
    assert [type(e).__name__ for e in events_b if not isinstance(e, RunProgress)][:2] == [
        "Waiting",
        "RunLaunched",
    ]
    ended_a = [e for e in events_a if isinstance(e, RunEnded)]
    ended_b = [e for e in events_b if isinstance(e, RunEnded)]
    assert ended_a[0].ok and ended_b[0].ok, (ended_a[0].error, ended_b[0].error)
    assert any(isinstance(e, Waiting) and e.free_cpus < 2 for e in events_b)


def test_a_sweep_hands_a_finished_runs_actors_to_its_next_run_of_the_same_shape(ray_session, tmp_path):
    """Runs one at a time: the second (two actors, as the first) runs on the first's actors with the
    numbers a fresh run gets; the third (one actor) gets a new one; nothing is held at the end."""
    from actors.sweep import RayLauncher

    path = sweep_file(
        tmp_path, "num_actors: 2\ncases:\n  - {lr: 0.05}\n  - {lr: 0.1}\n  - {lr: 0.2, num_actors: 1}\n"
    )
    sw = load_sweep(path)
    events = list(run_sweep(sw.runs, RayLauncher(), max_concurrent_runs=1, poll_s=0.2))
    ended = {e.run.index: e for e in events if isinstance(e, RunEnded)}
    assert all(e.ok for e in ended.values())
    pids = {i: e.summary["placement"]["actor_pids"] for i, e in ended.items()}
    assert len(pids[1]) == 2 and pids[2] == pids[1]
    assert len(pids[3]) == 1 and not set(pids[3]) & set(pids[1])

    alone = load_sweep(sweep_file(tmp_path / "alone", "num_actors: 2\ncases:\n  - {lr: 0.1}\n"))
    fresh = [e for e in run_sweep(alone.runs, RayLauncher(), poll_s=0.2) if isinstance(e, RunEnded)]
    assert fresh[0].ok and not set(fresh[0].summary["placement"]["actor_pids"]) & set(pids[1])
    got, want = stored_metrics(sw.output), stored_metrics(alone.output)
    got = got[got.run_id == sw.runs[1].run_id].reset_index(drop=True)
    assert got.equals(want), "a reused actor changed a number"
    deadline = time.monotonic() + 30
    while ray_session.available_resources().get("CPU", 0) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray_session.available_resources().get("CPU") == 4  # the idle actors went back at the end
