"""Packed runs (pack_runs, fedray/sweeps/pack.py): several runs of a sweep in one worker, their clients'
updates in one stack. Each run keeps its own numbers (up to float round-off), run id, results,
checkpoints and resume; a run that fails fails alone; which runs pack together."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from analysis import load_metrics, load_runs
from fedray.config.keys import ConfigError
from fedray.engine import drive
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import Finished, RoundDone, Started
from fedray.records import TIMING_METRICS
from fedray.storage.results import run_state
from fedray.sweeps import pack
from fedray.sweeps.pack import Ended, execute_pack, pack_groups
from fedray.sweeps.scheduler import LocalLauncher, RunEnded, RunLaunched, RunProgress, run_sweep
from fedray.sweeps.sweep_file import SweepRun
from tests.conftest import ROOT, small_config


def packed_configs(tmp_path, folder="packed", **over):
    """Three runs of one pack: FedProx at two seeds (two partitions of the data) and at another mu
    and learning rate (each update's own mu and lr, rows of the stack)."""
    base = dict(
        batched_clients="on",
        pack_runs="on",
        rounds=3,
        local_epochs=2,
        output=str(tmp_path / folder),
        checkpoint_every=1,
    )
    base.update(over)
    return [
        small_config(tmp_path, seed=0, algorithm="fedprox", hp={"mu": 0.01}, **base),
        small_config(tmp_path, seed=1, algorithm="fedprox", hp={"mu": 0.01}, **base),
        small_config(tmp_path, seed=0, algorithm="fedprox", hp={"mu": 0.1}, **{"lr": 0.1, **base}),
    ]


def sweep_runs(configs):
    return [SweepRun(i + 1, f"run {i + 1}", c) for i, c in enumerate(configs)]


def values(out, cfg):
    """A run's metrics but the timings, by (round, metric, scope, entity)."""
    df = load_metrics(out)
    df = df[(df["run_id"] == cfg.run_id()) & ~df["metric"].isin(TIMING_METRICS)]
    return df.set_index(["round", "metric", "scope", "entity"])["value"].sort_index()


def assert_alone_gives_the_packed_numbers(tmp_path, configs, atol):
    """Each of ``configs`` (run packed into tmp_path/packed) run alone, batched: every metric as
    packed, up to float round-off."""
    for cfg in configs:
        alone = dataclasses.replace(cfg, pack_runs="off", output=str(tmp_path / "alone"))
        list(run_sweep(sweep_runs([alone]), LocalLauncher()))
        a, b = values(tmp_path / "packed", cfg), values(tmp_path / "alone", alone)
        assert list(a.index) == list(b.index)
        np.testing.assert_allclose(a.to_numpy(), b.to_numpy(), rtol=1e-4, atol=atol)


def test_a_packed_sweep_gives_each_run_its_own_numbers_and_records(tmp_path):
    configs = packed_configs(tmp_path)
    events = list(run_sweep(sweep_runs(configs), LocalLauncher()))
    launched = [e for e in events if isinstance(e, RunLaunched)]
    assert [e.packed for e in launched] == [3, 3, 3]  # one pack of the three
    ended = [e for e in events if isinstance(e, RunEnded)]
    assert len(ended) == 3 and all(e.ok for e in ended)

    runs = load_runs(str(tmp_path / "packed")).set_index("run_id")
    assert set(runs.index) == {c.run_id() for c in configs}  # each its own run id and row
    assert (runs["status"] == "finished").all()
    for cfg in configs:
        summary = runs.loc[cfg.run_id(), "summary"]
        # every client call of every round stacked with another run's (the evaluation's too)
        assert summary["packed_calls"] == summary["batched_calls"] > 0
        assert (tmp_path / "packed" / "checkpoints" / cfg.run_id()).is_dir()

    # the same runs, each alone (batched): the same numbers up to float round-off
    assert_alone_gives_the_packed_numbers(tmp_path, configs, atol=1e-3)


def test_runs_pack_by_their_key_at_most_pack_size_a_pack(tmp_path):
    on = dict(batched_clients="on", pack_runs="on")
    configs = [
        small_config(tmp_path, seed=0, **on),
        small_config(tmp_path, seed=1, momentum=0.5, **on),  # another momentum: another pack
        small_config(tmp_path, seed=1, **on),
        small_config(tmp_path, seed=2, **on),
        small_config(tmp_path, seed=3, batched_clients="on"),  # pack_runs off: alone
        small_config(tmp_path, seed=4, **on),
        small_config(tmp_path, seed=0, algorithm="fedprox", **on),  # another algorithm: its own pack
        small_config(tmp_path, seed=5, **on),
    ]
    assert pack_groups(configs) == [[0, 2, 3, 5], [1], [4], [6], [7]]
    # a data set's own settings (``data:``, a plug-in's data.noise say) are its data: another pack
    noisy = [dataclasses.replace(configs[0], data={"noise": 0.1}), configs[2], configs[3]]
    assert pack_groups(noisy) == [[0], [1, 2]]
    # so are a dataset's flat keys (each declared pack with the rest of its data set): FedProx's
    # Synthetic(alpha, beta) of another alpha is another data set, never one pack
    other = [dataclasses.replace(configs[0], synthetic_alpha=0.5), configs[2], configs[3]]
    assert pack_groups(other) == [[0], [1, 2]]
    small = [dataclasses.replace(c, pack_size=2) for c in configs]
    assert pack_groups(small) == [[0, 2], [1], [3, 5], [4], [6], [7]]
    # auto: packed where the runs share a GPU (a fractional share), not on CPUs
    auto = [
        small_config(tmp_path, seed=s, pack_runs="auto", num_gpus_per_actor=g)
        for s, g in ((0, 0.25), (1, 0.25))
    ]
    assert pack_groups(auto) == [[0, 1]]
    assert pack_groups([dataclasses.replace(c, num_gpus_per_actor=0.0) for c in auto]) == [[0], [1]]
    assert pack_groups([dataclasses.replace(c, num_gpus_per_actor=1.0) for c in auto]) == [[0], [1]]


def test_pack_runs_on_needs_batched_training_and_says_so(tmp_path):
    with pytest.raises(ConfigError, match="pack_runs.*batched_clients is auto on the CPU"):
        small_config(tmp_path, pack_runs="on")
    with pytest.raises(ConfigError, match="pack_runs.*batched_clients is off"):
        small_config(tmp_path, pack_runs="on", batched_clients="off")
    with pytest.raises(ConfigError, match="pack_runs"):
        small_config(tmp_path, pack_runs="sometimes", batched_clients="on")
    assert small_config(tmp_path, pack_runs=False, batched_clients="on").pack_runs == "off"  # YAML's bare off
    # pack_size is not in the run id (which runs share a stack changes float round-off only);
    # pack_runs is, as batched_clients is
    a = small_config(tmp_path, pack_runs="on", batched_clients="on")
    assert dataclasses.replace(a, pack_size=9).run_id() == a.run_id()
    assert dataclasses.replace(a, pack_runs="off").run_id() != a.run_id()
    assert (
        small_config(tmp_path).run_id()
        == dataclasses.replace(small_config(tmp_path), pack_runs="off").run_id()
    )


def test_a_run_that_fails_in_a_pack_fails_alone_and_the_others_finish(tmp_path):
    configs = packed_configs(tmp_path)
    configs[2] = dataclasses.replace(configs[2], hp={"mu": 1.0e30})  # diverges in round 1
    events = list(run_sweep(sweep_runs(configs), LocalLauncher()))
    ended = {e.run.index: e for e in events if isinstance(e, RunEnded)}
    assert ended[1].ok and ended[2].ok
    assert isinstance(ended[3].error, FloatingPointError)
    status = load_runs(str(tmp_path / "packed")).set_index("run_id")["status"]
    assert [status[c.run_id()] for c in configs] == ["finished", "finished", "failed"]


def test_a_failure_inside_a_merged_call_reaches_only_the_run_whose_client_raised(monkeypatch):
    """The packer runs the runs' calls as one; where that fails, each call runs again alone, so
    the error goes to its own run and the other runs get their results."""
    real = drive.run_stacked
    seen = []

    def run_stacked(fns, clients, cstates, msgs, mode, options=None):
        seen.append(list(clients))
        if "bad" in clients:
            raise ValueError(f"client bad of {clients}")
        return real(fns, clients, cstates, msgs, mode)

    monkeypatch.setattr(pack.drive, "run_stacked", run_stacked)
    packer = pack.Packer(2)
    fn = lambda client, cstate, msg: (f"{client} got {msg}", cstate)  # noqa: E731
    out = {}

    import threading

    def call(name, clients, slot):
        packer.enter(slot)
        with packer.turn():
            try:
                out[name] = packer.run_stacked(fn, clients, [None] * len(clients), ["m"] * len(clients), "on")
            except ValueError as e:
                out[name] = e
            finally:
                packer.leave()

    # a arrives first, but b is the pack's first run: the merged call takes b's clients first
    threads = [threading.Thread(target=call, args=a) for a in (("a", ["x", "y"], 1), ("b", ["bad"], 0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [["bad", "x", "y"], ["bad"], ["x", "y"]]  # merged, then each alone, in slot order
    assert out["a"] == ([("x got m", None), ("y got m", None)], [False, False], False)
    assert isinstance(out["b"], ValueError) and str(out["b"]) == "client bad of ['bad']"


def test_a_stopped_pack_records_its_runs_interrupted_and_they_resume(tmp_path):
    configs = packed_configs(tmp_path, rounds=4)
    whole = packed_configs(tmp_path, folder="whole", rounds=4)
    list(execute_pack(whole, make_local_federation))  # the same pack, never stopped

    events = execute_pack(configs, make_local_federation)
    rounds = 0
    for _k, ev in events:
        rounds += isinstance(ev, RoundDone)
        if rounds == 4:  # a few rounds into the pack: stop it, as Ctrl-C does
            break
    events.close()
    assert [run_state(str(tmp_path / "packed"), c.run_id()) for c in configs] == ["interrupted"] * 3

    again = list(execute_pack(configs, make_local_federation))
    started = [ev for _, ev in again if isinstance(ev, Started)]
    assert len(started) == 3 and any(s.resumed_from > 0 for s in started)  # from their checkpoints
    ends = [ev for _, ev in again if isinstance(ev, Ended)]
    assert len(ends) == 3 and all(e.error is None for e in ends)
    assert sum(isinstance(ev, Finished) for _, ev in again) == 3
    for cfg in configs:
        a, b = values(tmp_path / "packed", cfg), values(tmp_path / "whole", cfg)
        assert list(a.index) == list(b.index)
        np.testing.assert_allclose(a.to_numpy(), b.to_numpy(), rtol=1e-4, atol=1e-3)


def test_a_packs_runs_share_out_the_workers_memory_for_client_state(tmp_path):
    from fedray.data import build_federated_data
    from fedray.federation.client_states import default_budget_mb

    cfg = packed_configs(tmp_path)[0]
    data = build_federated_data(cfg)
    mb = 1 << 20
    alone = make_local_federation(cfg, data)[0]
    assert alone.host._state.budget == int(default_budget_mb(None) * mb)
    four = pack.Packer(4)
    assert make_local_federation(cfg, data, packer=four)[0].host._state.budget == int(
        default_budget_mb(None) / 4 * mb
    )
    on_ray = make_local_federation(cfg, data, packer=four, cpus=2)[0]  # a worker of 2 CPUs
    assert on_ray.host._state.budget == int(default_budget_mb(2) / 4 * mb)
    set_by_hand = dataclasses.replace(cfg, client_state_memory_mb=64.0)
    assert make_local_federation(set_by_hand, data, packer=four)[0].host._state.budget == 16 * mb


@pytest.mark.ray
def test_a_pack_on_ray_survives_its_worker_lost_stops_resumes_and_gives_the_in_process_numbers(
    ray_session, tmp_path
):
    import ray

    from actors.sweep import RayLauncher
    from analysis import load_events
    from fedray.experiment.loop import Recovered

    configs = packed_configs(tmp_path, folder="ray", rounds=8)[:2]
    launcher = RayLauncher()
    events = run_sweep(sweep_runs(configs), launcher, poll_s=0.5)
    seen, killed = [], False
    for ev in events:
        seen.append(ev)
        done = ev.event.round if isinstance(ev, RunProgress) and isinstance(ev.event, RoundDone) else 0
        if done >= 2 and not killed:  # the worker lost (as to a node's loss): started again
            ray.kill(launcher._handles[1].coordinator)
            killed = True
        if done >= 5:  # then stopped as a sweep's Ctrl-C stops it
            break
    events.close()
    assert [e.packed for e in seen if isinstance(e, RunLaunched)] == [2, 2]  # one pack of the two
    recovered = [e for e in seen if isinstance(e, RunProgress) and isinstance(e.event, Recovered)]
    assert sorted(e.run.index for e in recovered) == [1, 2]
    out = str(tmp_path / "ray")
    assert [run_state(out, c.run_id()) for c in configs] == ["interrupted"] * 2
    resumed = load_events(out)
    assert (resumed["detail"].str.startswith("recovery 1 of 3 after: the pack's worker died")).sum() == 2

    again = list(run_sweep(sweep_runs(configs), RayLauncher(), poll_s=0.5))
    started = [e.event for e in again if isinstance(e, RunProgress) and isinstance(e.event, Started)]
    assert len(started) == 2 and all(s.resumed_from > 0 for s in started)  # from their checkpoints
    ended = [e for e in again if isinstance(e, RunEnded)]
    assert len(ended) == 2 and all(e.ok for e in ended), [e.error for e in ended]
    assert all(e.summary["packed_calls"] > 0 for e in ended)
    # the same pack in-process, never lost or stopped: the same numbers
    inproc = [dataclasses.replace(c, output=str(tmp_path / "inproc")) for c in configs]
    list(execute_pack(inproc, make_local_federation))
    for cfg, here in zip(configs, inproc, strict=True):
        a, b = values(tmp_path / "ray", cfg), values(tmp_path / "inproc", here)
        assert list(a.index) == list(b.index)
        np.testing.assert_allclose(a.to_numpy(), b.to_numpy(), rtol=1e-6, atol=1e-6)
    assert ray_session.available_resources().get("CPU") == ray_session.cluster_resources().get("CPU")


def test_the_sweeps_dry_run_and_header_say_which_runs_pack(tmp_path, capsys):
    from jobs.cli import main

    sweep = str(ROOT / "jobs" / "configs" / "digits_sweep.yaml")
    sets = ["--set", "batched_clients=on", "--set", "pack_runs=on", "--set", "pack_size=3"]
    assert main(["sweep", sweep, "--dry-run", "--output", str(tmp_path / "dry"), *sets]) == 0
    out = capsys.readouterr().out
    # without --local the sweep would go to Ray, where a pack needs this node to hold it
    assert (
        "packed (pack_runs), each pack in one worker (on Ray: where this node can hold a pack): #1 #2 #3\n"
        in out
    )
    assert main(["sweep", sweep, "--dry-run", "--local", "--output", str(tmp_path / "dry"), *sets]) == 0
    assert "packed (pack_runs), each pack in one worker: #1 #2 #3\n" in capsys.readouterr().out
    sets += ["--set", "rounds=1", "--set", "num_clients=4"]
    assert main(["sweep", sweep, "--local", "--output", str(tmp_path / "run"), *sets]) == 0
    out = capsys.readouterr().out
    assert "running 4 runs in-process, one at a time; 3 of them in 1 pack (pack_runs)" in out
    assert out.count("packed: 3 runs in-process") == 3


def test_the_header_says_why_auto_runs_go_alone_where_the_launcher_cannot_hold_their_pack(
    tmp_path, capsys, monkeypatch
):
    # On Ray a pack runs on the driver's node; on a cluster whose head has no GPU, auto runs the runs
    # alone. The header once counted them as packed all the same (it grouped them without asking the
    # launcher), and said nothing of why they went alone.
    import fedray.api
    from fedray.sweeps.scheduler import LocalLauncher
    from jobs.cli import main

    class NoRoomHere(LocalLauncher):
        def pack_refusal(self, cfg):
            return f"this node has 0 GPUs; it asks for num_gpus_per_actor {cfg.num_gpus_per_actor:g}"

    monkeypatch.setattr(fedray.api, "sweep_launcher", lambda *a, **k: NoRoomHere())
    sweep = str(ROOT / "jobs" / "configs" / "digits_sweep.yaml")
    sets = ["pack_runs=auto", "num_gpus_per_actor=0.5", "pack_size=3", "rounds=1", "num_clients=4"]
    args = ["sweep", sweep, "--local", "--output", str(tmp_path / "run")]
    assert main([*args, *(x for kv in sets for x in ("--set", kv))]) == 0
    out = capsys.readouterr().out
    assert "running 4 runs in-process, one at a time\n" in out and "pack (pack_runs)" not in out
    # the three that would pack (the fourth is a pack of its own, of one, anyway)
    said = "  pack_runs auto: 3 runs go alone: this node has 0 GPUs; it asks for num_gpus_per_actor 0.5\n"
    assert said in out
    assert "packed:" not in out
    # the Python API says it too
    fedray.api.sweep(sweep, sets=sets, local=True, output=str(tmp_path / "api"))
    assert said.strip() + "\n" in capsys.readouterr().out


@pytest.mark.ray
def test_a_pack_that_the_drivers_node_cannot_hold_fails_at_once_naming_pack_runs(ray_session, tmp_path):
    from actors.sweep import RayLauncher

    # the session's one node has 2 GPUs; a pack runs on the driver's node (it writes the results)
    configs = [
        dataclasses.replace(c, num_gpus_per_actor=3.0) for c in packed_configs(tmp_path, folder="big")[:2]
    ]
    events = list(run_sweep(sweep_runs(configs), RayLauncher(), poll_s=0.5))
    ended = [e for e in events if isinstance(e, RunEnded)]
    assert len(ended) == 2
    for e in ended:
        assert type(e.error).__name__ == "PlacementError" and "pack_runs" in str(e.error)
    status = load_runs(str(tmp_path / "big")).set_index("run_id")["status"]
    assert [status[c.run_id()] for c in configs] == ["failed", "failed"]


def test_a_packs_runs_share_out_the_gpu_memory_a_host_keeps_splits_in(monkeypatch):
    import torch

    from fedray.engine.client import share_device_memory

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (64_000, 100_000))
    cache: dict = {}
    share_device_memory(cache, torch.device("cuda"), 4)
    # alone a host keeps training splits in a quarter of the free memory and test splits in an eighth
    assert cache == {("train_tensors_budget",): [4_000], ("test_tensors_budget",): [2_000]}


def test_auto_packs_only_runs_that_train_batched_and_that_the_launcher_can_hold(tmp_path):
    share = dict(pack_runs="auto", num_gpus_per_actor=0.25)
    auto = [small_config(tmp_path, seed=s, **share) for s in (0, 1)]
    assert pack_groups(auto) == [[0, 1]]
    # batched_clients off: the runs would only take turns in one worker
    assert pack_groups([dataclasses.replace(c, batched_clients="off") for c in auto]) == [[0], [1]]
    # a launcher that cannot hold a pack (on Ray: a driver's node without the GPU): auto runs them
    # alone; on packs them, and their launch says why they cannot start
    assert pack_groups(auto, holds=lambda cfg: False) == [[0], [1]]
    on = [dataclasses.replace(c, pack_runs="on") for c in auto]
    assert pack_groups(on, holds=lambda cfg: False) == [[0, 1]]
    # in-process (--local) the runs train on the CPU, where batched_clients auto trains one client at
    # a time: auto packs them only where batched_clients is on, and says why the others go alone
    from fedray.sweeps.scheduler import LocalLauncher, launch_units, packs_declined

    runs = sweep_runs(auto)
    assert launch_units(runs, LocalLauncher()) == [[0], [1]]
    assert packs_declined(runs, [[0], [1]], LocalLauncher()) == [
        "pack_runs auto: 2 runs go alone: in this process the runs train on the CPU, where batched_clients "
        "auto trains one client at a time (batched_clients: on packs them here)"
    ]
    assert launch_units(
        sweep_runs([dataclasses.replace(c, batched_clients="on") for c in auto]), LocalLauncher()
    ) == [[0, 1]]


def test_a_run_that_finished_stays_finished_when_its_pack_is_stopped_right_after(tmp_path):
    # Before the fix a stop landing between the run's Finished and its generator's end recorded it
    # interrupted over its finished row: this failed about one time in three here.
    short, long = packed_configs(tmp_path, rounds=8)[:2]
    short = dataclasses.replace(short, rounds=1)
    events = execute_pack([short, long], make_local_federation)
    for k, ev in events:
        if k == 0 and isinstance(ev, Finished):
            break  # the short run has recorded itself finished; stop the pack at once
    events.close()
    out = str(tmp_path / "packed")
    assert run_state(out, short.run_id()) == "finished"
    assert run_state(out, long.run_id()) == "interrupted"


def test_a_stopped_pack_runs_no_call_left_waiting(monkeypatch):
    """After a stop, a call that was waiting is withdrawn: a run leaving later must not run it
    (with the others' calls missing) for a run that has already recorded itself interrupted."""
    import threading

    ran = []
    monkeypatch.setattr(pack.drive, "run_stacked", lambda *a, **k: ran.append(a) or ([], []))
    packer = pack.Packer(2)
    got = {}

    def wait_in_a_call():
        packer.enter(0)
        with packer.turn():
            try:
                packer.run_stacked(lambda *a: None, ["x"], [None], ["m"], "on")
            except pack.PackStopped as e:
                got["error"] = e

    t = threading.Thread(target=wait_in_a_call)
    t.start()
    while not packer._calls:  # its call is waiting for the other run's
        threading.Event().wait(0.01)
    packer.stop()
    t.join()
    packer.leave()  # the other run ends: nothing left to run
    packer.leave()
    assert isinstance(got["error"], pack.PackStopped) and ran == []
    with pytest.raises(pack.PackStopped):  # and no new call is taken
        packer.run_stacked(lambda *a: None, ["y"], [None], ["m"], "on")


@pytest.mark.parametrize("name", ["fedcat", "fedem"])
def test_relayed_and_folded_rounds_pack_to_their_own_numbers(tmp_path, name):
    """FedCat's hops (relay calls) and FedEM's folded rounds (a call a chunk of clients) go through
    the pack as FedAvg's map does: two seeds packed, against each alone (the digits CNN of
    tests/engine/test_batched.py, whose batched numbers are checked against the per-client engine there)."""
    from tests.engine.test_batched import ALL, BASE

    over = {**BASE, **ALL[name], "batched_clients": "on", "pack_runs": "on"}
    configs = [small_config(tmp_path, **{**over, "seed": s}, output=str(tmp_path / "packed")) for s in (3, 4)]
    ends = [ev for _, ev in execute_pack(configs, make_local_federation) if isinstance(ev, Finished)]
    assert len(ends) == 2 and all(e.summary["packed_calls"] == e.summary["batched_calls"] > 0 for e in ends)
    assert_alone_gives_the_packed_numbers(tmp_path, configs, atol=1e-4)
