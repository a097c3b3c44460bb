"""The config's sections: the data layer reads a `DataSection`, an algorithm's check a `RunPlan`,
each named as the config keys, and a hook that reaches for a key outside its section is told which
key and which section, rather than reading the rest of the config."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import fedray
from fedray.config.keys import FIELDS, ConfigError
from fedray.config.sections import DataSection
from fedray.experiment.checks import from_dict
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


def _in_sections(flat: dict) -> dict:
    """``flat``'s keys, each in its section (a sweep file's own keys left at the top)."""
    from fedray.config.keys import ROLES

    out: dict = {}
    for k, v in flat.items():
        if k in ROLES:
            out.setdefault(ROLES[k].section, {})[k] = v
        else:
            out[k] = v
    return out


SHIPPED = sorted(p.name for p in (Path(__file__).parents[2] / "jobs" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_and_sweep_written_in_sections_is_the_one_written_flat(name):
    import warnings

    import yaml

    from fedray.experiment.checks import load_config
    from fedray.sweeps.sweep_file import load_sweep
    from fedray.sweeps.tuning import split_block
    from tests.conftest import ROOT

    path = ROOT / "jobs" / "configs" / name
    flat, _ = split_block(yaml.safe_load(path.read_text()))  # a search's block apart: its keys are flat
    sectioned = _in_sections(flat)
    if any(k in flat for k in ("grid", "seeds", "cases")):
        load = lambda raw: [(r.label, r.config) for r in load_sweep(path, raw=raw).runs]  # noqa: E731
    else:
        load = lambda raw: load_config(path, raw=raw)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            want = load(flat)
        except Exception as e:  # a data set this machine lacks: the same error either way
            with pytest.raises(type(e)) as same:
                load(sectioned)
            assert str(same.value) == str(e)
            return
        got = load(sectioned)
    assert got == want


def test_the_shipped_default_in_sections_keeps_its_run_id_and_set_names_a_key_with_its_section():
    from fedray.experiment.checks import load_config
    from tests.conftest import ROOT

    path = ROOT / "jobs" / "configs" / "digits.yaml"
    cfg = load_config(path)
    assert (cfg.experiment, cfg.algorithm, cfg.partition_beta, cfg.lr) == ("digits", "fedavg", 0.5, 0.05)
    assert load_config(path, sets=["training.lr=0.1"]).lr == load_config(path, sets=["lr=0.1"]).lr == 0.1
    with pytest.raises(ConfigError, match=r"config key 'run.lr': lr is in section 'training', not 'run'"):
        load_config(path, sets=["run.lr=0.1"])


def test_a_key_in_the_wrong_section_given_twice_or_unknown_is_refused_naming_each(tmp_path):
    from fedray.experiment.checks import load_config

    path = tmp_path / "c.yaml"
    path.write_text("run:\n  lr: 0.1\n  algoritm: fedavg\ntraining:\n  rounds: 3\nrounds: 4\nclients: 10\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    said = str(e.value)
    assert "config key 'run.lr': lr is in section 'training', not 'run'" in said
    assert "unknown config key 'algoritm'; did you mean 'algorithm'?" in said  # with the flat key's hints
    assert "config key 'rounds' is given twice: at the top and in section 'training'" in said
    assert f"config file {str(path)!r}: section 'clients' must be a mapping of its keys, got 10" in said
    # an empty section is no section
    path.write_text("run:\ntraining:\n  rounds: 3\n")
    assert load_config(path).rounds == 3


def test_a_sweep_and_a_search_may_name_keys_with_their_sections(tmp_path):
    from fedray.sweeps.sweep_file import load_sweep
    from fedray.sweeps.tuning import read_spec

    flat = tmp_path / "flat.yaml"
    flat.write_text(
        "rounds: 2\nnum_clients: 4\ngrid:\n  lr: [0.1, 0.2]\n  hp.mu: [0.01]\nalgorithm: fedprox\nseeds: [0, 1]\n"
    )
    sectioned = tmp_path / "sectioned.yaml"
    sectioned.write_text(
        "training: {rounds: 2}\nclients: {num_clients: 4}\nrun: {algorithm: fedprox}\n"
        "grid:\n  training.lr: [0.1, 0.2]\n  run.hp.mu: [0.01]\nseeds: [0, 1]\n"
    )
    a, b = load_sweep(flat), load_sweep(sectioned)
    assert [r.config.run_id() for r in a.runs] == [r.config.run_id() for r in b.runs]
    assert [r.label for r in a.runs] == [r.label for r in b.runs]  # labelled by the keys' own names
    assert [r.config.lr for r in load_sweep(sectioned, sets=["training.lr=0.3"]).runs] == [0.3, 0.3]
    spec = read_spec({"search": {"training.lr": {"loguniform": [0.01, 0.1]}}}, ["fedavg"])
    assert list(spec.search) == ["lr"]


def test_a_key_written_with_its_section_is_the_key_everywhere_a_config_is_made(tmp_path):
    from fedray.api import prepare
    from fedray.experiment.checks import load_config
    from fedray.sweeps.sweep_file import SweepError, load_sweep
    from fedray.sweeps.tuning import read_spec

    # a name is taken as typed with its section too
    assert load_config(sets=["run.experiment=007"]).experiment == "007"
    from fedray.config.keys import parse_sets

    assert parse_sets(["clients.partition_name=#C=2"]) == {"clients": {"partition_name": "#C=2"}}
    # the API: a sectioned mapping with flat keyword overrides and --sets, and the other way round
    out = str(tmp_path / "out")
    cfg = prepare({"training": {"lr": 0.05, "rounds": 3}}, sets=["lr=0.1"], rounds=5, output=out)
    assert (cfg.lr, cfg.rounds) == (0.1, 5)
    assert prepare({"lr": 0.05}, sets=["training.lr=0.2"], output=out).lr == 0.2
    assert load_config(training={"rounds": 4}).rounds == 4  # an override named like a section
    # every problem at once, with the hints a flat key gets
    with pytest.raises(ConfigError) as e:
        load_config(raw={"training": {"learning_rate": 0.1}, "run": {"lr": 1}, "clients": 10, "rounds": 0})
    said = str(e.value)
    assert "unknown config key 'learning_rate'; did you mean 'lr'?" in said
    assert "config key 'run.lr': lr is in section 'training', not 'run'" in said
    assert "section 'clients' must be a mapping of its keys, got 10; did you mean 'num_clients'?" in said
    assert "config key 'rounds': must be >= 1, got 0" in said
    # a sweep: --set with a section blames --set; a misplaced axis is one of the file's errors; a
    # run.hp axis is hp's values; one key given twice is refused
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        "lr: 0.1\nrounds: 2\nnum_clients: 4\nalgorithm: fedprox\ngrid:\n  run.hp: [{mu: 0.1}, {mu: 0.2}]\n"
    )
    assert [r.config.hp for r in load_sweep(sweep).runs] == [{"mu": 0.1}, {"mu": 0.2}]
    with pytest.raises(ConfigError, match=r"config key 'lr': must be > 0, got -1\.0 \(set by --set lr=-1\)"):
        load_sweep(sweep, sets=["training.lr=-1"])
    with pytest.raises(ConfigError, match="--set: key 'lr' is given twice"):
        load_sweep(sweep, sets=["lr=0.2", "training.lr=0.3"])
    sweep.write_text("rounds: 2\ngrid:\n  training.dataset: [digits]\n  seedz: 1\n")
    with pytest.raises(SweepError) as e:
        load_sweep(sweep)
    assert "grid.training.dataset[0]: config key 'training.dataset': dataset is in section 'source'" in str(
        e.value
    )
    assert "grid.seedz: expected a non-empty list of values, got 1" in str(e.value)
    # a search: one key twice
    with pytest.raises(ConfigError, match=r"tune.search.training.lr: lr is searched twice"):
        read_spec(
            {"search": {"lr": {"loguniform": [0.01, 0.1]}, "training.lr": {"choice": [0.5]}}}, ["fedavg"]
        )


def test_the_apis_plugins_go_after_the_mappings_own_wherever_it_wrote_them(tmp_path):
    from fedray.api import prepare

    for name in ("a_plug.py", "b_plug.py"):
        (tmp_path / name).write_text("VALUE = 1\n")
    a, b = str(tmp_path / "a_plug.py"), str(tmp_path / "b_plug.py")
    out = str(tmp_path / "out")
    flat = prepare({"plugins": [a]}, plugins=[b], output=out)
    sectioned = prepare({"run": {"plugins": [a]}}, plugins=[b], output=out)
    assert flat.plugins == sectioned.plugins == [a, b]
