"""Clients' persistent state beyond client_state_memory_mb goes to disk and comes back exactly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedray.experiment.local import make_local_federation, task_for
from fedray.experiment.loop import execute
from fedray.federation.client_states import PREFIX, ClientStates
from tests.conftest import small_config
from tests.helpers import round_metrics


def _state(i: int) -> dict:
    g = np.random.default_rng(i)
    return {
        "c": {"w": g.normal(size=(10, 100)).astype(np.float32), "b": g.normal(size=10)},
        "steps": i,
        "k": [i, float(i) / 3],
        "none": None,
    }


def _same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    else:
        assert a == b


def test_states_beyond_the_budget_go_to_disk_and_come_back_exactly():
    store = ClientStates(budget_mb=0.01)  # 10 KB: about two of these 4.1 KB states
    for i in range(20):
        store.set(i, _state(i))
    assert store.memory_bytes <= 0.01 * (1 << 20) and store.on_disk >= 17 and store.spilled == store.on_disk
    folder = next(iter({p.parent for p in store._dir.glob("*.npz")}))
    assert len(list(folder.glob("*.npz"))) == store.on_disk
    for i in (0, 7, 19, 3):
        _same(store.get(i), _state(i))
    assert store.loaded >= 3
    assert list(store.cids()) == list(range(20))
    store.set(5, None)  # a client whose state became None: nothing kept, in memory or on disk
    assert 5 not in store and store.get(5) is None and len(list(folder.glob("*.npz"))) == store.on_disk
    del store
    assert not folder.exists()  # the folder goes with its host


def test_a_checkpoint_reads_spilled_states_where_they_are():
    """peek (what a checkpoint reads) gives every state exactly, and moves none: nothing on disk is
    read back into memory and nothing in memory spills."""
    store = ClientStates(budget_mb=0.01)
    for i in range(20):
        store.set(i, _state(i))
    on_disk, in_memory, spilled = store.on_disk, list(store._memory), store.spilled
    for i in range(20):
        _same(store.peek(i), _state(i))
    assert store.peek(99) is None
    assert (store.on_disk, list(store._memory), store.spilled, store.loaded) == (
        on_disk,
        in_memory,
        spilled,
        0,
    )


def test_a_dead_processs_spill_folder_is_removed_by_the_next_host(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f"{PREFIX}{int(dead.stdout)}-abc"
    stale.mkdir()
    (stale / "00000001.npz").write_bytes(b"x")
    (stale / ".owner.lock").write_text("")  # its owner's lock, let go when the owner died
    making = (
        tmp_path / f"{PREFIX}{int(dead.stdout)}-new"
    )  # no lock yet: being made now (or an older fedray's)
    making.mkdir()
    store = ClientStates(budget_mb=0.001)
    store.set(1, _state(1))
    store.set(2, _state(2))  # the first spill makes the folder, and clears the dead one's
    assert not stale.exists() and making.exists() and store.on_disk == 1


@pytest.mark.parametrize("algorithm", ["scaffold", "fedem", "ifca"])
def test_a_run_whose_client_state_spills_gives_the_same_numbers(tmp_path, algorithm):
    hp = {"fedem": {"num_clusters": 2}, "ifca": {"num_clusters": 2, "persistent_optimizer": True}}.get(
        algorithm, {}
    )
    over = dict(algorithm=algorithm, hp=hp, num_clients=8, participation=0.5, rounds=4, seed=2)
    runs, feds = {}, {}
    for name, mb in (("memory", 0.0), ("disk", 0.001)):
        cfg = small_config(tmp_path / name, client_state_memory_mb=mb, **over)

        def factory(cfg, data, name=name):
            fed, placement = make_local_federation(cfg, data)
            feds[name] = fed
            return fed, placement

        list(execute(cfg, factory))
        runs[name] = round_metrics(cfg.output)
    assert runs["disk"].equals(runs["memory"])
    states = feds["disk"].host._state
    assert states.spilled > 0 and states.loaded > 0  # it did go to disk and come back
    assert feds["memory"].host._state.spilled == 0


def test_spilled_state_on_ray_and_through_a_checkpoint(ray_session, tmp_path):
    from actors.federation import make_ray_federation

    over = dict(algorithm="scaffold", num_clients=8, participation=0.5, rounds=4, seed=4, checkpoint_every=2)
    ref = small_config(tmp_path / "ref", **over)
    list(execute(ref, make_local_federation))
    cfg = small_config(tmp_path / "ray", client_state_memory_mb=0.001, num_actors=2, **over)
    list(execute(cfg, make_ray_federation))
    assert round_metrics(cfg.output).equals(round_metrics(ref.output))
    assert any(Path(cfg.output, "checkpoints").rglob("clients/*.npz"))  # spilled states were checkpointed


def test_a_checkpoint_links_spilled_states_and_a_run_resumes_from_them_bit_identically(tmp_path):
    """A spilled state goes into the checkpoint as its file, hard-linked (the same inode, nothing
    written again), and a run stopped there resumes to the same numbers as one never stopped."""
    from fedray.experiment.loop import Checkpointed
    from fedray.storage.checkpoint import Checkpoints

    over = dict(
        algorithm="scaffold",
        num_clients=8,
        participation=0.5,
        rounds=4,
        seed=4,
        checkpoint_every=2,
        keep_checkpoints=3,
    )
    ref = small_config(tmp_path / "ref", **over)
    list(execute(ref, make_local_federation))
    cfg = small_config(tmp_path / "spill", client_state_memory_mb=0.001, **over)
    feds = []

    def factory(cfg, data):
        fed, placement = make_local_federation(cfg, data)
        feds.append(fed)
        return fed, placement

    events = execute(cfg, factory)
    for ev in events:
        if isinstance(ev, Checkpointed) and ev.round == 2:
            break
    store = feds[0].host._state
    ckpt = Checkpoints(cfg.output, cfg.run_id(), 3).latest()
    spilled = {cid: store.file(cid)[0] for cid in store.cids() if store.file(cid) is not None}
    assert spilled, "some states were on disk at the checkpoint"
    for cid, path in spilled.items():
        saved = ckpt.path / f"clients/{cid:06d}.npz"
        assert saved.stat().st_ino == path.stat().st_ino  # linked, not written again
    in_memory = [cid for cid in store.cids() if cid not in spilled]
    assert all((ckpt.path / f"clients/{c:06d}.npz").stat().st_nlink == 1 for c in in_memory)
    events.close()  # stopped as Ctrl-C would: the spill folder goes, the checkpoint keeps its links
    assert all((ckpt.path / f"clients/{c:06d}.npz").is_file() for c in spilled)
    assert Checkpoints(cfg.output, cfg.run_id(), 3).latest() is not None  # its checksums still hold
    list(execute(cfg, factory))
    assert round_metrics(cfg.output).equals(round_metrics(ref.output))


def test_the_default_budget_is_a_quarter_of_memory_shared_out_by_the_workers_cpus(monkeypatch):
    # It was a quarter over the machine's cores whatever the worker: an in-process FedRC run (300
    # clients, 26 MB of SGD buffers each) on a 16-core, 128 GiB GPU machine kept 2 GiB of its 7.8 GB
    # in memory and wrote the rest to disk and back every round (about 0.1 s a client here).
    from fedray.data import ArrayDataset, DataSpec
    from fedray.federation import client_states
    from fedray.federation.host import ClientHost

    monkeypatch.setattr(client_states, "machine_memory", lambda: 128 << 30)
    monkeypatch.setattr(client_states.os, "cpu_count", lambda: 16)
    gib = 1 << 30
    assert ClientStates().budget == 32 * gib  # alone in its process (an in-process run): the quarter
    assert ClientStates(cpus=2).budget == 4 * gib  # an actor of 2 CPUs of 16
    assert ClientStates(cpus=1).budget == 2 * gib  # 16 such actors: a quarter between them
    assert ClientStates(cpus=64).budget == 32 * gib  # never more than the quarter
    assert ClientStates(budget_mb=10, cpus=2).budget == 10 << 20  # a budget given is the budget
    task = task_for(small_config(Path("/tmp/unused")), DataSpec((2,), 2, 1.0))
    data = ArrayDataset(np.zeros((0, 2), np.float32), np.zeros(0, np.int64))
    assert ClientHost(task, data, {})._state.budget == 32 * gib
    assert ClientHost(task, data, {}, cpus=4)._state.budget == 8 * gib


HOLDS_A_SPILL = """
import sys, time
import numpy as np
from fedray.federation.client_states import ClientStates

store = ClientStates(budget_mb=1e-6)
store.set(1, {"c": np.ones(4)})
store.set(2, {"c": np.ones(4)})  # client 1's state spilled: the folder made, its lock held
print(store.file(1)[0].parent, flush=True)
sys.stdin.read()  # until told to end
"""


def test_a_spill_folder_is_live_while_its_owner_holds_its_lock_whatever_its_pid_says(tmp_path):
    # Before: two runs sharing a temporary folder from different PID namespaces (two containers
    # sharing /tmp): the second's clean-up saw the first's pid as dead and deleted its live folder.
    import subprocess
    import sys

    from fedray.federation.client_states import PREFIX, remove_stale

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    owner = subprocess.Popen(
        [sys.executable, "-c", HOLDS_A_SPILL],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        folder = Path(owner.stdout.readline().strip())
        # as another namespace sees it: a pid that is no process here
        seen = folder.with_name(f"{PREFIX}{2**22 - 1}-elsewhere")
        folder.rename(seen)
        remove_stale(tmp_path)
        assert (seen / "00000001.npz").is_file()  # live: left alone
    finally:
        owner.communicate("", timeout=60)
    stale = tmp_path / f"{PREFIX}{os.getpid()}-gone"  # a dead owner's (its lock free), even with a live pid
    stale.mkdir()
    (stale / ".owner.lock").write_text("")
    remove_stale(tmp_path)  # the owner gone too, its lock let go with its process: both folders go
    assert not stale.exists() and not seen.exists()
