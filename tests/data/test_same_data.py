"""A run goes on from its checkpoint, or counts as finished, only on the data it read: its row and
its checkpoints record the files by their SHA-256 (LEAF's JSON, a saved hf dataset, client files,
Fashion-MNIST's IDX files), and a change is refused before anything runs, naming the file and the
way out."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from analysis import load_metrics, load_runs
from fedray.api import begin
from fedray.data import client_files
from fedray.data.identity import DataChanged, changes, identity
from fedray.experiment.checks import from_dict
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import Finished, Started, execute
from fedray.storage.checkpoint import Checkpoints
from fedray.storage.results import run_data, run_state
from tests.data.test_leaf import leaf_config, write_leaf
from tests.helpers import FMNIST_NAMES, mnist_like, stop_after, sweep_file


def _relabel(path, user=None):
    """One user's first label in a LEAF JSON file changed (the file otherwise as it was)."""
    doc = json.loads(path.read_text())
    user = user or doc["users"][0]
    doc["user_data"][user]["y"][0] = (doc["user_data"][user]["y"][0] + 1) % 62
    path.write_text(json.dumps(doc))


def _leaf(tmp_path, **over):
    root = write_leaf(tmp_path / "femnist", {"f_a": 12, "f_b": 10, "f_c": 9})
    keys = dict(rounds=4, checkpoint_every=2, batch_size=4, local_epochs=1, lr=0.01)
    return root, leaf_config(tmp_path, root, **{**keys, **over})


def test_a_leaf_run_resumes_only_on_the_json_its_first_rounds_read(tmp_path):
    root, cfg = _leaf(tmp_path)
    stop_after(cfg, 3)  # its checkpoint is after round 2
    recorded = run_data(cfg.output, cfg.run_id())
    assert recorded["files"] == 2 and set(recorded["digests"]) == {
        "all_data/all_data_0.json",
        "all_data/all_data_1.json",
    }
    assert Checkpoints(cfg.output, cfg.run_id()).latest().extra["data"] == recorded
    _relabel(root / "all_data" / "all_data_1.json")
    # refused before anything runs (what `fedray run` and a sweep call), then by the loop itself
    with pytest.raises(
        DataChanged,
        match=r"would go on from its checkpoint on other data .*all_data/all_data_1\.json changed.*--restart",
    ):
        begin(cfg, local=True)
    with pytest.raises(
        DataChanged, match=r"checkpoint after round 2 on other data .*all_data_1\.json changed"
    ):
        list(execute(cfg, make_local_federation))
    assert load_metrics(cfg.output)["round"].max() == 3  # nothing of the earlier attempt went
    assert Checkpoints(cfg.output, cfg.run_id()).latest().round == 2
    # --restart: from the start, on this data; recorded so
    events = list(execute(cfg, make_local_federation, restart=True))
    assert events[0].resumed_from == 0 and isinstance(events[-1], Finished)
    assert run_data(cfg.output, cfg.run_id())["sha256"] == identity(cfg)["sha256"] != recorded["sha256"]


def test_a_finished_leaf_run_is_not_skipped_on_other_json_and_force_runs_it_again(tmp_path):
    root, cfg = _leaf(tmp_path, rounds=2, checkpoint_every=0)
    list(execute(cfg, make_local_federation))
    assert begin(cfg, local=True).events is None  # unchanged: finished, skipped
    _relabel(root / "all_data" / "all_data_0.json")
    with pytest.raises(
        DataChanged,
        match=r"finished in .* on other data than it reads now \(under .*all_data/all_data_0\.json changed\).*--force",
    ):
        begin(cfg, local=True)
    with pytest.raises(DataChanged, match="finished in"):  # the loop refuses too, touching nothing
        list(execute(cfg, make_local_federation))
    assert run_state(cfg.output, cfg.run_id()) == "finished"
    forced = begin(cfg, local=True, force=True)
    assert isinstance(list(forced.events)[-1], Finished)
    assert begin(cfg, local=True).events is None  # finished on this data now


def test_data_left_as_it_was_resumes_to_the_uninterrupted_numbers(tmp_path):
    root, cfg = _leaf(tmp_path)
    ref = leaf_config(
        tmp_path / "ref", root, rounds=4, checkpoint_every=2, batch_size=4, local_epochs=1, lr=0.01
    )
    list(execute(ref, make_local_federation))
    stop_after(cfg, 3)
    path = root / "all_data" / "all_data_0.json"
    path.write_bytes(path.read_bytes())  # written again, the same bytes: the same data
    events = list(execute(cfg, make_local_federation))
    assert isinstance(events[0], Started) and events[0].resumed_from == 2
    got, want = (load_metrics(c.output).drop(columns=["elapsed", "run_id"]) for c in (cfg, ref))
    got, want = (m[~m["metric"].str.endswith("seconds")].reset_index(drop=True) for m in (got, want))
    assert got.equals(want)


def test_a_saved_hf_dataset_changed_between_rounds_is_refused_naming_its_file(tmp_path):
    pytest.importorskip("datasets")
    from tests.data.test_hf import femnist_like, hf_config

    folder = femnist_like(tmp_path / "femnist")
    cfg = hf_config(tmp_path, folder, rounds=3, checkpoint_every=1, batch_size=4, lr=0.05)
    stop_after(cfg, 2)
    shutil.rmtree(folder)
    femnist_like(folder, writers=(("w2", 6), ("w0", 5), ("w1", 5)))  # one more row of w1
    with pytest.raises(DataChanged, match=r"under .*femnist: .*data-00000-of-00001\.arrow changed"):
        begin(cfg, local=True)


def _client_files(root, label=0):
    rng = np.random.default_rng(0)

    def client(n):
        y = rng.integers(0, 3, n)
        y[0] = label
        return {
            "x_train": rng.random((n, 4), dtype=np.float32),
            "y_train": y,
            "x_test": rng.random((2, 4), dtype=np.float32),
            "y_test": y[:2],
        }

    test = (rng.random((6, 4), dtype=np.float32), np.arange(6) % 3)
    meta = {"num_classes": 3, "input_shape": [4]}
    return client_files.write(root, [client(8), client(6), client(7)], meta, global_test=test)


def test_client_files_changed_after_a_finished_run_refuse_it_in_one_line_and_a_sweep_before_it_runs(
    tmp_path, capsys
):
    from jobs.cli import main

    root = _client_files(tmp_path / "files")
    keys = {"dataset": "client_files", "data_root": str(root), "model": "mlp", "rounds": 1, "batch_size": 4}
    cfg = from_dict({**keys, "output": str(tmp_path / "out")})
    list(execute(cfg, make_local_federation))
    _client_files(tmp_path / "files", label=1)  # client 0's first label now 1
    args = [f"{k}={v}" for k, v in keys.items()]
    code = main(["run", "--local", *sum((["--set", a] for a in args), []), "--output", cfg.output])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "client_0000.npz changed" in err and "--force" in err, err
    path = sweep_file(tmp_path, "")
    path.write_text(
        "".join(f"{k}: {v}\n" for k, v in keys.items()) + f"output: {cfg.output}\ngrid:\n  lr: [0.05]\n"
    )
    assert main(["sweep", str(path), "--local", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert (
        "1 of its runs were made on other data" in err
        and "#1: run " in err
        and "client_0000.npz changed" in err
    )
    assert main(["sweep", str(path), "--local", "--force"]) == 0  # run again, on these files
    assert load_runs(cfg.output)["status"].tolist() == ["finished"]


def test_fashion_mnists_files_are_recorded_and_a_changed_one_named(tmp_path):
    mnist_like(tmp_path / "fm", FMNIST_NAMES)
    cfg = from_dict(
        {
            "dataset": "fmnist",
            "data_root": str(tmp_path / "fm"),
            "model": "mlp",
            "rounds": 1,
            "num_clients": 2,
            "output": str(tmp_path / "out"),
        }
    )
    was = identity(cfg)
    assert sorted(was["digests"]) == sorted(FMNIST_NAMES.values())
    images = tmp_path / "fm" / "t10k-images-idx3-ubyte"
    pixels = bytearray(images.read_bytes())
    pixels[-1] ^= 1  # one pixel of the last test image
    images.write_bytes(bytes(pixels))
    assert changes(was, identity(cfg)) == f"under {tmp_path / 'fm'}: t10k-images-idx3-ubyte changed"


def test_a_changed_partition_file_is_another_run_never_the_old_ones_checkpoint(tmp_path):
    from tests.conftest import small_config

    path = tmp_path / "clients.json"
    doc = {
        "train_size": 600,
        "clients": {"0": {"train": list(range(0, 300))}, "1": {"train": list(range(300, 600))}},
    }
    path.write_text(json.dumps(doc))
    cfg = small_config(
        tmp_path, num_clients=2, partition="file", partition_file=str(path), rounds=3, checkpoint_every=1
    )
    stop_after(cfg, 2)
    old = cfg.run_id()
    doc["clients"]["0"]["train"] = list(range(0, 299))
    path.write_text(json.dumps(doc))
    moved = small_config(
        tmp_path, num_clients=2, partition="file", partition_file=str(path), rounds=3, checkpoint_every=1
    )
    assert moved.run_id() != old  # the file's content names the run
    events = list(execute(moved, make_local_federation))
    assert events[0].resumed_from == 0 and isinstance(events[-1], Finished)
    assert run_state(cfg.output, old) == "interrupted"  # the old run, untouched
    assert Checkpoints(cfg.output, old).latest().round == 1  # stopped before round 2's


def test_a_row_written_before_runs_recorded_data_is_read_and_not_checked(tmp_path):
    root, cfg = _leaf(tmp_path, rounds=1, checkpoint_every=0)
    list(execute(cfg, make_local_federation))
    row = tmp_path / "out" / "runs" / f"{cfg.run_id()}.parquet"
    table = pq.read_table(row)
    pq.write_table(table.drop_columns(["data"]), row, write_page_checksum=True)
    assert run_data(cfg.output, cfg.run_id()) is None
    _relabel(root / "all_data" / "all_data_0.json")
    assert begin(cfg, local=True).events is None  # nothing to compare with: finished, as before
    assert load_runs(cfg.output)["data"].isna().all()
