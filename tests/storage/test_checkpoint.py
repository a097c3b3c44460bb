"""Checkpoints, resume and saved models, in-process: every algorithm resumes bit-identically, rows are
never duplicated, damaged or hostile checkpoints fail with an error naming the file, and a saved
model reproduces the run's final accuracy."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis import (
    load_assignments,
    load_events,
    load_metrics,
    load_model,
    load_models,
    load_runs,
    model_index,
)
from fedray import MOVED_MODULES
from fedray.data import build_federated_data
from fedray.engine.client import iterate
from fedray.experiment.local import make_local_federation, task_for
from fedray.experiment.loop import Checkpointed, Finished, RoundDone, Started, execute
from fedray.federation import Baton
from fedray.storage.blobs import (
    CheckpointError,
    StateFile,
    _dataclass,
    decode,
    encode,
    read_blob,
    read_owner,
    write_blob,
)
from fedray.storage.checkpoint import Checkpoints
from fedray.storage.export import ModelsMissing
from fedray.storage.results import run_state
from tests.conftest import ROOT, small_config
from tests.helpers import ALGORITHM_HP, CONFIG_OVER, METRIC_KEYS, stored_metrics


def assignments(out) -> object:
    return load_assignments(out)[["round", "stage", "client", "cluster", "weight"]]


# --- the format -----------------------------------------------------------------------------------


@dataclass
class Inner:
    w: np.ndarray
    note: str = ""


def test_encode_decode_round_trips_plain_data_exactly(tmp_path, monkeypatch):
    import fedray.storage.blobs as ck

    monkeypatch.setattr(ck, "_SAFE_MODULES", ("fedray.", __name__))  # this test's dataclass
    obj = {
        3: [np.arange(4, dtype=np.int64), np.float32(0.25), (1, "a", None, True)],
        "f": [float("nan"), float("inf"), -0.0, 1e-310, 0.1 + 0.2],
        (1, 2): Inner(np.array([[1.5, -2.0]], dtype=np.float16), "x"),
        "empty": np.zeros((0, 3)),
    }
    path = tmp_path / "x.npz"
    write_blob(path, obj, "obj")
    back = read_blob(path)
    assert set(back) == {3, "f", (1, 2), "empty"}
    assert back[3][0].dtype == np.int64 and back[3][0].tolist() == [0, 1, 2, 3]
    assert type(back[3][1]) is np.float32 and back[3][1] == np.float32(0.25)
    assert back[3][2] == (1, "a", None, True)
    f = back["f"]
    assert (
        np.isnan(f[0])
        and f[1] == float("inf")
        and str(f[2]) == "-0.0"
        and f[3] == 1e-310
        and f[4] == 0.1 + 0.2
    )
    assert isinstance(back[(1, 2)], Inner) and back[(1, 2)].w.dtype == np.float16 and back[(1, 2)].note == "x"
    assert back["empty"].shape == (0, 3)
    # numpy reads it too (a researcher inspecting a checkpoint): arrays by index, the tree as JSON
    with np.load(path, allow_pickle=False) as npz:
        assert npz["0"].tolist() == [0, 1, 2, 3]


def test_what_is_not_plain_data_is_refused_naming_where_it_is():
    with pytest.raises(
        CheckpointError, match=r"state\['models'\]\[1\]: a torch.Tensor cannot be checkpointed"
    ):
        encode({"models": [np.zeros(2), torch.zeros(2)]}, [], "state")
    with pytest.raises(CheckpointError, match=r"client 4 state\['opt'\]: an array of Python objects"):
        encode({"opt": np.array([object()], dtype=object)}, [], "client 4 state")
    with pytest.raises(CheckpointError, match="not a dataclass of fedray or of the run.s plug-ins"):
        encode(Inner(np.zeros(1)), [], "state")  # defined outside fedray: a file could not name it safely


def test_a_checkpoint_written_before_a_class_moved_or_a_field_was_renamed_or_added_reads_back():
    """Checkpoints of format 1 name FedEM's and CFL's states as they were (fedray.algorithms.fedem:State,
    :ClientMixture; cfl:State with its field ``layers``): they read back as the classes that hold them now,
    a field added since with its default. A field without a default that the file lacks is refused."""
    from fedray.algorithms.mixture.client import ClientMixture
    from fedray.algorithms.mixture.fedem import MixtureState
    from fedray.algorithms.splitting.cfl import SplitState

    arrays = [np.ones(2), np.full((1, 2), 0.5), np.ones(1)]
    old = {
        "__dataclass__": "fedray.algorithms.fedem:State",
        "fields": {
            "models": {"__dict__": [[0, {"__dict__": [["w", {"__array__": 0}]]}]]},
            "prior": None,
            "stats": {"__dict__": []},
            "shares": None,
        },
    }
    state = decode(old, arrays)
    assert type(state) is MixtureState and state.models[0]["w"].tolist() == [1.0, 1.0] and state.prior is None
    client = decode(
        {
            "__dataclass__": "fedray.algorithms.fedem:ClientMixture",
            "fields": {
                "ids": [0],
                "gamma": {"__array__": 1},
                "omega": {"__array__": 2},
                "nu": None,
                "a": None,
                "opt": {"__dict__": []},
            },
        },
        arrays,
    )
    # written before ClientMixture kept the evaluation's losses: those fields take their defaults
    assert type(client) is ClientMixture and client.gamma.shape == (1, 2)
    assert client.next_losses is None and client.next_round == -1
    cfl = decode(
        {
            "__dataclass__": "fedray.algorithms.cfl:State",
            "fields": {
                "clusters": [[0, 1]],
                "models": [],
                "layers": {"__dict__": [["fc", ["fc.weight"]]]},
                "selected": ["fc.weight"],
                "history": [],
                "peak_mean_norm": 0.0,
            },
        },
        arrays,
    )
    assert type(cfl) is SplitState and cfl.layer_params == {"fc": ["fc.weight"]}
    with pytest.raises(ValueError, match=r"SplitState has fields .* \(written by another fedray version\?\)"):
        decode({"__dataclass__": "fedray.splitting:SplitState", "fields": {"clusters": []}}, arrays)


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_every_class_of_a_moved_module_reads_back_under_its_old_name(old):
    """A checkpoint written before the algorithm families moved under fedray/algorithms/ (or fedray's
    flat modules into their layers' folders) names their classes by the old modules
    (fedray.splitting:SplitState, fedray.algorithms.fedavg:State, ...). A reference to a file
    (StateFile) is never read back, under any name."""
    import dataclasses
    import importlib
    import inspect

    new = importlib.import_module(MOVED_MODULES[old])
    classes = [
        c
        for _, c in inspect.getmembers(new, inspect.isclass)
        if dataclasses.is_dataclass(c) and c.__module__ == new.__name__ and c is not StateFile
    ]
    for cls in classes:
        assert _dataclass(f"{old}:{cls.__qualname__}") is cls
    for alias in ("State", "Hparams"):  # the names the registry's modules give them
        if hasattr(new, alias):
            assert _dataclass(f"{old}:{alias}") is getattr(new, alias)


def test_a_baton_is_stored_with_its_value_and_given_back():
    arrays: list = []
    tree = encode([Baton(7), 1], arrays, "state", baton=lambda b: {"w": np.full(2, b.key)})
    given = {}

    def give_back(key, value):
        given[key] = value
        return Baton(key)

    back = decode(json.loads(json.dumps(tree)), arrays, baton=give_back)
    assert back == [Baton(7), 1] and given[7]["w"].tolist() == [7, 7]


# --- resume: every algorithm, bit-identical -------------------------------------------------------


def _config(tmp_path, algorithm, **over):
    base = dict(
        algorithm=algorithm,
        hp=ALGORITHM_HP.get(algorithm, {}),
        rounds=4,
        participation=0.5,
        client_test_fraction=0.2,
        seed=3,
        checkpoint_every=2,
    )
    base.update(CONFIG_OVER.get(algorithm, {}))
    base.update(over)
    return small_config(tmp_path, **base)


def _stop_after(cfg, rounds_done, restart=False, at=RoundDone):
    """Run until the ``at`` event (rows recorded, or checkpoint written) of round ``rounds_done``,
    then stop it as Ctrl-C would."""
    events = execute(cfg, make_local_federation, restart)
    for ev in events:
        if isinstance(ev, at) and ev.round == rounds_done:
            break
    events.close()
    return ev


def _assert_same_models(cfg, ref):
    """Every saved model of ``cfg``'s run equals ``ref``'s, bit for bit; returns their names."""
    a, b = (load_models(c.output, c.run_id()) for c in (cfg, ref))
    assert a.keys() == b.keys() and a
    for name in a:
        for (k, x), (_, y) in zip(a[name].state_dict().items(), b[name].state_dict().items(), strict=True):
            assert torch.equal(x, y), (name, k)
    return set(a)


# (algorithm, checkpoint_every, stopped after round, resumes after round). Stopped as its round's
# rows are written, before that round's checkpoint. FedCat's checkpoint after round 1 is mid-cycle:
# its two copies are Batons in flight.
CASES = [(a, 2, 3, 2) for a in ["fedavg", *sorted(ALGORITHM_HP)]] + [("fedcat", 1, 2, 1)]


@pytest.mark.parametrize(
    "algorithm, every, stop, resumed", CASES, ids=[f"{c[0]}-every{c[1]}-stop{c[2]}" for c in CASES]
)
def test_a_stopped_run_resumes_bit_identically_for_every_algorithm(tmp_path, algorithm, every, stop, resumed):
    ref = _config(tmp_path / "ref", algorithm, checkpoint_every=every)
    list(execute(ref, make_local_federation))
    cfg = _config(tmp_path / "cut", algorithm, checkpoint_every=every)
    _stop_after(cfg, stop)
    assert run_state(cfg.output, cfg.run_id()) == "interrupted"
    assert stored_metrics(cfg.output)["round"].max() == stop  # rows of the round after the checkpoint exist
    for blob in (Path(cfg.output) / "checkpoints" / cfg.run_id()).rglob("*.npz"):  # classes by their tags
        with zipfile.ZipFile(blob) as zf:
            assert '"__dataclass__": "fedray.' not in zf.read("tree.json").decode(), blob
    events = list(execute(cfg, make_local_federation))
    assert isinstance(events[0], Started) and events[0].resumed_from == resumed
    assert [e.round for e in events if isinstance(e, RoundDone)] == list(range(resumed + 1, 5))
    got, want = stored_metrics(cfg.output), stored_metrics(ref.output)
    assert not got.duplicated(METRIC_KEYS).any()
    assert got.equals(want), got.compare(want)
    assert assignments(cfg.output).equals(assignments(ref.output))
    _assert_same_models(cfg, ref)  # the saved models are the uninterrupted run's, bit for bit
    ev = load_events(cfg.output)
    assert ev["event"].tolist() == ["interrupted", "resumed"] and ev["round"].tolist() == [stop, resumed]


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "moon", "fedrc"])
def test_a_run_stopped_at_a_round_records_every_round_it_ran_and_goes_on_bit_identically(tmp_path, algorithm):
    """``execute(stop_at=R)`` (a search's successive halving): status ``stopped`` at R, its rows of
    rounds 1..R on disk, a checkpoint at R though checkpoint_every does not fall there, and the run
    asked to go on from there ends as the uninterrupted run, bit for bit."""
    from fedray.experiment.loop import Stopped
    from fedray.storage.results import run_status

    ref = _config(tmp_path / "ref", algorithm, checkpoint_every=2)
    list(execute(ref, make_local_federation))
    cfg = _config(tmp_path / "cut", algorithm, checkpoint_every=2)
    events = list(execute(cfg, make_local_federation, stop_at=3, stopped_by="a rung of the search"))
    assert isinstance(events[-1], Stopped) and events[-1].round == 3
    assert [e.round for e in events if isinstance(e, Checkpointed)] == [2, 3]
    assert run_status(cfg.output, cfg.run_id()) == run_state(cfg.output, cfg.run_id()) == "stopped"
    assert sorted(set(stored_metrics(cfg.output)["round"])) == [1, 2, 3]
    ev = load_events(cfg.output)
    assert ev["event"].tolist() == ["stopped"] and ev["round"].tolist() == [3]
    assert ev["detail"].tolist() == ["a rung of the search"]
    events = list(execute(cfg, make_local_federation))
    assert isinstance(events[0], Started) and events[0].resumed_from == 3
    assert isinstance(events[-1], Finished)
    got, want = stored_metrics(cfg.output), stored_metrics(ref.output)
    assert got.equals(want), got.compare(want)
    _assert_same_models(cfg, ref)


def test_a_run_stopped_at_a_round_keeps_a_checkpoint_there_though_it_keeps_none_otherwise(tmp_path):
    from fedray.experiment.loop import Stopped

    cfg = _config(tmp_path, "fedavg", checkpoint_every=0)
    events = list(execute(cfg, make_local_federation, stop_at=2))
    assert [e.round for e in events if isinstance(e, Checkpointed)] == [2] and isinstance(events[-1], Stopped)
    events = list(execute(cfg, make_local_federation))
    assert events[0].resumed_from == 2 and not [e for e in events if isinstance(e, Checkpointed)]


def test_checkpoints_are_kept_as_asked_and_restart_starts_over(tmp_path):
    cfg = small_config(tmp_path, rounds=5, checkpoint_every=2, keep_checkpoints=2)
    got = [e for e in execute(cfg, make_local_federation) if isinstance(e, Checkpointed)]
    assert [e.round for e in got] == [2, 4, 5]  # and after the last round
    root = Path(cfg.output) / "checkpoints" / cfg.run_id()
    assert sorted(p.name for p in root.iterdir()) == ["round-000004", "round-000005"]
    manifest = json.loads((root / "round-000005" / "manifest.json").read_text())
    assert manifest["round"] == 5 and set(manifest["files"]) == {"state.npz"}  # FedAvg clients keep nothing
    ref = stored_metrics(cfg.output)
    assert load_model(cfg.output, cfg.run_id()) is not None
    _stop_after(cfg, 3, restart=True)  # --restart: the old checkpoints go, the run starts at round 1
    assert sorted(p.name for p in root.iterdir()) == ["round-000002"]
    assert stored_metrics(cfg.output)["round"].max() == 3
    # and the finished attempt's models with them: an interrupted run has none (they were once left,
    # and load_model read the earlier attempt's model of a run that said "interrupted")
    assert not (Path(cfg.output) / "models" / cfg.run_id()).exists()
    with pytest.raises(ModelsMissing):
        load_model(cfg.output, cfg.run_id())
    list(execute(cfg, make_local_federation))
    assert stored_metrics(cfg.output).equals(ref)
    assert load_model(cfg.output, cfg.run_id()) is not None
    assert not [p.name for p in (Path(cfg.output) / "models").iterdir() if p.name.startswith(".")]


def test_a_finished_run_drops_its_checkpoints_when_asked_and_only_once_finished(tmp_path):
    cfg = small_config(tmp_path, rounds=4, checkpoint_every=2, keep_finished_checkpoints=False)
    assert cfg.run_id() == small_config(tmp_path, rounds=4, checkpoint_every=2).run_id()
    root = Path(cfg.output) / "checkpoints" / cfg.run_id()
    _stop_after(cfg, 3)  # stopped: its checkpoint stays, and the run resumes from it
    assert sorted(p.name for p in root.iterdir()) == ["round-000002"]
    events = list(execute(cfg, make_local_federation))
    assert events[0].resumed_from == 2 and isinstance(events[-1], Finished)
    assert run_state(cfg.output, cfg.run_id()) == "finished" and not root.exists()
    assert load_model(cfg.output, cfg.run_id()) is not None  # the trained model is kept
    # Started again without --restart (another sweep planned it before this one finished it): with
    # no checkpoint left it must not start over; nothing is run or touched.
    rows, runs = stored_metrics(cfg.output), load_runs(cfg.output)
    again = list(execute(cfg, make_local_federation))
    assert len(again) == 1 and isinstance(again[0], Finished)
    assert again[0].summary["final_accuracy"] == events[-1].summary["final_accuracy"]
    assert stored_metrics(cfg.output).equals(rows) and load_runs(cfg.output).equals(runs)


def test_the_checkpoints_go_while_the_finished_run_still_holds_its_lock(tmp_path):
    from fedray.storage.lock import RunLock
    from fedray.storage.writer import ResultsWriter

    seen = []
    w = ResultsWriter(tmp_path, "r1", small_config(tmp_path).to_dict())
    w.start()
    w.finish(
        {}, then=lambda: seen.append((run_state(tmp_path, "r1"), RunLock(tmp_path, "r1").held_elsewhere()))
    )
    assert seen == [("finished", True)] and not RunLock(tmp_path, "r1").held_elsewhere()


def test_a_run_stopped_after_its_last_checkpoint_finishes_without_redoing_a_round(tmp_path):
    """Stopped between the final checkpoint and the saved models: the same command runs no round,
    writes the models, and the run is finished with the uninterrupted run's numbers."""
    ref = _config(tmp_path / "ref", "fedsoft", rounds=3)  # personal models come from client state
    list(execute(ref, make_local_federation))
    cfg = _config(tmp_path / "cut", "fedsoft", rounds=3)
    _stop_after(cfg, 3, at=Checkpointed)
    assert run_state(cfg.output, cfg.run_id()) == "interrupted"
    assert not (Path(cfg.output) / "models" / cfg.run_id()).exists()
    again = list(execute(cfg, make_local_federation))
    assert again[0].resumed_from == 3 and not [e for e in again if isinstance(e, RoundDone)]
    assert run_state(cfg.output, cfg.run_id()) == "finished"
    assert stored_metrics(cfg.output).equals(stored_metrics(ref.output))
    assert any(n.startswith("client-") for n in _assert_same_models(cfg, ref))


def test_no_checkpoints_when_checkpoint_every_is_0_and_then_a_stopped_run_starts_over(tmp_path):
    cfg = small_config(tmp_path, rounds=4, checkpoint_every=0)
    _stop_after(cfg, 3)
    assert not (Path(cfg.output) / "checkpoints").exists()
    events = list(execute(cfg, make_local_federation))
    assert events[0].resumed_from == 0 and len([e for e in events if isinstance(e, RoundDone)]) == 4
    assert not stored_metrics(cfg.output).duplicated(METRIC_KEYS).any()


# --- damaged and hostile checkpoints ----------------------------------------------------------------


def _checkpointed_run(tmp_path):
    cfg = small_config(tmp_path, rounds=4, checkpoint_every=2, algorithm="scaffold")  # clients keep c_i
    _stop_after(cfg, 3)
    ckpt = Path(cfg.output) / "checkpoints" / cfg.run_id() / "round-000002"
    return cfg, ckpt


def _resume_fails(cfg, match):
    before = stored_metrics(cfg.output)
    with pytest.raises(CheckpointError, match=match):
        list(execute(cfg, make_local_federation))
    assert stored_metrics(cfg.output).equals(before)  # nothing written is lost
    runs = load_runs(cfg.output)
    assert runs["status"][0] == "failed" and "CheckpointError" in runs["error"][0]


def _fix_checksum(ckpt: Path, name: str | None = None, **edit) -> None:
    """An attacker's (or a careful editor's) edit: file ``name``'s checksum, the manifest's keys
    ``edit``, and the manifest's own digest, all made to match again."""
    from fedray.storage.blobs import sha256
    from fedray.storage.checkpoint import manifest_digest

    m = json.loads((ckpt / "manifest.json").read_text())
    if name is not None:
        m["files"][name] = sha256(ckpt / name)
    m.update(edit)
    m["digest"] = manifest_digest(m)
    (ckpt / "manifest.json").write_text(json.dumps(m))


def _write_tree(path: Path, tree: dict, owner: dict | None = None) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("tree.json", json.dumps({"format": 1, "tree": tree, "owner": owner}))


def _rewrite_head(path: Path, change) -> None:
    """A state file's tree.json rewritten as ``change(head)`` returns it, its arrays kept."""
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members["tree.json"] = json.dumps(change(json.loads(members["tree.json"]))).encode()
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def _restate(ckpt: Path) -> None:
    """An attacker who rewrites the State too: the client files it names made to be those in its
    folder, and every checksum made to match again."""
    from fedray.storage.blobs import sha256

    names = [n for n in json.loads((ckpt / "manifest.json").read_text())["files"] if n.startswith("clients/")]
    files = {n: sha256(ckpt / n) for n in names}
    _rewrite_head(ckpt / "state.npz", lambda h: {**h, "owner": {**h["owner"], "clients": files}})
    for name in [*names, "state.npz"]:
        _fix_checksum(ckpt, name)


def test_an_edited_checkpoint_file_fails_naming_it(tmp_path):
    cfg, ckpt = _checkpointed_run(tmp_path)
    path = ckpt / "clients" / "000001.npz"
    data = bytearray(path.read_bytes())
    data[-200] ^= 0xFF
    path.write_bytes(bytes(data))
    _resume_fails(cfg, r"clients/000001\.npz: its contents do not match the checksum.*--restart")


class Boom:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


MARKER = Path("/tmp/fedray-pwned-marker")


def test_a_hostile_checkpoint_never_runs_code(tmp_path):
    """An attacker who rewrites a file and its checksum: a pickled object array, or a tree naming a
    function outside fedray. Both fail to load with an error naming the file, and nothing runs."""
    import pickle

    MARKER.unlink(missing_ok=True)
    cfg, ckpt = _checkpointed_run(tmp_path)
    state = ckpt / "state.npz"
    whose = read_owner(state)  # the attacker copies what the State says of itself
    with zipfile.ZipFile(state, "w") as zf:  # the State as an object array: a pickle in its .npy
        zf.writestr("tree.json", json.dumps({"format": 1, "tree": {"__array__": 0}, "owner": whose}))
        zf.writestr(
            "0.npy", b"\x93NUMPY\x01\x00" + _npy_header("|O", (1,)) + pickle.dumps(np.array([Boom()]))
        )
    _fix_checksum(ckpt, "state.npz")
    _resume_fails(cfg, r"state\.npz: unreadable.*allow_pickle")
    with zipfile.ZipFile(state, "w") as zf:  # a tree naming os.system as its "dataclass"
        tree = {"__dataclass__": "os:system", "fields": {}}
        zf.writestr("tree.json", json.dumps({"format": 1, "tree": tree, "owner": whose}))
    _fix_checksum(ckpt, "state.npz")
    _resume_fails(cfg, r"state\.npz: unreadable.*'os:system' is not defined in fedray")
    assert not MARKER.exists()


def _npy_header(descr: str, shape: tuple) -> bytes:
    h = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    h += b" " * (63 - (10 + len(h)) % 64) + b"\n"
    return len(h).to_bytes(2, "little") + h


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    cfg, ckpt = _checkpointed_run(tmp_path)
    _fix_checksum(ckpt, run_id="fedavg-digits-s0-0000000000")
    _resume_fails(cfg, r"a checkpoint of run 'fedavg-digits-s0-0000000000', not scaffold")


def test_a_checkpoint_naming_a_file_is_refused_and_links_nothing(tmp_path):
    # A client file whose tree is a reference to a file outside the run (before: the run resumed
    # and its next checkpoint held a hard link to that file), and a class reached through an
    # attribute of a fedray module (before: resolved, a torch dataclass).
    secret = tmp_path / "secret.txt"
    secret.write_text("not the run's")
    cfg, ckpt = _checkpointed_run(tmp_path)
    client = ckpt / "clients" / "000001.npz"
    whose = read_owner(client)
    tree = {"__dataclass__": "fedray.storage.checkpoint:StateFile", "fields": {"path": str(secret)}}
    _write_tree(client, tree, whose)
    _fix_checksum(ckpt, "clients/000001.npz")
    _resume_fails(cfg, r"000001\.npz: not the client file the State after round 2 was saved with")
    _restate(ckpt)  # the State rewritten to name it too
    _resume_fails(cfg, r"000001\.npz: unreadable.*a reference to a file \(StateFile\) is never read")
    assert os.stat(secret).st_nlink == 1
    name = "fedray.engine.client:nn.LinearCrossEntropyOptions"
    _write_tree(client, {"__dataclass__": name, "fields": {}}, whose)
    _restate(ckpt)
    _resume_fails(cfg, r"000001\.npz: unreadable.*is not a dataclass defined in fedray")


def test_a_checkpoint_takes_only_spilled_state_files(tmp_path):
    from fedray.federation.client_states import ClientStates
    from fedray.storage.blobs import StateFile
    from fedray.storage.checkpoint import is_spill_file

    secret = tmp_path / "secret.npz"
    secret.write_bytes(b"x")
    ckpts = Checkpoints(tmp_path / "out", "run-1")
    with pytest.raises(CheckpointError, match=r"client 3 state: .*secret\.npz is not a spilled client state"):
        ckpts.save(1, {}, [(3, StateFile(str(secret)))], None, {"history": []}, {})
    assert os.stat(secret).st_nlink == 1 and not list(ckpts.root.iterdir())  # nothing left behind
    spill = ClientStates(budget_mb=1e-6)  # a budget of no bytes: all but the latest state on disk
    spill.set(3, {"c": np.ones(2)})
    spill.set(4, {"c": np.ones(2)})
    assert is_spill_file(spill.file(3)[0]) and not is_spill_file(secret)
    link = spill.file(3)[0].parent / "00000005.npz"
    link.symlink_to(secret)  # a link in a spill folder is not a spill file either
    assert not is_spill_file(link)


def test_an_edited_manifest_is_refused(tmp_path):
    # Before: round 2 edited to 3 resumed and recorded the run finished with rounds missing, and a
    # deleted client entry dropped that client's state.
    cfg, ckpt = _checkpointed_run(tmp_path)
    manifest = ckpt / "manifest.json"
    original = manifest.read_text()
    m = json.loads(original)
    m["round"] = 3
    manifest.write_text(json.dumps(m))
    _resume_fails(cfg, r"manifest\.json: edited or damaged \(its digest")
    del m["files"]["clients/000001.npz"]
    m["round"] = 2
    manifest.write_text(json.dumps(m))
    _resume_fails(cfg, r"manifest\.json: edited or damaged \(its digest")
    manifest.write_text(original)
    _fix_checksum(ckpt, round=3)  # its digest made to match: the folder still says round 2
    _resume_fails(cfg, r"says round 3, but its folder is round-000002")
    ckpt.rename(ckpt.with_name("round-000003"))  # and the folder renamed: the history says 2 rounds
    _resume_fails(cfg, r"its history records rounds 1\.\.2 \(2 entries\), not the 3 rounds")


def test_a_checkpoint_whose_files_are_not_this_runs_is_refused_naming_what_does_not_match(tmp_path):
    # Before: two clients' state files swapped, the manifest's hashes and digest made to match again,
    # resumed and finished with 17 of 60 values different; another seed's checkpoint planted with its
    # run id rewritten was taken as "after round 6 of 6" and the run recorded finished.
    import shutil

    cfg, ckpt = _checkpointed_run(tmp_path)
    a, b = ckpt / "clients" / "000001.npz", ckpt / "clients" / "000002.npz"
    a_bytes, b_bytes = a.read_bytes(), b.read_bytes()
    a.write_bytes(b_bytes)
    b.write_bytes(a_bytes)
    _fix_checksum(ckpt, "clients/000001.npz")
    _fix_checksum(ckpt, "clients/000002.npz")
    _resume_fails(cfg, r"000001\.npz: not the client file the State after round 2 was saved with")
    _restate(ckpt)  # the State rewritten to name the swapped files: each file still names its client
    _resume_fails(cfg, r"000001\.npz: holds client 2's state of run .*, not client 1's state of run")
    a.write_bytes(a_bytes)
    b.write_bytes(b_bytes)
    _restate(ckpt)
    # another seed's run, checkpointed alike, planted under this run's id
    other = small_config(tmp_path / "other", rounds=4, checkpoint_every=2, algorithm="scaffold", seed=9)
    _stop_after(other, 3)
    planted = Path(other.output) / "checkpoints" / other.run_id() / "round-000002"
    shutil.rmtree(ckpt)
    shutil.copytree(planted, ckpt)
    _fix_checksum(ckpt, run_id=cfg.run_id())
    _resume_fails(
        cfg, rf"state\.npz: does not name itself this run's State \(the State of run {other.run_id()}\)"
    )
    _rewrite_head(ckpt / "state.npz", lambda h: {**h, "owner": {**h["owner"], "run_id": cfg.run_id()}})
    _fix_checksum(ckpt, "state.npz")  # the State made to name this run: each client file names the other
    _resume_fails(
        cfg, rf"000000\.npz: holds client 0's state of run {other.run_id()}, not client 0's state of run"
    )


def test_a_file_of_another_rounds_checkpoint_is_refused_naming_it_and_the_state_names_its_round(tmp_path):
    # Before: round 2's file of a client copied into round 3's checkpoint, the manifest made to
    # match: resumed, exit 0, other numbers (a file named its run and client, not its round).
    import shutil

    cfg = small_config(tmp_path, rounds=4, checkpoint_every=1, keep_checkpoints=2, algorithm="scaffold")
    _stop_after(cfg, 3, at=Checkpointed)
    root = Path(cfg.output) / "checkpoints" / cfg.run_id()
    two, three = root / "round-000002", root / "round-000003"
    assert (
        read_owner(three / "state.npz")["round"] == 3
        and read_owner(three / "clients/000001.npz")["round"] == 3
    )
    kept = {n: (three / n).read_bytes() for n in ("state.npz", "clients/000001.npz", "manifest.json")}
    shutil.copyfile(two / "clients/000001.npz", three / "clients/000001.npz")
    _fix_checksum(three, "clients/000001.npz")
    _resume_fails(
        cfg, r"round-000003/clients/000001\.npz: not the client file the State after round 3 was saved with"
    )
    for name, data in kept.items():
        (three / name).write_bytes(data)
    shutil.copyfile(two / "state.npz", three / "state.npz")  # round 2's State, in round 3's folder
    _fix_checksum(three, "state.npz")
    _resume_fails(cfg, r"round-000003/state\.npz: the State after round 2, not after round 3")
    for name, data in kept.items():
        (three / name).write_bytes(data)
    _rewrite_head(three / "clients/000001.npz", lambda h: {k: v for k, v in h.items() if k != "owner"})
    _restate(three)  # a file naming no owner, in a checkpoint whose format has every file name it
    _resume_fails(cfg, r"000001\.npz: names no owner, which every file of its checkpoint's format does")


def _as_format_2(ckpt: Path) -> None:
    """The checkpoint as a format-2 fedray wrote it: its files naming no owner, its manifest format 2."""
    for path in [ckpt / "state.npz", *(ckpt / "clients").iterdir()]:
        _rewrite_head(path, lambda h: {k: v for k, v in h.items() if k != "owner"})
        _fix_checksum(ckpt, str(path.relative_to(ckpt)))
    _fix_checksum(ckpt, format=2)


def _row_before_formats(cfg) -> None:
    """The run's row as a fedray that did not yet record its checkpoint format wrote it."""
    import pyarrow as pa

    from fedray.storage.files import write_atomic
    from fedray.storage.results import RUNS_SCHEMA, read_run_row

    row = read_run_row(cfg.output, cfg.run_id())
    summary = json.loads(row["summary"])
    del summary["checkpoint_format"]
    row["summary"] = json.dumps(summary)
    write_atomic(
        pa.Table.from_pylist([row], schema=RUNS_SCHEMA), Path(cfg.output) / "runs" / f"{cfg.run_id()}.parquet"
    )


def test_a_checkpoint_written_before_files_named_their_owner_is_read_and_its_format_recorded(tmp_path):
    ref = small_config(tmp_path / "ref", rounds=4, checkpoint_every=2, algorithm="scaffold")
    list(execute(ref, make_local_federation))
    cfg, ckpt = _checkpointed_run(tmp_path)
    _as_format_2(ckpt)
    _row_before_formats(cfg)  # a run whose records predate the format it is held to
    events = list(execute(cfg, make_local_federation))
    assert events[0].resumed_from == 2 and isinstance(events[-1], Finished)
    assert stored_metrics(cfg.output).equals(stored_metrics(ref.output))
    resumed = load_events(cfg.output).query("event == 'resumed'")["detail"].tolist()
    assert resumed == ["started again (its checkpoint of format 2: files naming no owner read)"]


def test_a_checkpoint_relabelled_to_an_older_format_is_refused_whatever_else_is_swapped_in(tmp_path):
    # Before: "format": 2 set in the manifest (its digest recomputed) skipped the State's round and
    # client-file checks, and round 1's State or client file resumed in round 2's checkpoint, exit 0.
    import shutil

    cfg = small_config(tmp_path, rounds=4, checkpoint_every=1, keep_checkpoints=3, algorithm="scaffold")
    _stop_after(cfg, 2, at=Checkpointed)
    root = Path(cfg.output) / "checkpoints" / cfg.run_id()
    ckpt, older = root / "round-000002", root / "round-000001"
    saved = root.parent / "saved"
    shutil.copytree(root, saved)
    for swap in (None, "state.npz", "clients/000001.npz"):
        shutil.rmtree(root)
        shutil.copytree(saved, root)
        if swap is not None:  # another round's file, its checksum made to match
            shutil.copyfile(older / swap, ckpt / swap)
            _fix_checksum(ckpt, swap)
        _fix_checksum(ckpt, format=2)
        _row_before_formats(cfg)  # even where the run's row does not say which format it writes
        _resume_fails(
            cfg,
            r"names its owner, as files of format 3 and later do, in a checkpoint whose manifest says format 2: relabelled",
        )  # the files stripped of their owners too (as a format-2 fedray wrote them): the run's row says it
    # writes format 3
    shutil.rmtree(root)
    shutil.copytree(saved, root)
    _as_format_2(ckpt)
    _resume_fails(
        cfg,
        r"manifest.json: says format 2, but this run writes format 3 checkpoints \(its row in runs/ says so\)",
    )


def test_a_run_whose_rows_before_its_checkpoint_are_missing_is_refused_not_finished_over_the_gap(tmp_path):
    # Before: a results folder holding only a copied checkpoints/ (an rsync of that folder alone)
    # resumed and ended `finished` with rows of the rounds after the checkpoint only, its summary
    # giving the final accuracy of a round whose row was not there.
    import shutil

    cfg, ckpt = _checkpointed_run(tmp_path)  # stopped after round 3, its checkpoint after round 2
    copy = small_config(tmp_path / "copy", rounds=4, checkpoint_every=2, algorithm="scaffold")
    assert copy.run_id() == cfg.run_id()
    shutil.copytree(Path(cfg.output) / "checkpoints", Path(copy.output) / "checkpoints")
    with pytest.raises(
        CheckpointError,
        match=r"its checkpoint goes on after round 2, but .*metrics/ holds no rows of rounds 1-2",
    ):
        list(execute(copy, make_local_federation))
    assert load_runs(copy.output)["status"].tolist() == ["failed"]
    # with its rows there too, it goes on, and ends as the run does uninterrupted
    shutil.rmtree(copy.output)
    shutil.copytree(cfg.output, copy.output)
    events = list(execute(copy, make_local_federation))
    assert events[0].resumed_from == 2 and isinstance(events[-1], Finished)
    assert sorted(set(stored_metrics(copy.output)["round"])) == [1, 2, 3, 4]


def test_a_spilled_state_file_changed_under_a_live_run_is_refused_not_read_or_linked(tmp_path):
    # Before: a file swapped inside the live spill folder changed the numbers silently, and was then
    # linked into the next checkpoint under a fresh hash.
    from fedray.federation.client_states import ClientStates
    from fedray.storage.blobs import StateFile

    store = ClientStates(budget_mb=1e-6, run_id="run-1")  # every state but the latest on disk
    store.set(3, {"c": np.ones(2)})
    store.set(4, {"c": np.full(2, 4.0)})
    store.set(5, {"c": np.full(2, 5.0)})
    (path3, digest3), (path4, _) = store.file(3), store.file(4)
    good = path3.read_bytes()
    path3.write_bytes(path4.read_bytes())  # client 4's file in client 3's place
    with pytest.raises(CheckpointError, match=r"00000003\.npz: changed since fedray wrote it"):
        store.peek(3)
    ckpts = Checkpoints(tmp_path / "out", "run-1")
    with pytest.raises(
        CheckpointError, match=r"client 3 state: its spilled file .*00000003\.npz changed since"
    ):
        ckpts.save(1, {}, [(3, StateFile(str(path3), digest3))], None, {"history": []}, {})
    path3.write_bytes(good)  # as written: read, and linked
    assert store.peek(3)["c"].tolist() == [1.0, 1.0]
    ckpts.save(1, {}, [(3, StateFile(str(path3), digest3))], None, {"history": []}, {})
    assert (ckpts.root / "round-000001" / "clients" / "000003.npz").stat().st_ino == path3.stat().st_ino


# --- saved models -------------------------------------------------------------------------------------


def _accuracy(module, cfg) -> float:
    data = build_federated_data(cfg)
    test = data.dataset.test
    correct = 0
    with torch.no_grad():
        task = task_for(cfg, data.dataset.spec)
        for x, y in iterate(test, np.arange(len(test)), task, torch.device("cpu")):
            correct += int((module(x).argmax(1) == y).sum())
    return correct / len(test)


def test_the_saved_model_reloads_and_reproduces_the_final_accuracy(tmp_path):
    cfg = small_config(tmp_path, rounds=3)
    list(execute(cfg, make_local_federation))
    df = load_metrics(cfg.output, scope="global")
    final = df[(df["metric"] == "accuracy") & (df["round"] == 3)]["value"].item()
    model = load_model(cfg.output, cfg.run_id())
    assert not model.training
    assert _accuracy(model, cfg) == final
    assert (Path(cfg.output) / "models" / cfg.run_id() / "config.yaml").is_file()
    runs = load_runs(cfg.output)
    assert runs["summary"][0]["models"].endswith(f"models/{cfg.run_id()}")


def test_clustered_and_concatenated_models_are_saved_by_name(tmp_path):
    cfg = _config(tmp_path / "c", "fedconcat", rounds=4)
    list(execute(cfg, make_local_federation))
    index = model_index(cfg.output, cfg.run_id())
    assert set(index["models"]) == {"global", "cluster-0", "cluster-1"}
    assert index["models"]["global"]["arch"]["concat"] == 2
    members = index["models"]["cluster-0"]["members"] + index["models"]["cluster-1"]["members"]
    assert sorted(members) == list(range(6))
    df = load_metrics(cfg.output, scope="global")
    final = df[(df["metric"] == "accuracy") & (df["round"] == 4)]["value"].item()
    assert _accuracy(load_model(cfg.output, cfg.run_id()), cfg) == final
    soft = _config(tmp_path / "s", "fedsoft", rounds=3)
    list(execute(soft, make_local_federation))
    names = set(model_index(soft.output, soft.run_id())["models"])
    assert {"cluster-0", "cluster-1"} <= names and any(n.startswith("client-") for n in names)
    with pytest.raises(KeyError, match="no model 'global'; it has client-000000"):
        load_model(soft.output, soft.run_id())


# --- symbolic links and what a killed prune leaves ------------------------------------------------


def test_fedray_neither_follows_nor_removes_a_symbolic_link_in_its_results(tmp_path):
    # Before: with checkpoints/RUN_ID a link, --restart resumed (its clear-out ignored its own error);
    # a linked round folder was read and never pruned; with models/RUN_ID a link, a fresh run failed
    # at its start with "Cannot call rmtree on a symbolic link" (no path), a resumed one only after
    # all its rounds, leaving a .old folder.
    from fedray.storage.files import UnsafePath

    cfg, ckpt = _checkpointed_run(tmp_path)
    root = ckpt.parent
    elsewhere = tmp_path / "elsewhere"
    root.rename(elsewhere)
    root.symlink_to(elsewhere)
    for restart in (True, False):
        with pytest.raises(
            UnsafePath, match=rf"{re.escape(str(root))}: the run's checkpoints folder is a symbolic link"
        ):
            list(execute(cfg, make_local_federation, restart=restart))
    assert (elsewhere / "round-000002" / "manifest.json").is_file()  # what it points to is untouched
    root.unlink()
    root.mkdir()
    (root / "round-000002").symlink_to(elsewhere / "round-000002")
    with pytest.raises(UnsafePath, match=r"round-000002: a checkpoint's folder is a symbolic link"):
        list(execute(cfg, make_local_federation))
    (root / "round-000002").unlink()
    models = Path(cfg.output) / "models" / cfg.run_id()
    models.parent.mkdir(exist_ok=True)
    models.symlink_to(tmp_path)
    for restart in (True, False):  # fresh or resumed: refused at its start, nothing trained
        with pytest.raises(
            UnsafePath, match=rf"{re.escape(str(models))}: the run's models folder is a symbolic link"
        ):
            list(execute(cfg, make_local_federation, restart=restart))
    assert not [p for p in models.parent.iterdir() if p.name.startswith(".")]  # no .old left


KILLED_IN_PRUNE = """
import os, sys
from pathlib import Path
import fedray.storage.checkpoint as ck

def killed_halfway(path, what):  # kill -9 inside a prune, half its files removed
    files = sorted(p for p in Path(path).rglob("*") if p.is_file())
    for f in files[: len(files) // 2]:
        f.unlink()
    os._exit(9)

ck.remove_tree = killed_halfway
from jobs.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_prune_killed_halfway_is_finished_at_the_next_start_and_no_debris_stays(tmp_path):
    # Before: 4 of 15 kills aimed at the checkpoint window left round folders without a manifest
    # (4.2 of 6.8 MB), which every later start ignored; partial .tmp files stayed forever.
    out = tmp_path / "out"
    args = ["run", "--local", "--output", str(out)]
    sets = ["rounds=4", "checkpoint_every=1", "keep_checkpoints=1", "algorithm=scaffold", "num_clients=4"]
    command = [*args, *(x for kv in sets for x in ("--set", kv))]
    p = subprocess.run(
        [sys.executable, "-c", KILLED_IN_PRUNE, *command], cwd=ROOT, capture_output=True, text=True
    )
    assert p.returncode == 9, p.stderr[-2000:]
    (root,) = (out / "checkpoints").iterdir()
    left = sorted(x.name for x in root.iterdir())
    assert (
        left[0].startswith(".round-000001.") and left[0].endswith(".pruned") and left[1:] == ["round-000002"]
    )
    # an earlier fedray's prune killed halfway left a round folder without its manifest; a killed
    # writer, its hidden temporary files
    (root / "round-000000").mkdir()
    (root / "round-000000" / "state.npz").write_bytes(b"half")
    (out / "metrics" / f".{root.name}-000000.parquet.0123abcd.tmp").write_bytes(b"half")
    (out / "runs" / f".{root.name}.parquet.0123abcd.tmp").write_bytes(b"half")
    from jobs.cli import main

    assert main(command) == 0  # the same command: goes on from round 2
    assert [x.name for x in root.iterdir()] == ["round-000004"]
    assert not [x for sub in out.iterdir() if sub.is_dir() for x in sub.iterdir() if x.name.startswith(".")]
    ref = tmp_path / "ref"
    assert main(["run", "--local", "--output", str(ref), *(x for kv in sets for x in ("--set", kv))]) == 0
    assert stored_metrics(out).equals(stored_metrics(ref))  # as if never killed


# --- the command line: SIGTERM, SIGKILL, then the same command -------------------------------------------------


def test_sigterm_and_sigkill_stop_a_run_and_the_same_command_goes_on_to_the_unstopped_numbers(tmp_path):
    # One run stopped twice, then finished by the same command:
    # - SIGTERM, what `ray job stop` and schedulers send: the CLI turns it into Ctrl-C's stop (recorded
    #   interrupted, exit 130; in process here, the Ctrl-C test in test_recovery_ray.py stops a run on Ray);
    # - SIGKILL, no goodbye at all: the run's lock dies with it, so it reads as interrupted;
    # - the same command again goes on from the last checkpoint, every round once, to the numbers of
    #   the run never stopped.
    from jobs.cli import main as cli_main
    from tests.federation.test_recovery_ray import _goes_on, _stop_after

    sets = dict(
        dataset="synthetic",
        synthetic_size=600,
        num_clients=6,
        rounds=18,
        local_epochs=5,
        checkpoint_every=3,
        algorithm="scaffold",
    )
    args = [*(a for k, v in sets.items() for a in ("--set", f"{k}={v}")), "--local"]
    held = signal.getsignal(signal.SIGTERM)  # the reference in this process, its SIGTERM hook undone
    try:
        assert cli_main(["run", *args, "--output", str(tmp_path / "ref"), "--quiet"]) == 0
    finally:
        signal.signal(signal.SIGTERM, held)
    out = tmp_path / "cut"
    cmd = [sys.executable, "-m", "jobs.cli", "run", *args, "--output", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    _stop_after(cmd, env, out, 5, signal.SIGTERM, 18)  # after the checkpoint of round 3
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, seen = time.monotonic() + 120, []
    for line in p.stdout:  # kill it after the checkpoint of round 6, some rounds later
        seen.append(line)
        if re.match(r"round +8/", line) or time.monotonic() > deadline:
            break
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert re.search(r"resuming from the checkpoint after round [36] of 18", "".join(seen)), seen
    assert run_state(out, load_runs(out)["run_id"][0]) == "interrupted"  # its lock died with it
    resumed = re.search(r"resuming from the checkpoint after round (\d+) of 18", _goes_on(cmd, env, out, 18))
    assert int(resumed[1]) in (6, 9, 12, 15), resumed[0]  # the killed run's own checkpoint
    got, want = stored_metrics(out), stored_metrics(tmp_path / "ref")
    assert got.equals(want), got.compare(want)


def test_models_manifests_and_small_files_reach_the_disk_before_the_run_is_finished(tmp_path, monkeypatch):
    # Before: a saved model, its index.json, a checkpoint's manifest.json and every
    # write_text_atomic file were renamed into place without fsync (a power cut after 'finished'
    # could leave them empty), and no folder was synced after its rename.
    synced: list[str] = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    cfg = small_config(tmp_path, rounds=2, checkpoint_every=1, keep_checkpoints=1, save_models=True)
    list(execute(cfg, make_local_federation))
    out = str(Path(cfg.output).resolve())
    run_id = cfg.run_id()

    def first(pattern: str) -> int:
        hits = [i for i, p in enumerate(synced) if re.search(pattern, p)]
        assert hits, f"{pattern} never synced: {synced}"
        return hits[0]

    models = rf"{out}/models/\.{run_id}\.\w+\.tmp"
    for pattern in (
        rf"{models}/global\.npz$",
        rf"{models}/\.index\.json\.\w+\.tmp$",
        rf"{models}/\.config\.yaml\.\w+\.tmp$",
        rf"{out}/checkpoints/{run_id}/\.round-000001\.\w+\.tmp/manifest\.json$",
    ):
        first(pattern)
    assert first(rf"{out}/models$") > first(rf"{models}/global\.npz$")  # the rename, after the file


def test_a_full_disk_is_said_naming_the_path_the_cli_says_recorded_only_when_it_was_and_the_resume_is_exact(
    tmp_path, monkeypatch, capsys
):
    # Before: "OSError: [Errno 28] No space left on device" named no path; with the failure row
    # unwritable too, the CLI still said the error was recorded in runs/ (the row read interrupted,
    # with no error); partial .tmp files stayed, even after a successful resume.
    import errno

    import fedray.storage.checkpoint as ck
    import fedray.storage.files as files
    import fedray.storage.writer as writer
    from jobs.cli import main

    out = tmp_path / "out"
    sets = ["rounds=4", "checkpoint_every=1", "algorithm=scaffold", "num_clients=4"]
    command = ["run", "--local", "--output", str(out), *(x for kv in sets for x in ("--set", kv))]
    real_write, real_row = ck.write_blob, writer.ResultsWriter._write_run

    def full_at_round_3(path, obj, where, *a, **k):  # the disk fills while round 3's checkpoint is written
        if "round-000003" in str(path):
            with files.writing(path):
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, obj, where, *a, **k)

    def no_row_either(self, status, *a, **k):
        if status == "failed":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_row(self, status, *a, **k)

    monkeypatch.setattr(ck, "write_blob", full_at_round_3)
    monkeypatch.setattr(writer.ResultsWriter, "_write_run", no_row_either)
    assert main(command) == 1
    err = capsys.readouterr().err
    assert "no space left on the device writing " in err and "round-000003" in err and "MB free there" in err
    assert "recorded in" not in err and "its failed row could not be written in" in err
    monkeypatch.setattr(
        writer.ResultsWriter, "_write_run", real_row
    )  # the row writes; the disk is still full
    assert main(command) == 1
    assert "(status, error and its traceback recorded in" in capsys.readouterr().err
    monkeypatch.setattr(ck, "write_blob", real_write)  # space freed: the same command goes on
    assert main(command) == 0
    assert not [
        p
        for sub in out.rglob("*")
        if sub.is_dir()
        for p in sub.iterdir()
        if p.name.startswith(".") and "lock" not in p.name
    ]
    ref = tmp_path / "ref"
    assert main(["run", "--local", "--output", str(ref), *(x for kv in sets for x in ("--set", kv))]) == 0
    assert stored_metrics(out).equals(stored_metrics(ref))  # bit-identical to a run never stopped


def test_a_checkpointed_class_is_named_by_its_tag_and_by_the_paths_it_had_before(tmp_path):
    # Checkpoints once named their classes by module path, so a class could never move without an
    # import shim; now by a tag, and the paths earlier checkpoints wrote still read.
    from fedray.algorithms.baselines.fedavg import State
    from fedray.algorithms.splitting.cfl import SplitState
    from fedray.storage.blobs import TAGS

    state = State(params={"w": np.arange(3.0)})
    path = tmp_path / "state.npz"
    write_blob(path, state, "state")
    with zipfile.ZipFile(path) as zf:
        tree = json.loads(zf.read("tree.json"))["tree"]
    assert tree["__dataclass__"] == "@fedavg.State"
    for name in ("fedray.algorithms.baselines.fedavg:State", "fedray.algorithms.fedavg:State"):
        _write_tree(path, {**tree, "__dataclass__": name})
        with zipfile.ZipFile(path, "a") as zf:
            zf.writestr("0.npy", _npy_bytes(np.arange(3.0)))
        back = read_blob(path)
        assert type(back) is State and np.array_equal(back.params["w"], np.arange(3.0))
    assert _dataclass("fedray.splitting:SplitState") is SplitState is TAGS["cfl.SplitState"]
    with pytest.raises(ValueError, match="names no dataclass of fedray's"):
        _dataclass("@fedavg.Nothing")


def _npy_bytes(arr: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=False)
    return buf.getvalue()
