"""A cell of `fedray report` holds each seed of one setting once, on one data set and one partition:
runs on other data, or on another content of the partition file their seeds share, are other
columns; a seed run again (its partition file edited: another run id, the same config) counts once."""

from __future__ import annotations

import os

import numpy as np
import pytest

from analysis import pivot, run_values, wide_tables
from analysis.report import label_runs
from fedray.storage.writer import ResultsWriter
from tests.conftest import small_config
from tests.helpers import final


def _config(tmp_path, **over):
    return {**small_config(tmp_path).to_dict(), "experiment": "t", "hp": {}, **over}


def _write(out, run_id, config, acc, data=None, partition=None):
    """A finished run ``run_id`` with final accuracy ``acc``, the data it recorded (``data``: its
    runs/ row's, `fedray.data.identity`), and the partition it wrote (``partition``: client ->
    training indices)."""
    w = ResultsWriter(out, run_id, config, flush_every_s=0)
    w.start()
    w.data = data
    if partition is not None:
        index = np.concatenate(partition)
        w.write_partition(
            {
                "client": np.repeat(np.arange(len(partition)), [len(p) for p in partition]),
                "split": np.array(["train"] * len(index), dtype=object),
                "index": index,
                "source": np.array(["train"] * len(index), dtype=object),
            },
            len(index),
            config["dataset"],
        )
    for r, records in final(acc).items():
        w.add(r, records)
    w.finish({})


def _cells(out):
    return pivot(run_values(out))[["col", "n", "mean"]].values.tolist()


def test_runs_of_one_setting_on_other_data_are_other_columns(tmp_path):
    # The runs/ row's data (the SHA-256s of the files a dataset read): seeds on other bytes of the
    # same data_root were one cell, "mean over seeds" of two data sets.
    out, cfg = tmp_path / "out", _config(tmp_path)
    a, b = {"root": "/d", "files": 1, "sha256": "a" * 64}, {"root": "/d", "files": 1, "sha256": "b" * 64}
    _write(out, "s0", {**cfg, "seed": 0}, 0.70, data=a)
    _write(out, "s1", {**cfg, "seed": 1}, 0.80, data=a)
    _write(out, "s2", {**cfg, "seed": 2}, 0.40, data=b)
    assert _cells(out) == [
        ["fedavg data_sha256=aaaaaaaa", 2, pytest.approx(0.75)],
        ["fedavg data_sha256=bbbbbbbb", 1, pytest.approx(0.40)],
    ]


def test_a_run_that_recorded_no_data_is_not_told_apart_by_it(tmp_path):
    # Recorded before fedray recorded data, beside later seeds of one data set: one cell, no label.
    out, cfg = tmp_path / "out", _config(tmp_path)
    a = {"root": "/d", "files": 1, "sha256": "a" * 64}
    _write(out, "s0", {**cfg, "seed": 0}, 0.70)
    _write(out, "s1", {**cfg, "seed": 1}, 0.80, data=a)
    assert _cells(out) == [["fedavg", 2, pytest.approx(0.75)]]


def test_seeds_of_one_partition_file_on_its_other_contents_are_other_columns(tmp_path):
    # partition: file with one file for every seed: its content, as each run wrote it in partitions/,
    # tells the runs apart (the config names the file by path alone)
    out = tmp_path / "out"
    cfg = _config(tmp_path, partition="file", partition_file=str(tmp_path / "p.json"))
    one, other = [np.arange(0, 300), np.arange(300, 600)], [np.arange(0, 200), np.arange(200, 600)]
    _write(out, "s0", {**cfg, "seed": 0}, 0.70, partition=one)
    _write(out, "s1", {**cfg, "seed": 1}, 0.80, partition=one)
    _write(out, "s0-edited", {**cfg, "seed": 0}, 0.30, partition=other)
    cells = _cells(out)
    assert [n for _, n, _ in cells] == [2, 1] and cells[0][2] == pytest.approx(0.75)
    assert all(col.startswith("fedavg partition_sha256=") for col, _, _ in cells)
    # each seed with its own file ({seed}): the files differ by design; no column per seed
    per_seed = tmp_path / "per-seed"
    cfg = _config(tmp_path, partition="file", partition_file=str(tmp_path / "p{seed}.json"))
    _write(per_seed, "s0", {**cfg, "seed": 0}, 0.70, partition=one)
    _write(per_seed, "s1", {**cfg, "seed": 1}, 0.80, partition=other)
    assert _cells(per_seed) == [["fedavg", 2, pytest.approx(0.75)]]


def test_a_seed_run_again_after_its_partition_file_was_edited_counts_once(tmp_path, capsys):
    # The issue's folder: seed 0's partition file edited with its size and mtime kept gave a new run
    # id and a second run of seed 0 without a word, and the report showed "(2)" seeds for one.
    from fedray.data import partition_file
    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import execute
    from jobs.cli import main

    template = tmp_path / "p{seed}.json"

    def draw(seed, perm):
        path = tmp_path / f"p{seed}.json"
        partition_file.write_json(path, np.array_split(np.random.default_rng(perm).permutation(600), 6), 600)
        return path

    ids = []
    for seed in (0, 1):
        draw(seed, seed)
        cfg = small_config(tmp_path, rounds=2, partition="file", partition_file=str(template), seed=seed)
        list(execute(cfg, make_local_federation))
        ids.append(cfg.run_id())
    was = os.stat(tmp_path / "p0.json")
    path = draw(0, 7)
    os.utime(path, ns=(was.st_atime_ns, was.st_mtime_ns))
    assert os.stat(path).st_size == was.st_size
    again = small_config(tmp_path, rounds=2, partition="file", partition_file=str(template), seed=0)
    list(execute(again, make_local_federation))
    assert again.run_id() not in ids  # the run id hashes the file's content
    values = run_values(tmp_path / "out")
    cells = pivot(values)
    assert cells["n"].tolist() == [2]  # seeds 0 and 1, not 0, 0 and 1
    latest = values.set_index("run_id").loc[[again.run_id(), ids[1]], "value"].mean()
    assert cells["mean"].iloc[0] == pytest.approx(latest)
    (repeat,) = cells.attrs["repeats"]
    assert (repeat["run_id"], repeat["counted"], repeat["seed"]) == (ids[0], again.run_id(), 0)
    capsys.readouterr()
    assert main(["report", str(tmp_path / "out"), "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert "(2)" in text and "(3)" not in text
    (line,) = [x for x in text.splitlines() if "left out" in x]
    assert ids[0] in line and again.run_id() in line and "seed 0" in line
    assert f"the content of partition_file '{template}'" in line


def test_the_same_seed_run_packed_and_alone_counts_once_naming_what_differs(tmp_path):
    # pack_runs is in the run id and not in the cell's label (packed and alone share a cell): the
    # same seed both ways counted twice
    out, cfg = tmp_path / "out", _config(tmp_path, batched_clients="on")
    _write(out, "packed", {**cfg, "seed": 0, "pack_runs": "on"}, 0.70)
    _write(out, "alone", {**cfg, "seed": 0, "pack_runs": "off"}, 0.72)
    _write(out, "s1", {**cfg, "seed": 1, "pack_runs": "off"}, 0.80)
    cells = pivot(run_values(out))
    assert cells[["col", "n"]].values.tolist() == [["fedavg", 2]]
    assert cells["mean"].iloc[0] == pytest.approx(0.76)  # 0.72 (the later seed 0) and 0.80
    (repeat,) = cells.attrs["repeats"]
    assert repeat["run_id"] == "packed" and repeat["counted"] == "alone"
    assert repeat["differs"] == "pack_runs (on, then off)"
    text = wide_tables(cells, ("dataset", "partition"), "accuracy")["t"]
    assert text["fedavg"].tolist() == ["76.0 ± 5.7 (2)"]


def test_the_plots_count_a_seed_once_too(tmp_path):
    # the plots group runs as the table does (label_runs)
    from analysis import accuracy_curves, load_runs

    out, cfg = tmp_path / "out", _config(tmp_path)
    _write(out, "old", {**cfg, "seed": 0, "pack_runs": "on"}, 0.70)
    _write(out, "new", {**cfg, "seed": 0, "pack_runs": "off"}, 0.90)
    labelled = label_runs(load_runs(out).sort_values("started"), ("dataset",), ("algorithm",))
    assert labelled["run_id"].tolist() == ["new"]
    curves = accuracy_curves(out)
    assert curves[curves["round"] == 2][["mean", "seeds"]].values.tolist() == [[pytest.approx(0.90), 1]]
