"""Datasets load from files the tests make (no downloads); missing data says how to get it."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fedray.data import DatasetMissing, build_federated_data, check_available, dataset_info, load_dataset
from fedray.data.datasets import crop_flip
from fedray.experiment.checks import from_dict
from tests.helpers import FMNIST_NAMES, G, mnist_like


@pytest.mark.parametrize("gz", [True, False])
def test_fmnist_reads_idx_files_from_data_root(tmp_path, gz):
    xs, ys = mnist_like(tmp_path, FMNIST_NAMES, gz=gz)
    cfg = from_dict(
        {"dataset": "fmnist", "data_root": str(tmp_path), "model": "simple_cnn", "num_clients": 5}
    )
    check_available(cfg)
    ds = load_dataset(cfg)
    assert ds.train.x.shape == (50, 1, 28, 28) and ds.train.x.dtype == np.uint8
    np.testing.assert_array_equal(ds.train.x[:, 0], xs["train"])
    np.testing.assert_array_equal(ds.test.y, ys["test"])
    t = ds.spec.to_tensor(ds.train.x[:2])
    assert t.dtype == torch.float32 and 0 <= t.min() and t.max() <= 1  # ToTensor scaling, no normalisation


def test_real_fashion_mnist_when_installed():
    root = Path("/usr/share/datasets/fashion-mnist")
    if not (root / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip("dataset-fashion-mnist is not installed here")
    ds = load_dataset(from_dict({"dataset": "fmnist", "model": "simple_cnn"}))
    assert ds.train.x.shape == (60000, 1, 28, 28) and ds.test.x.shape == (10000, 1, 28, 28)
    assert np.bincount(ds.train.y).tolist() == [6000] * 10


def test_missing_fmnist_says_how_to_get_it(tmp_path):
    cfg = from_dict({"dataset": "fmnist", "data_root": str(tmp_path / "none"), "model": "simple_cnn"})
    with pytest.raises(DatasetMissing, match=r"apt-get install dataset-fashion-mnist.*download=true"):
        check_available(cfg)
    with pytest.raises(DatasetMissing, match="data_root"):
        load_dataset(cfg)


def test_truncated_idx_file_is_a_clear_error(tmp_path):
    mnist_like(tmp_path, FMNIST_NAMES)
    f = tmp_path / "train-images-idx3-ubyte"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(ValueError, match="truncated"):
        load_dataset(from_dict({"dataset": "fmnist", "data_root": str(tmp_path), "model": "simple_cnn"}))


def test_torchvision_mnist_from_files(tmp_path):
    names = {
        "train_x": "MNIST/raw/train-images-idx3-ubyte",
        "train_y": "MNIST/raw/train-labels-idx1-ubyte",
        "test_x": "MNIST/raw/t10k-images-idx3-ubyte",
        "test_y": "MNIST/raw/t10k-labels-idx1-ubyte",
    }
    xs, ys = mnist_like(tmp_path, names)
    ds = load_dataset(from_dict({"dataset": "mnist", "data_root": str(tmp_path), "model": "simple_cnn"}))
    np.testing.assert_array_equal(ds.train.x[:, 0], xs["train"])
    np.testing.assert_array_equal(ds.train.y, ys["train"])


def test_torchvision_emnist_from_files_is_flipped_upright(tmp_path):
    pre = "EMNIST/raw/emnist-letters"
    names = {
        "train_x": f"{pre}-train-images-idx3-ubyte",
        "train_y": f"{pre}-train-labels-idx1-ubyte",
        "test_x": f"{pre}-test-images-idx3-ubyte",
        "test_y": f"{pre}-test-labels-idx1-ubyte",
    }
    xs, ys = mnist_like(tmp_path, names, classes=27)
    cfg = from_dict(
        {"dataset": "emnist", "emnist_split": "letters", "data_root": str(tmp_path), "model": "simple_cnn"}
    )
    assert dataset_info(cfg).num_classes == 27
    ds = load_dataset(cfg)
    np.testing.assert_array_equal(ds.train.x[:, 0], xs["train"].transpose(0, 2, 1))
    assert ds.spec.num_classes == 27


@pytest.fixture
def no_md5(monkeypatch):
    """torchvision checks the official files' MD5 sums; the files we make cannot match them."""
    import torchvision.datasets.cifar as cifar
    import torchvision.datasets.svhn as svhn

    monkeypatch.setattr(cifar, "check_integrity", lambda *a, **k: True)
    monkeypatch.setattr(cifar.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(svhn.SVHN, "_check_integrity", lambda self: True)


def _pickle(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj))


def test_torchvision_cifar10_from_files(tmp_path, no_md5):
    folder = tmp_path / "cifar-10-batches-py"
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batches[name] = G.integers(0, 256, (4, 3072)).astype(np.uint8)
        _pickle(folder / name, {"data": batches[name], "labels": [0, 1, 2, 3]})
    _pickle(folder / "batches.meta", {"label_names": [str(i) for i in range(10)]})
    ds = load_dataset(from_dict({"dataset": "cifar10", "data_root": str(tmp_path), "model": "simple_cnn"}))
    assert ds.train.x.shape == (20, 3, 32, 32) and ds.test.x.shape == (4, 3, 32, 32)
    # CHW order kept
    np.testing.assert_array_equal(ds.train.x[0], batches["data_batch_1"][0].reshape(3, 32, 32))
    assert ds.spec.augment == "crop_flip"


def test_torchvision_cifar100_from_files(tmp_path, no_md5):
    folder = tmp_path / "cifar-100-python"
    for name in ("train", "test"):
        _pickle(
            folder / name,
            {"data": G.integers(0, 256, (5, 3072)).astype(np.uint8), "fine_labels": [0, 1, 50, 98, 99]},
        )
    _pickle(folder / "meta", {"fine_label_names": [str(i) for i in range(100)]})
    ds = load_dataset(from_dict({"dataset": "cifar100", "data_root": str(tmp_path), "model": "simple_cnn"}))
    assert ds.spec.num_classes == 100 and ds.train.y.tolist() == [0, 1, 50, 98, 99]
    t = ds.spec.to_tensor(ds.train.x)
    assert t.min() < 0  # normalised with the CIFAR-100 mean/std
    # Training batches: crop, flip and a random rotation (docs/algorithms/common.md#data-transforms); evaluation batches: none of it.
    assert ds.spec.augment == "crop_flip_rotate"
    a = ds.spec.to_tensor(ds.train.x, augment=True, generator=torch.Generator().manual_seed(1))
    assert a.shape == (5, 3, 32, 32) and not torch.equal(a, t)


def test_torchvision_svhn_from_files(tmp_path, no_md5):
    import scipy.io

    for split in ("train", "test"):
        x = G.integers(0, 256, (32, 32, 3, 6)).astype(np.uint8)
        scipy.io.savemat(
            tmp_path / f"{split}_32x32.mat", {"X": x, "y": np.array([[1], [2], [10], [4], [5], [10]])}
        )
    ds = load_dataset(from_dict({"dataset": "svhn", "data_root": str(tmp_path), "model": "simple_cnn"}))
    # label 10 means digit 0
    assert ds.train.x.shape == (6, 3, 32, 32) and ds.train.y.tolist() == [
        1,
        2,
        0,
        4,
        5,
        0,
    ]


def test_missing_torchvision_dataset_suggests_download(tmp_path):
    cfg = from_dict({"dataset": "cifar10", "data_root": str(tmp_path), "model": "simple_cnn"})
    with pytest.raises(DatasetMissing, match=r"cifar10: not found.*download=true"):
        check_available(cfg)
    with pytest.raises(DatasetMissing, match=r"download=true"):
        load_dataset(cfg)


def test_digits_is_fixed_and_stratified():
    a = load_dataset(from_dict({}))
    b = load_dataset(from_dict({"seed": 5}))
    assert a.train.x.shape == (1257, 1, 8, 8) and len(a.test) == 540
    np.testing.assert_array_equal(a.test.y, b.test.y)  # the test set does not move with the run seed
    assert np.bincount(a.test.y).min() >= 50


def test_client_test_split_and_partition_are_seeded(tmp_path):
    base = {"dataset": "synthetic", "num_clients": 5, "client_test_fraction": 0.1}
    a, b = build_federated_data(from_dict(base)), build_federated_data(from_dict(base))
    c = build_federated_data(from_dict({**base, "seed": 1}))
    assert all(np.array_equal(a.clients[i].train, b.clients[i].train) for i in range(5))
    assert not all(np.array_equal(a.clients[i].train, c.clients[i].train) for i in range(5))
    for ix in a.clients.values():
        assert len(ix.test) == round(0.1 * (len(ix.train) + len(ix.test)))
        assert not set(ix.train) & set(ix.test)


def test_data_seed_draws_the_data_apart_from_the_training_seed(tmp_path):
    base = {"dataset": "synthetic", "num_clients": 5, "client_test_fraction": 0.1}

    def clients(**over):
        data = build_federated_data(from_dict({**base, **over}))
        return [(ix.train.tolist(), ix.test.tolist()) for ix in data.clients.values()]

    # left out, the run's seed draws the partition and the splits, as before the key existed (the
    # run id too: every results folder keeps its runs)
    assert clients(seed=3) == clients(seed=3, data_seed=3) != clients(seed=0)
    assert from_dict({**base, "seed": 3}).run_id() != from_dict({**base, "seed": 3, "data_seed": 3}).run_id()
    # set, it alone draws them: seeds then vary training only, and data seeds the data
    assert clients(seed=0, data_seed=7) == clients(seed=5, data_seed=7) != clients(seed=0, data_seed=8)
    # FedProx's synthetic clients are data too
    fp = {"dataset": "fedprox_synthetic", "num_clients": 4, "model": "logreg"}
    a = build_federated_data(from_dict({**fp, "seed": 1, "data_seed": 2})).clients.source
    b = build_federated_data(from_dict({**fp, "seed": 4, "data_seed": 2})).clients.source
    c = build_federated_data(from_dict({**fp, "seed": 1})).clients.source
    assert np.array_equal(a.samples(3).x, b.samples(3).x) and not np.array_equal(
        a.samples(3).x, c.samples(3).x
    )


def test_crop_flip_is_seeded_and_each_sample_is_a_crop_of_its_padded_image():
    x = torch.arange(4 * 3 * 32 * 32, dtype=torch.float32).reshape(4, 3, 32, 32)
    a = crop_flip(x, torch.Generator().manual_seed(0))
    assert a.shape == x.shape and torch.equal(a, crop_flip(x, torch.Generator().manual_seed(0)))
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4), mode="reflect")
    for i in range(4):
        candidates = [padded[i, :, oy : oy + 32, ox : ox + 32] for oy in range(9) for ox in range(9)]
        assert any(torch.equal(a[i], c) or torch.equal(a[i], c.flip(-1)) for c in candidates)
    outs = [crop_flip(x, torch.Generator().manual_seed(s)) for s in range(5)]
    assert any(not torch.equal(o, outs[0]) for o in outs[1:])


def test_rotation_keeps_the_centre_and_zero_angle_is_identity():
    from fedray.data.datasets import rotate

    x = torch.rand(8, 3, 32, 32)
    assert torch.equal(rotate(x, torch.Generator().manual_seed(0), max_degrees=0.0), x)
    r = rotate(x, torch.Generator().manual_seed(0), max_degrees=15.0)
    assert r.shape == x.shape and torch.equal(
        r, rotate(x, torch.Generator().manual_seed(0), max_degrees=15.0)
    )
    # a small rotation leaves the centre pixels
    assert torch.equal(r[:, :, 15:17, 15:17], x[:, :, 15:17, 15:17])
    assert not torch.equal(r, x)


# ------------------------------------------------------------------------------------------------
# The registry: one record per dataset
# ------------------------------------------------------------------------------------------------


def test_every_dataset_is_one_record_with_the_keys_only_it_reads():
    from fedray.config.keys import ConfigError
    from fedray.data import DATASETS

    keys = {name: kind.keys for name, kind in DATASETS.items() if kind.keys}
    assert keys == {
        "synthetic": ("synthetic_size", "synthetic_shape"),
        "emnist": ("emnist_split",),
        "fedprox_synthetic": ("synthetic_alpha", "synthetic_beta"),
    }
    # the datasets with settings of their own (data.NAME), and the flat keys that moved there
    settings = {
        n: [f.name for f in dataclasses.fields(k.settings)] for n, k in DATASETS.items() if k.settings
    }
    leaf = ["sample_fraction", "min_samples", "train_fraction", "split_seed"]
    columns = ["client_column", "input_column", "label_column"]
    hf = ["name", "split", "test_split", *columns, "sample_fraction", "min_samples"]
    assert settings == {"femnist": leaf, "shakespeare": leaf, "hf": hf}
    assert DATASETS["hf"].flat_keys == (
        "leaf_sample_fraction",
        "leaf_min_samples",
        "hf_name",
        "hf_split",
        "hf_test_split",
        "hf_client_column",
        "hf_input_column",
        "hf_label_column",
    )
    # the data sets that are read, not drawn, fix their data seed; the rest draw from the run's seed
    assert {n: kind.data_seed for n, kind in DATASETS.items() if kind.data_seed is not None} == {
        "client_files": 0,
        "femnist": 0,
        "shakespeare": 0,
        "hf": 0,
    }
    assert set(DATASETS) == {
        "client_files",
        "digits",
        "synthetic",
        "fmnist",
        "mnist",
        "emnist",
        "cifar10",
        "cifar100",
        "svhn",
        "arrays",
        "fedprox_synthetic",
        "femnist",
        "shakespeare",
        "hf",
    }
    assert sorted(n for n, kind in DATASETS.items() if kind.own_clients) == [
        "client_files",
        "fedprox_synthetic",
        "femnist",
        "hf",
        "shakespeare",
    ]
    assert sorted(n for n, kind in DATASETS.items() if kind.available is None) == [
        "digits",
        "fedprox_synthetic",
        "synthetic",
    ]
    # Their own keys' checks, as before the registry.
    with pytest.raises(
        ConfigError, match=r"'emnist_split': unknown value 'letter'; did you mean 'letters'\?"
    ):
        from_dict({"dataset": "emnist", "emnist_split": "letter", "model": "simple_cnn", "download": True})
    with pytest.raises(ConfigError, match=r"'synthetic_shape': must be \[D\] or \[C, H, W\]"):
        from_dict({"dataset": "synthetic", "synthetic_shape": [1, 8]})
    assert dataset_info(from_dict({"dataset": "synthetic", "synthetic_shape": [3, 4, 4]})).input_shape == (
        3,
        4,
        4,
    )


def test_a_plugged_in_dataset_is_chosen_checked_and_loaded(tmp_path):
    from fedray.config.keys import ConfigError
    from fedray.data import (
        DATASETS,
        ArrayDataset,
        Dataset,
        DatasetInfo,
        DatasetKind,
        DataSpec,
        register_dataset,
    )

    def load(cfg):
        x = np.arange(200 * 4, dtype=np.float32).reshape(200, 4) / 800
        y = np.arange(200) % 2
        return Dataset(
            "pairs", ArrayDataset(x[:150], y[:150]), ArrayDataset(x[150:], y[150:]), DataSpec((4,), 2, 1.0)
        )

    def check(cfg):
        if cfg.synthetic_size < 100:
            raise ConfigError("config key 'synthetic_size': pairs takes at least 100")

    register_dataset(
        DatasetKind(
            "pairs", load, lambda cfg: DatasetInfo((4,), 2, 150), keys=("synthetic_size",), check=check
        )
    )
    try:
        with pytest.raises(ValueError, match="registered already"):
            register_dataset(DatasetKind("pairs", load, lambda cfg: DatasetInfo((4,), 2, 150)))
        cfg = from_dict({"dataset": "pairs", "num_clients": 3, "partition": "iid", "output": str(tmp_path)})
        check_available(cfg)  # nothing to look for
        data = build_federated_data(cfg)
        assert sum(len(c.train) for c in data.clients.values()) == 150
        with pytest.raises(ConfigError, match="pairs takes at least 100"):
            from_dict({"dataset": "pairs", "synthetic_size": 50})
        with pytest.raises(
            ConfigError,
            match=r"'synthetic_shape' is not read by dataset 'pairs' \(it is read by: synthetic\)",
        ):
            from_dict({"dataset": "pairs", "synthetic_shape": [1, 4, 4]})
    finally:
        DATASETS.pop("pairs", None)
