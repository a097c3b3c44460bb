"""The config's sections: the data layer reads a `DataSection`, an algorithm's check a `RunPlan`,
each named as the config keys, and a hook that reaches for a key outside its section is told which
key and which section, rather than reading the rest of the config."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import fedray
from fedray.config.keys import FIELDS
from fedray.config.sections import DataSection
from fedray.experiment.validation import from_dict
from tests.conftest import small_config


def test_a_data_section_holds_the_configs_values_for_its_keys_and_names_a_key_it_does_not_hold():
    cfg = from_dict(
        {"dataset": "fmnist", "num_clients": 7, "partition": "labels", "partition_k": 3, "seed": 4}
    )
    section = cfg.data_section
    assert isinstance(section, DataSection)
    for f in dataclasses.fields(DataSection):
        assert f.name in FIELDS, f.name  # named as the config keys
        assert getattr(section, f.name) == getattr(cfg, f.name), f.name
    assert section.resolved_data_root() == cfg.resolved_data_root() == "/usr/share/datasets/fashion-mnist"
    with pytest.raises(AttributeError, match=r"'lr' is not in the data section"):
        getattr(section, "lr")  # noqa: B009
    with pytest.raises(AttributeError, match=r"'nope' is not in the data section"):
        getattr(section, "nope")  # noqa: B009
    with pytest.raises(dataclasses.FrozenInstanceError):
        section.num_clients = 3
    # a snapshot: the config changed after needs a new one
    cfg.num_clients = 5
    assert section.num_clients == 7 and cfg.data_section.num_clients == 5


def test_the_partition_file_a_section_reads_is_the_seeds():
    cfg = fedray.Config(partition="file", partition_file="parts/p{seed}.json", seed=3)
    assert cfg.data_section.resolved_partition_file() == cfg.resolved_partition_file() == "parts/p3.json"


def _pairs(seen: list[str]):
    def load(section):
        seen.append(type(section).__name__)
        x = np.arange(200 * 4, dtype=np.float32).reshape(200, 4) / 800
        y = np.arange(200) % 2
        return fedray.Dataset(
            "pairs",
            fedray.ArrayDataset(x[:150], y[:150]),
            fedray.ArrayDataset(x[150:], y[150:]),
            fedray.DataSpec((4,), 2, 1.0),
        )

    def info(section):
        seen.append(type(section).__name__)
        return fedray.DatasetInfo((4,), 2, 150)

    return load, info


def test_a_datasets_hooks_read_the_data_section_in_a_run_and_one_reaching_past_it_is_told_which_key(
    tmp_path,
):
    from fedray.data import DATASETS

    seen: list[str] = []
    load, info = _pairs(seen)
    fedray.register_dataset(fedray.DatasetKind("pairs", load, info))
    try:
        result = fedray.run(
            small_config(tmp_path / "a", dataset="pairs", partition="iid", rounds=1), local=True
        )
        assert result.final_accuracy is not None
        assert seen and set(seen) == {"DataSection"}, seen

        def greedy(section):  # a hook that reads a training key
            return fedray.DatasetInfo((4,), 2, 150 if section.lr > 0 else 1)

        DATASETS["pairs"] = dataclasses.replace(DATASETS["pairs"], info=greedy)
        with pytest.raises(AttributeError, match=r"'lr' is not in the data section"):
            from_dict({"dataset": "pairs", "partition": "iid", "output": str(tmp_path / "b")})
    finally:
        DATASETS.pop("pairs", None)


def test_a_dataset_claims_as_its_own_only_a_flat_key_of_the_data_section_no_other_dataset_reads():
    from fedray.data import DATASETS

    load, info = _pairs([])
    for key in ("lr", "shift", "num_clients", "partition_k", "data_root", "nope"):
        with pytest.raises(ValueError, match=rf"dataset 'pairs': '{key}' is not a config key of its own"):
            fedray.register_dataset(fedray.DatasetKind("pairs", load, info, keys=(key,)))
    assert "pairs" not in DATASETS
    fedray.register_dataset(fedray.DatasetKind("pairs", load, info, keys=("synthetic_size",)))
    DATASETS.pop("pairs")


def test_a_section_is_a_copy_a_later_change_to_the_config_leaves_alone():
    cfg = from_dict({"dataset": "synthetic", "synthetic_shape": [1, 4, 4]})
    section = cfg.data_section
    cfg.synthetic_shape.append(2)
    cfg.data["x"] = 1
    assert section.synthetic_shape == [1, 4, 4] and section.data == {}


def test_the_public_data_functions_read_a_config_as_its_section():
    """A plug-in written before sections passes a Config: it has every key a section holds."""
    cfg = from_dict({"num_clients": 4, "partition": "iid"})
    a, b = fedray.load_dataset(cfg), fedray.load_dataset(cfg.data_section)
    assert np.array_equal(a.train.x, b.train.x) and a.spec == b.spec
    from fedray.data import build_federated_data

    one, two = build_federated_data(cfg), build_federated_data(cfg.data_section)
    assert {c: ix.train.tolist() for c, ix in one.clients.items()} == {
        c: ix.train.tolist() for c, ix in two.clients.items()
    }
