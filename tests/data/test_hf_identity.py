"""Dataset hf's data identity: a run records the SHA-256 of exactly the files the `datasets`
library's ``load_from_disk`` reads of the saved folder (its JSON, and the Arrow files its state.json
names, whatever their names: a ``cache-*.arrow`` too), and of nothing else (a README, the cache
files ``map`` writes beside a split): a read file changed refuses a resume; an unread file added
changes nothing."""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import shutil

import pyarrow as pa
import pytest

from fedray.api import begin
from fedray.data.hf import hf_data
from fedray.data.identity import DataChanged, identity
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import Finished, execute
from fedray.storage.results import run_data
from tests.data.test_hf import femnist_like, hf_config
from tests.helpers import stop_after

datasets = pytest.importorskip("datasets")

CACHE = "cache-5e1f0c2a9b3d4e6f.arrow"  # an Arrow file a state.json names by a cache file's name


@contextlib.contextmanager
def opened_under(monkeypatch, folder):
    """The files under ``folder`` opened while in the block: the JSON (``open``) and the Arrow
    files (pyarrow's memory map or stream: how `datasets` reads them)."""
    seen: set[str] = set()
    root = os.path.realpath(folder)

    def note(path):
        if isinstance(path, (str, os.PathLike)):
            p = os.path.realpath(os.fspath(path))
            if p.startswith(root + os.sep):
                seen.add(os.path.relpath(p, root))

    def spy(real):
        def call(path, *a, **k):
            note(path)
            return real(path, *a, **k)

        return call

    with monkeypatch.context() as m:
        m.setattr(builtins, "open", spy(builtins.open))
        m.setattr(pa, "memory_map", spy(pa.memory_map))
        m.setattr(pa, "input_stream", spy(pa.input_stream))
        yield seen


def with_files_beside(folder):
    """What lies beside a saved dataset that the library never reads back: a README, and the cache
    file ``map`` writes in a split's folder."""
    datasets.load_from_disk(str(folder))["train"].map(lambda r: {"character": 1})
    (folder / "README.md").write_text("# a dataset card\n")
    assert list(folder.glob("train/cache-*.arrow"))
    return folder


def cache_named(folder):
    """A saved dataset whose train split's state.json names its Arrow file ``cache-*.arrow`` (as a
    tool that writes the folder itself may name it): load_from_disk reads it all the same."""
    split = folder / "train"
    (split / "data-00000-of-00001.arrow").rename(split / CACHE)
    state = json.loads((split / "state.json").read_text())
    state["_data_files"] = [{"filename": CACHE}]
    (split / "state.json").write_text(json.dumps(state))
    return folder


def test_the_files_recorded_are_the_ones_load_from_disk_and_the_run_read(tmp_path, monkeypatch):
    split_files = {"state.json", "dataset_info.json", "data-00000-of-00001.arrow"}
    # a DatasetDict: its dataset_dict.json and each split's files, every split (the loader maps them all)
    folder = with_files_beside(femnist_like(tmp_path / "dict", test=True))
    cfg = hf_config(tmp_path, folder, test_split="test", client_test_fraction=0.0)
    with opened_under(monkeypatch, folder) as library:
        datasets.load_from_disk(str(folder))
    with opened_under(monkeypatch, folder) as run:
        hf_data(cfg)
    want = {"dataset_dict.json", *(f"{s}/{f}" for s in ("train", "test") for f in split_files)}
    assert library == run == want
    assert set(identity(cfg)["digests"]) == want  # not README.md, not train/cache-*.arrow
    # one Dataset, saved alone
    alone = tmp_path / "alone"
    datasets.load_from_disk(str(femnist_like(tmp_path / "src")))["train"].save_to_disk(str(alone))
    (alone / "README.md").write_text("# a dataset card\n")
    cfg = hf_config(tmp_path, alone)
    with opened_under(monkeypatch, alone) as library:
        datasets.load_from_disk(str(alone))
    assert library == split_files == set(identity(cfg)["digests"])
    # an Arrow file state.json names is read, whatever its name: a cache-*.arrow too
    named = cache_named(femnist_like(tmp_path / "named"))
    cfg = hf_config(tmp_path, named)
    with opened_under(monkeypatch, named) as library:
        datasets.load_from_disk(str(named))
    want = {"dataset_dict.json", "train/state.json", "train/dataset_info.json", f"train/{CACHE}"}
    assert library == want == set(identity(cfg)["digests"])


def test_a_read_cache_file_replaced_after_a_checkpoint_refuses_the_resume_naming_it(tmp_path):
    folder = cache_named(femnist_like(tmp_path / "femnist"))
    cfg = hf_config(tmp_path, folder, rounds=4, checkpoint_every=2, batch_size=4, lr=0.05)
    stop_after(cfg, 3)  # its checkpoint is after round 2
    assert f"train/{CACHE}" in run_data(cfg.output, cfg.run_id())["digests"]
    other = femnist_like(tmp_path / "other", writers=(("w2", 6), ("w0", 5), ("w1", 5)))  # one more row of w1
    shutil.copyfile(other / "train" / "data-00000-of-00001.arrow", folder / "train" / CACHE)
    with pytest.raises(DataChanged, match=rf"under .*femnist: train/{CACHE} changed"):
        begin(cfg, local=True)
    with pytest.raises(DataChanged, match=rf"checkpoint after round 2 on other data .*train/{CACHE} changed"):
        list(execute(cfg, make_local_federation))


def test_files_the_loader_never_reads_added_after_a_checkpoint_change_nothing(tmp_path):
    folder = femnist_like(tmp_path / "femnist")
    cfg = hf_config(tmp_path, folder, rounds=4, checkpoint_every=2, batch_size=4, lr=0.05)
    stop_after(cfg, 3)  # its checkpoint is after round 2
    recorded = run_data(cfg.output, cfg.run_id())
    with_files_beside(folder)
    (folder / "train" / "notes.txt").write_text("unread\n")
    assert identity(cfg) == recorded
    events = list(execute(cfg, make_local_federation))  # resumed, not refused
    assert events[0].resumed_from == 2 and isinstance(events[-1], Finished)
    (folder / "LICENSE").write_text("CC-BY\n")
    assert begin(cfg, local=True).events is None  # finished on this data: skipped, not refused
