"""Config errors name the key, suggest a fix, and happen before Ray starts."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import yaml

from fedray.config import Config, ConfigError, parse_sets
from fedray.validation import from_dict, load_config
from tests.conftest import ROOT
from tests.helpers import CHECK_NO_RAY


def test_embedded_default_is_valid_and_every_field_is_commented():
    cfg = load_config(None)
    assert cfg == Config()
    src = (ROOT / "fedray" / "config.py").read_text()
    for name in Config.__dataclass_fields__:
        line = next(ln for ln in src.splitlines() if ln.strip().startswith(f"{name}:"))
        assert "#" in line, f"config key {name} has no comment"


def test_yaml_then_sets_then_overrides(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump({"num_clients": 20, "lr": 0.1, "hp": {"server_lr": 0.5}}))
    cfg = load_config(
        f, ["num_clients=40", "partition=labels", "partition_k=3", "hp.server_lr=0.25"], output="elsewhere"
    )
    assert (cfg.num_clients, cfg.lr, cfg.partition, cfg.partition_k) == (40, 0.1, "labels", 3)
    assert cfg.hp == {"server_lr": 0.25} and cfg.output == "elsewhere"


def test_names_and_paths_are_taken_as_typed_in_set_and_only():
    # --only partition_name=#C=2 once parsed as a YAML comment (null) and matched no run
    assert parse_sets(["partition_name=#C=2", "experiment=2024", "output=out/#1", "partition_name2=#x"]) == {
        "partition_name": "#C=2", "experiment": "2024", "output": "out/#1", "partition_name2": None}
    assert parse_sets(["partition_name='#C=2'", 'data_root="a b"']) == {"partition_name": "#C=2", "data_root": "a b"}


def test_parse_sets_nests_and_parses_yaml_scalars():
    assert parse_sets(["a=1", "b=0.5", "c=true", "hp.mu=1e-3", "s=abc", "l=[1, 2]"]) == {
        "a": 1, "b": 0.5, "c": True, "hp": {"mu": "1e-3"}, "s": "abc", "l": [1, 2],
    }  # fmt: skip
    # ... and float keys take scientific notation, from --set and from YAML files alike.
    assert load_config(None, ["lr=1e-3", "weight_decay=5E-4", "hp.server_lr=2.5e-1"]).lr == 1e-3
    assert from_dict({"weight_decay": "5E-4", "hp": {"server_lr": "2.5e-1"}}).hp == {"server_lr": 0.25}
    with pytest.raises(ConfigError, match="key=value"):
        parse_sets(["novalue"])


@pytest.mark.parametrize(
    "raw,pattern",
    [
        ({"partiton": "iid"}, r"unknown config key 'partiton'; did you mean 'partition'\?"),
        ({"num_client": 4}, r"did you mean 'num_clients'"),
        (
            {"partition": "dirichlett"},
            r"'partition': unknown value 'dirichlett'; did you mean 'dirichlet'\?.*allowed: .*iid",
        ),
        ({"dataset": "fmnst"}, r"'dataset'.*did you mean 'fmnist'"),
        ({"algorithm": "fedavgg"}, r"'algorithm'.*did you mean 'fedavg'"),
        ({"model": "cnn"}, r"'model': unknown value 'cnn'"),
        ({"model_init": "seed+k"}, r"'model_init': unknown value 'seed\+k'.*seed_plus_k"),
        ({"lr": "fast"}, r"'lr': expected a number, got 'fast'"),
        ({"lr": -1}, r"'lr': must be > 0"),
        ({"num_clients": 2.5}, r"'num_clients': expected an integer"),
        ({"participation": 1.5}, r"'participation': must be in \(0, 1\]"),
        ({"download": "yes"}, r"'download': expected true or false"),
        ({"partition": "labels", "partition_k": 11}, r"'partition_k': #C=k needs 1 <= k <= 10"),
        ({"num_gpus_per_actor": 1.5}, r"'num_gpus_per_actor'.*whole number"),
        ({"num_clients": 5000}, r"'num_clients': 5000 clients but digits has only 1257"),
        ({"model": "simple_cnn"}, r"'model': simple_cnn cannot take digits inputs.*16x16"),
        ({"hp": {"mu": 0.1}}, r"unknown config key 'hp.mu' for algorithm fedavg.*server_lr"),
        ({"hp": {"server_lr": "x"}}, r"'hp.server_lr': expected a number"),
        ({"hp": {"server_lr": 0}}, r"'hp.server_lr': must be > 0"),
        ({"grid": {"seed": [0, 1]}}, r"fedray sweep"),
    ],
)
def test_bad_keys_and_values_name_the_key(raw, pattern):
    with pytest.raises(ConfigError, match=pattern):
        from_dict(raw)


def test_bad_yaml_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="bad.yaml.*not valid YAML"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(lst)


def test_hp_keeps_what_differs_from_the_defaults_so_writing_a_default_out_names_the_same_run():
    a = from_dict({"algorithm": "fedconcat", "rounds": 231, "hp": {"num_clusters": 5, "classifier_steps": 3}})
    b = from_dict({"algorithm": "fedconcat", "rounds": 231})
    assert a.hp == {} and a.run_id() == b.run_id()
    c = from_dict({"algorithm": "fedconcat", "rounds": 231, "hp": {"num_clusters": 4, "classifier_steps": 3}})
    assert c.hp == {"num_clusters": 4} and c.run_id() != b.run_id()


def test_run_id_is_stable_and_ignores_output_and_actor_count():
    a = from_dict({"seed": 1, "output": "x"})
    b = from_dict({"seed": 1, "output": "y", "num_actors": 3, "placement_timeout_s": 5})
    c = from_dict({"seed": 2})
    assert a.run_id() == b.run_id() != c.run_id()
    # What can change a number changes the id: threads per actor, devices, evaluation batches.
    for key, value in (("num_cpus_per_actor", 2.0), ("num_gpus_per_actor", 0.5), ("eval_batch_size", 64)):
        assert from_dict({"seed": 1, key: value}).run_id() != a.run_id(), key


@pytest.mark.parametrize(
    "args,message",
    [
        (["run", "--set", "partiton=iid"], "did you mean 'partition'"),
        (["run", "--set", "lr=0"], "'lr': must be > 0"),
        (
            [
                "run",
                "--set",
                "dataset=fmnist",
                "--set",
                "data_root=/nonexistent",
                "--set",
                "model=simple_cnn",
            ],
            "apt-get install dataset-fashion-mnist",
        ),
        (
            [
                "run",
                "--set",
                "dataset=cifar10",
                "--set",
                "data_root=/nonexistent",
                "--set",
                "model=simple_cnn",
            ],
            "download=true",
        ),
        (["run", "no_such_config.yaml"], "does not exist"),
    ],
)
def test_cli_rejects_bad_input_fast_without_starting_ray(args, message, tmp_path):
    # "Fast" is structural (Ray is never imported, nothing is written), not a timed assertion.
    p = subprocess.run(
        [sys.executable, "-c", CHECK_NO_RAY, *args], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2, p.stderr
    assert message in p.stderr
    assert not (tmp_path / "out").exists()  # nothing written


@pytest.mark.parametrize("path", sorted((ROOT / "jobs" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_validates(path, tmp_path):
    # Every config a user is pointed to resolves (keys, values, hp, cross-key checks) without data
    # (download=true: the files need not be on this machine; client_files: a folder of as many
    # clients as the config says, made here, stands in for the one a harness writes).
    from fedray.data import client_files
    from fedray.sweep import load_sweep

    raw = yaml.safe_load(path.read_text())
    sets = ["download=true"]
    if raw.get("dataset") == "client_files":
        one = {"x_train": np.zeros((2, 28, 28), np.uint8), "y_train": np.array([0, 1])}
        meta = {"num_classes": 10, "input_shape": [1, 28, 28]}
        test = {**one, "x_test": one["x_train"], "y_test": one["y_train"]}
        client_files.write(tmp_path / "clients", [one] * raw["num_clients"], meta, [test] * 3)
        sets.append(f"data_root={tmp_path / 'clients'}")
    if "grid" in raw:
        assert len(load_sweep(path, sets=sets).runs) >= 1
    else:
        load_config(path, sets=sets)
