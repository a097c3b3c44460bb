"""Dataset hf's rows checked at load, before any round: a ``data.test_split`` of training rows (all
refused, some said once with how many), NaN or infinite numbers in the input column (refused,
naming the column, the split, how many rows and the first), and clients made again from other
bytes under an unchanged state.json."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from fedray.config.keys import ConfigError
from fedray.data.hf import hf_data
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import RoundDone, execute
from tests.data.test_hf import femnist_like, hf_config

datasets = pytest.importorskip("datasets")

TEST_SPLIT = dict(test_split="test", client_test_fraction=0.0)


def with_test(folder, train, test):
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(folder))
    return folder


def test_a_test_split_of_training_rows_is_refused_in_one_line_before_any_round(tmp_path):
    from tests.helpers import FEDRAY, run

    train = datasets.load_from_disk(str(femnist_like(tmp_path / "src")))["train"]
    same = with_test(tmp_path / "same", train, train)  # the training rows, under another split name
    sets = {
        "dataset": "hf",
        "data.name": str(same),
        "data.client_column": "writer_id",
        "data.input_column": "image",
        "data.label_column": "character",
        "data.test_split": "test",
        "client_test_fraction": 0,
        "model": "leaf_cnn",
        "rounds": 1,
        "output": str(tmp_path / "out"),
    }
    p = run(
        [*FEDRAY, "run", "--local", *(x for k, v in sets.items() for x in ("--set", f"{k}={v}"))],
        cwd=tmp_path,
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert (
        "config key 'data.test_split': the 15 rows of" in p.stderr
        and "split 'test' are all rows of split 'train' (the same input and label)" in p.stderr
    ), p.stderr
    assert not (tmp_path / "out" / "metrics").exists() or not any((tmp_path / "out" / "metrics").iterdir())
    # some of the training rows, shuffled, are training rows all the same
    part = with_test(tmp_path / "part", train, train.select([9, 2, 4]))
    cfg = hf_config(tmp_path, part, **TEST_SPLIT)
    with pytest.raises(ConfigError, match=r"the 3 rows of .*split 'test' are all rows of split 'train'"):
        list(execute(cfg, make_local_federation))


def test_a_test_split_sharing_some_training_rows_is_said_once_with_how_many(tmp_path, capsys):
    src = femnist_like(tmp_path / "src", test=True)
    saved = datasets.load_from_disk(str(src))
    train, test = saved["train"], saved["test"]
    relabelled = train.select([5]).map(lambda r: {"character": (r["character"] + 1) % 62})
    # 6 held-out rows, 2 training rows, and a training image under another label (not the same row)
    mixed = datasets.concatenate_datasets([test, train.select([0, 7]), relabelled])
    folder = with_test(tmp_path / "mixed", train, mixed)
    cfg = hf_config(tmp_path, folder, **TEST_SPLIT)
    capsys.readouterr()
    data = hf_data(cfg)
    assert len(data.dataset.test) == 9  # its rows, read as they are
    hf_data(cfg)  # a second load (a sweep's next run): not said again
    err = capsys.readouterr().err
    line = (
        f"fedray: dataset hf {folder}: 2 of the 9 test rows of split 'test' are rows of split 'train' too "
        "(the same input and label): its test accuracy is partly training accuracy\n"
    )
    assert err.count(line) == 1 and err.count("training accuracy") == 1, err
    capsys.readouterr()
    hf_data(hf_config(tmp_path, with_test(tmp_path / "held", train, test), **TEST_SPLIT))
    assert "training" not in capsys.readouterr().err  # held-out rows: nothing said


def numbers(folder, rows, test_rows=None):
    """Rows of 4 numbers (float32 arrays, or lists of floats where ``rows`` holds a None), two clients."""
    n = len(rows)
    split = lambda xs: datasets.Dataset.from_dict(  # noqa: E731
        {"x": xs, "y": [i % 2 for i in range(len(xs))], "c": ["a", "b"] * (len(xs) // 2)}
    )
    good = [[float(i), 1.0, 2.0, 3.0] for i in range(n)]
    with_test(folder, split(rows), split(test_rows if test_rows is not None else good))
    return folder


def bad_rows(value, at=(3, 7), n=10):
    rows = [[float(i), 1.0, 2.0, 3.0] for i in range(n)]
    for i in at:
        rows[i][1] = value
    return rows


@pytest.mark.parametrize(
    "value, what",
    [
        (float("nan"), "NaN or infinite values"),
        (float("-inf"), "NaN or infinite values"),
        (None, r"NaN or infinite values \(a null reads as NaN\)"),
        (1e300, "numbers beyond float32's range"),
    ],
)
def test_nan_or_infinite_inputs_are_refused_at_load_naming_column_split_rows_and_the_first(
    tmp_path, value, what
):
    keys = dict(client_column="c", input_column="x", label_column="y", model="mlp", num_clients=2)
    cfg = hf_config(tmp_path, numbers(tmp_path / "train", bad_rows(value)), **keys)
    message = rf"dataset hf .*: split 'train', column 'x': 2 of its 10 rows hold {what}.*, the first row 3: "
    with pytest.raises(ConfigError, match=message):
        hf_data(cfg)
    seen = []
    with pytest.raises(ConfigError, match=message):  # refused before any round
        for ev in execute(cfg, make_local_federation):
            seen.append(ev)
    assert not any(isinstance(ev, RoundDone) for ev in seen)
    # in a test split: named so, its row counted in that split
    good = [[float(i), 1.0, 2.0, 3.0] for i in range(10)]
    folder = numbers(tmp_path / "test", good, bad_rows(value, at=(1,), n=4))
    with pytest.raises(
        ConfigError, match=rf"split 'test', column 'x': 1 of its 4 rows holds {what}.*, the first row 1: "
    ):
        hf_data(hf_config(tmp_path, folder, **keys, **TEST_SPLIT))


def test_finite_numbers_load_as_float32_as_they_are(tmp_path):
    keys = dict(client_column="c", input_column="x", label_column="y", model="mlp", num_clients=2)
    rows = bad_rows(3.0e38)  # large, within float32's range
    data = hf_data(hf_config(tmp_path, numbers(tmp_path / "ok", rows), **keys))
    assert data.dataset.train.x.dtype == np.float32 and np.isfinite(data.dataset.train.x).all()
    assert sorted(data.dataset.train.x[:, 1].tolist()).count(np.float32(3.0e38)) == 2


def test_other_arrow_bytes_under_the_same_state_json_are_read_as_they_are_now(tmp_path):
    folder = femnist_like(tmp_path / "femnist")
    cfg = hf_config(tmp_path, folder)
    assert [(len(c.train), len(c.test)) for c in hf_data(cfg).clients.values()] == [(4, 1), (3, 1), (4, 2)]
    state = (folder / "train" / "state.json").read_text()
    other = femnist_like(tmp_path / "other", writers=(("w2", 6), ("w0", 5), ("w1", 5)))  # one more row of w1
    arrow = folder / "train" / "data-00000-of-00001.arrow"
    shutil.copyfile(other / "train" / "data-00000-of-00001.arrow", tmp_path / "new.arrow")
    os.replace(tmp_path / "new.arrow", arrow)  # state.json (its fingerprint) as it was
    assert (folder / "train" / "state.json").read_text() == state
    assert json.loads(state)["_fingerprint"]
    data = hf_data(cfg)
    assert [(len(c.train), len(c.test)) for c in data.clients.values()] == [(4, 1), (4, 1), (4, 2)]
    assert len(data.dataset.train) == 16
