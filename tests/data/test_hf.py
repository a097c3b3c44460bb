"""Dataset hf: a federated dataset in the Hugging Face hub's format (its rows name their clients),
on small datasets saved here with the library itself: nothing downloads."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedray.config.keys import ConfigError
from fedray.data.hf import HfSettings, hf_data
from fedray.data.leaf import SHAKESPEARE_VOCAB
from fedray.experiment.checks import from_dict

datasets = pytest.importorskip("datasets")  # fedray[hf], in the test extras


def femnist_like(folder, writers=(("w2", 6), ("w0", 5), ("w1", 4)), test=False):
    """As flwrlabs/femnist: a grey image, its class ("character") and its writer ("writer_id")."""
    rng = np.random.default_rng(0)

    def rows(spec):
        ids = [w for w, n in spec for _ in range(n)]
        images = [rng.integers(0, 256, (28, 28), dtype=np.uint8) for _ in ids]
        return (
            datasets.Dataset.from_dict(
                {"image": images, "character": rng.integers(0, 62, len(ids)).tolist(), "writer_id": ids}
            )
            .cast_column("image", datasets.Image())
            .cast_column("character", datasets.ClassLabel(num_classes=62))
        )

    splits = {"train": rows(writers)}
    if test:
        splits["test"] = rows([(w, 2) for w, _ in writers])
    datasets.DatasetDict(splits).save_to_disk(str(folder))
    return folder


def hf_config(tmp_path, folder, **over):
    """A config of dataset hf on ``folder``; a key of its own settings (data.NAME: label_column,
    test_split, min_samples, ...) given by its name."""
    keys = {
        "dataset": "hf",
        "name": str(folder),
        "client_column": "writer_id",
        "input_column": "image",
        "label_column": "character",
        "model": "leaf_cnn",
        "num_clients": 3,
        "client_test_fraction": 0.2,
        "output": str(tmp_path / "out"),
    }
    own = {f.name for f in dataclasses.fields(HfSettings)}
    given = {k: v for k, v in {**keys, **over}.items() if v is not None}  # None: left out
    data = {k: v for k, v in given.items() if k in own}
    return from_dict({**{k: v for k, v in given.items() if k not in own}, "data": data})


def test_the_rows_clients_are_the_clients_sorted_each_with_its_own_test_split(tmp_path):
    folder = femnist_like(tmp_path / "femnist")
    data = hf_data(hf_config(tmp_path, folder))
    # w0, w1, w2: 5, 4, 6 rows, each split by LEAF's rule: max(1, int(0.8 n)) train, the rest test
    assert [(len(c.train), len(c.test)) for c in data.clients.values()] == [(4, 1), (3, 1), (4, 2)]
    assert len(data.dataset.test) == 4 and data.dataset.spec.input_shape == (1, 28, 28)
    assert (
        data.dataset.spec.num_classes == 62  # the label column's ClassLabel says so
    )
    saved = datasets.load_from_disk(str(folder))["train"]
    w1 = [i for i, w in enumerate(saved["writer_id"]) if w == "w1"]  # client 1: its rows, read as stored
    mine = data.clients[1]
    got = data.dataset.train.x[np.concatenate([mine.train, mine.test])]
    want = np.stack([np.asarray(saved[i]["image"].convert("L")) for i in w1])[:, None]
    assert sorted(map(bytes, got)) == sorted(map(bytes, want))
    labels = data.dataset.train.y[np.concatenate([mine.train, mine.test])]
    assert sorted(labels) == sorted(saved[i]["character"] for i in w1)
    with pytest.raises(
        ConfigError,
        match=r"'num_clients': .*'writer_id' names 3 clients .*; set num_clients: 3, or leave it out",
    ):
        hf_config(tmp_path, folder, num_clients=4)


def test_a_test_split_of_the_same_clients_is_their_test_rows(tmp_path):
    folder = femnist_like(tmp_path / "femnist", test=True)
    data = hf_data(hf_config(tmp_path, folder, test_split="test", client_test_fraction=0.0))
    assert [(len(c.train), len(c.test)) for c in data.clients.values()] == [(5, 2), (4, 2), (6, 2)]
    with pytest.raises(
        ConfigError, match=r"'client_test_fraction': dataset hf's test samples are each client's own"
    ):
        hf_config(tmp_path, folder, client_test_fraction=0.0)


def test_a_missing_column_or_split_is_one_line_naming_it_before_anything_runs(tmp_path):
    folder = femnist_like(tmp_path / "femnist")
    with pytest.raises(
        ConfigError,
        match=r"'data.label_column': 'label' is not a column of .* \(its columns: image, character, writer_id\)",
    ):
        hf_config(tmp_path, folder, label_column="label")
    with pytest.raises(
        ConfigError, match=r"'data.split': .* has no split 'validation' \(its splits: train\)"
    ):
        hf_config(tmp_path, folder, split="validation")


def test_a_hub_dataset_not_kept_here_says_what_to_run_and_where_in_one_line(tmp_path):
    from tests.helpers import FEDRAY, run

    sets = [
        "dataset=hf",
        "data.name=flwrlabs/femnist",
        f"data_root={tmp_path / 'hub'}",
        "data.client_column=writer_id",
    ]
    p = run([*FEDRAY, "run", *(x for kv in sets for x in ("--set", kv))], cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "flwrlabs/femnist is not in" in p.stderr and "flwrlabs__femnist" in p.stderr
    assert "--set download=true" in p.stderr and "save_to_disk" in p.stderr


def test_text_rows_are_next_character_data_over_leafs_symbols_and_train(tmp_path):
    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import Finished, execute

    rng = np.random.default_rng(1)
    pick = lambda k: "".join(rng.choice(list(SHAKESPEARE_VOCAB), k))  # noqa: E731
    # ROMEO's and JULIET's lines interleaved, and a role too short for LEAF's split
    roles = [r for _ in range(100) for r in ("ROMEO", "JULIET")][:195] + ["NURSE"] * 85
    x = [pick(80) for _ in roles]
    datasets.Dataset.from_dict({"x": x, "y": [pick(1) for _ in roles], "character_id": roles}).save_to_disk(
        str(tmp_path / "shakespeare")
    )
    keys = dict(client_column="character_id", input_column="x", label_column="y", model="leaf_lstm")
    cfg = hf_config(
        tmp_path,
        tmp_path / "shakespeare",
        rounds=1,
        batch_size=4,
        client_test_fraction=0.9,
        num_clients=None,
        **keys,
    )
    # num_clients left out: the roles LEAF's rules keep. Text is split in order, its test rows a
    # window's length - 1 after its training ones (none overlaps a training window): JULIET's 97
    # rows train on max(1, int(0.1 * 97)) = 9, then test on rows 9 + 79 = 88..96; NURSE's 85 leave no
    # test row after the gap, so NURSE is dropped, as LEAF drops such a role
    assert cfg.num_clients == 2
    data = hf_data(cfg)
    assert data.dataset.spec.input_shape == (80,) and data.dataset.spec.num_classes == 80
    juliet = [i for i, r in enumerate(roles) if r == "JULIET"]
    text = lambda rows: ["".join(SHAKESPEARE_VOCAB[c] for c in data.dataset.train.x[r]) for r in rows]  # noqa: E731
    assert text(data.clients[0].train) == [x[i] for i in juliet[:9]]
    assert text(data.clients[0].test) == [x[i] for i in juliet[88:]]
    assert [(len(c.train), len(c.test)) for c in data.clients.values()] == [(9, 9), (9, 10)]  # JULIET, ROMEO
    # the split is the data's own: another training seed reads the same rows
    again = hf_data(
        hf_config(
            tmp_path,
            tmp_path / "shakespeare",
            rounds=1,
            seed=3,
            client_test_fraction=0.9,
            num_clients=None,
            **keys,
        )
    )
    assert np.array_equal(again.dataset.train.x, data.dataset.train.x)
    events = list(execute(cfg, make_local_federation))
    assert isinstance(events[-1], Finished)


def test_fedavg_runs_on_a_saved_hub_dataset(tmp_path):
    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import Finished, execute

    cfg = hf_config(tmp_path, femnist_like(tmp_path / "femnist"), rounds=2, batch_size=4, lr=0.05)
    events = list(execute(cfg, make_local_federation))
    assert isinstance(events[-1], Finished) and 0 <= events[-1].summary["final_accuracy"] <= 1
    assert events[-1].summary["partition_label"] == "hf"  # its clients, not a partition drawn


def test_two_wrong_columns_are_one_message_naming_both(tmp_path):
    folder = femnist_like(tmp_path / "femnist")
    with pytest.raises(ConfigError) as e:
        hf_config(tmp_path, folder, input_column="img", label_column="label")
    said = str(e.value)
    assert (
        "'data.input_column': 'img' is not a column" in said
        and "'data.label_column': 'label' is not a column" in said
    )
    assert "data_root" not in said and said.count("config key 'data.input_column'") == 1


def test_number_arrays_of_one_channel_get_it_and_small_clients_follow_leafs_rule(tmp_path):
    rng = np.random.default_rng(2)
    ids = ["a"] * 6 + ["b"] * 1 + ["c"] * 3  # b: one row, which LEAF's split cannot split: dropped
    datasets.Dataset.from_dict(
        {
            "pixels": [rng.random((28, 28)).astype(np.float32) for _ in ids],
            "label": rng.integers(0, 10, len(ids)).tolist(),
            "who": ids,
        }
    ).save_to_disk(str(tmp_path / "arrays"))
    keys = dict(client_column="who", input_column="pixels", label_column="label", num_clients=None)
    cfg = hf_config(tmp_path, tmp_path / "arrays", **keys)
    data = hf_data(cfg)
    assert cfg.num_clients == 2 and data.dataset.spec.input_shape == (1, 28, 28)  # leaf_cnn takes them
    assert [(len(c.train), len(c.test)) for c in data.clients.values()] == [(4, 2), (2, 1)]  # a, c
    # data.min_samples as LEAF's -k
    assert hf_config(tmp_path, tmp_path / "arrays", min_samples=4, **keys).num_clients == 1
    with pytest.raises(ConfigError, match=r"'data.client_column': no client .* is left"):
        hf_config(tmp_path, tmp_path / "arrays", min_samples=7, **keys)


def test_uint8_arrays_and_images_of_the_same_pixels_give_the_same_inputs(tmp_path):
    rng = np.random.default_rng(5)
    pixels = [rng.integers(0, 256, (28, 28), dtype=np.uint8) for _ in range(8)]
    labels, who = [int(v) for v in rng.integers(0, 10, 8)], ["a"] * 4 + ["b"] * 4
    features = datasets.Features(
        {
            "img": datasets.Array2D((28, 28), "uint8"),
            "label": datasets.Value("int64"),
            "who": datasets.Value("string"),
        }
    )
    datasets.Dataset.from_dict({"img": pixels, "label": labels, "who": who}, features=features).save_to_disk(
        str(tmp_path / "arr")
    )
    datasets.Dataset.from_dict({"img": pixels, "label": labels, "who": who}).cast_column(
        "img", datasets.Image()
    ).save_to_disk(str(tmp_path / "img"))
    keys = dict(client_column="who", input_column="img", label_column="label", client_test_fraction=0.25)
    a, b = (hf_data(hf_config(tmp_path, tmp_path / k, num_clients=2, **keys)).dataset for k in ("arr", "img"))
    assert a.spec.scale == b.spec.scale == 1 / 255 and a.train.x.dtype == b.train.x.dtype == np.uint8
    assert np.array_equal(a.train.x, b.train.x) and np.array_equal(a.train.y, b.train.y)


@pytest.mark.parametrize(
    "make, keys, message",
    [
        (
            lambda r: {"character": [None]},
            {},
            r"column 'character': sample 0's label is None, not a class id",
        ),
        (
            lambda r: {"writer_id": [None]},
            {},
            r"column 'writer_id': row 0 names no client \(null\)",
        ),
        (
            lambda r: {},
            {"test_split": "train", "client_test_fraction": 0.0},
            r"'data.test_split': 'train' is the training split",
        ),
    ],
)
def test_hf_rows_that_would_change_numbers_silently_are_refused(tmp_path, make, keys, message):
    folder = femnist_like(tmp_path / "src")
    train = datasets.load_from_disk(str(folder))["train"]
    first = make({"character": [0], "writer_id": ["w0"]})  # what row 0 becomes
    changed = train.map(lambda r, i: {k: v[0] for k, v in first.items()} if i == 0 else {}, with_indices=True)
    datasets.DatasetDict({"train": changed}).save_to_disk(str(tmp_path / "bad"))
    with pytest.raises(ConfigError, match=message):
        hf_config(tmp_path, tmp_path / "bad", **keys)


def test_a_test_split_of_another_size_or_type_or_classes_is_refused(tmp_path):
    def saved(name, test_shape, test_type, test_labels):
        def split(shape, dtype, labels):
            return datasets.Dataset.from_dict(
                {"x": [np.zeros(shape, dtype) for _ in labels], "y": labels, "c": ["a"] * len(labels)},
                features=datasets.Features(
                    {
                        "x": datasets.Array2D(shape, dtype),
                        "y": datasets.ClassLabel(num_classes=3),
                        "c": datasets.Value("string"),
                    }
                ),
            )

        datasets.DatasetDict(
            {"train": split((8, 8), "uint8", [0, 1, 2]), "test": split(test_shape, test_type, test_labels)}
        ).save_to_disk(str(tmp_path / name))
        return tmp_path / name

    keys = dict(
        client_column="c",
        input_column="x",
        label_column="y",
        test_split="test",
        client_test_fraction=0.0,
        model="mlp",
        num_clients=1,
    )
    with pytest.raises(
        ConfigError, match=r"split 'test': its inputs are \[1, 6, 6\], the training split's \[1, 8, 8\]"
    ):
        hf_data(hf_config(tmp_path, saved("shape", (6, 6), "uint8", [0]), **keys))
    with pytest.raises(
        ConfigError, match=r"split 'test': its inputs are stored as float32 and the training split's as uint8"
    ):
        hf_data(hf_config(tmp_path, saved("type", (8, 8), "float32", [0]), **keys))


def test_a_download_without_a_reachable_hub_is_one_line_at_once(tmp_path):
    import time

    from tests.helpers import FEDRAY, run

    sets = [
        "dataset=hf",
        "data.name=flwrlabs/femnist",
        f"data_root={tmp_path / 'hub'}",
        "data.client_column=writer_id",
        "download=true",
    ]
    env = {**__import__("os").environ, "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens there
    t0 = time.monotonic()
    p = run([*FEDRAY, "run", "--local", *(x for kv in sets for x in ("--set", kv))], cwd=tmp_path, env=env)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert (
        "cannot download flwrlabs/femnist: 127.0.0.1 cannot be reached" in p.stderr
        and "Retrying" not in p.stderr
    )
    assert time.monotonic() - t0 < 60
