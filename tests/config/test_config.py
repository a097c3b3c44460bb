"""Config errors name the key, suggest a fix, and happen before Ray starts."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from fedray.config.keys import Config, ConfigError, parse_sets
from fedray.experiment.checks import from_dict, load_config
from fedray.experiment.local import task_for
from tests.conftest import ROOT
from tests.helpers import clis_without_ray


def test_embedded_default_is_valid_and_every_field_is_commented():
    cfg = load_config(None)
    assert cfg == Config()
    from jobs.docs import _source_meanings  # a key's comment: the lines right above it, or its own

    meanings = _source_meanings(Config)
    for name in Config.__dataclass_fields__:
        assert meanings.get(name), f"config key {name} has no comment"


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
        "partition_name": "#C=2",
        "experiment": "2024",
        "output": "out/#1",
        "partition_name2": None,
    }
    assert parse_sets(["partition_name='#C=2'", 'data_root="a b"']) == {
        "partition_name": "#C=2",
        "data_root": "a b",
    }


def test_parse_sets_nests_and_parses_yaml_scalars():
    assert parse_sets(["a=1", "b=0.5", "c=true", "hp.mu=1e-3", "s=abc", "l=[1, 2]"]) == {
        "a": 1,
        "b": 0.5,
        "c": True,
        "hp": {"mu": "1e-3"},
        "s": "abc",
        "l": [1, 2],
    }
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
        # a part of names: those that contain it (difflib finds none close)
        (
            {"model": "cnn"},
            r"'cnn'; did you mean one of 'fedrc_cnn', 'leaf_cnn', 'mcmahan_cnn', 'simple_cnn'\? \(allowed",
        ),
        ({"model": "mobilenet"}, r"'mobilenet'; did you mean 'mobilenet_v2'\?"),
        # no close name: perhaps a plug-in's, which the config does not import
        (
            {"algorithm": "myalg"},
            r"'algorithm': unknown value 'myalg' \(allowed: .*\); an algorithm of your own comes from a plug-in: .*plugins:",
        ),
        ({"model": "cnn"}, r"'model': unknown value 'cnn'"),
        ({"model_init": "seed+k"}, r"'model_init': unknown value 'seed\+k'.*seed_plus_k"),
        ({"lr": "fast"}, r"'lr': expected a number, got 'fast'"),
        ({"lr": -1}, r"'lr': must be > 0"),
        # YAML's .inf and .nan are numbers, never a setting; integers go to numpy and torch as int64
        ({"lr": float("inf")}, r"'lr': expected a finite number, got inf"),
        ({"weight_decay": float("nan")}, r"'weight_decay': expected a finite number, got nan"),
        ({"num_cpus_per_actor": float("inf")}, r"'num_cpus_per_actor': expected a finite number"),
        ({"hp": {"server_lr": float("inf")}}, r"'hp.server_lr': expected a finite number"),
        # the key as it is typed: hp.server_lr, not server_lr
        (
            {"hp": {"serverlr": 0.5}},
            r"unknown config key 'hp.serverlr' for algorithm fedavg; did you mean 'hp.server_lr'\?",
        ),
        ({"seed": 10**29}, r"'seed': 100000000000000000000000000000 is beyond a 64-bit integer"),
        # it names the report's plot files: --set experiment=../../x once wrote outside the results
        ({"experiment": "../../x"}, r"'experiment': a name, not a path .*'\.\./\.\./x'"),
        ({"experiment": ".hidden"}, r"'experiment': a name, not a path"),
        # 300 characters: accepted, then `fedray report` failed on its plot's file name (Errno 36)
        (
            {"experiment": "x" * 300},
            r"'experiment': at most 100 characters \(it names files under the results folder\), got 300",
        ),
        ({"num_clients": 2.5}, r"'num_clients': expected an integer"),
        ({"participation": 1.5}, r"'participation': must be in \(0, 1\]"),
        ({"download": "yes"}, r"'download': expected true or false"),
        ({"partition": "labels", "partition_k": 11}, r"'partition_k': #C=k needs 1 <= k <= 10"),
        ({"num_gpus_per_actor": 1.5}, r"'num_gpus_per_actor'.*whole number"),
        ({"num_gpus_per_actor": "atuo"}, r"'num_gpus_per_actor': must be >= 0 or auto, got atuo"),
        ({"num_gpus_per_actor": -1}, r"'num_gpus_per_actor': must be >= 0 or auto, got -1"),
        ({"num_clients": 5000}, r"'num_clients': 5000 clients but digits has only 1257"),
        ({"model": "simple_cnn"}, r"'model': simple_cnn cannot take digits inputs.*16x16"),
        ({"hp": {"mu": 0.1}}, r"unknown config key 'hp.mu' for algorithm fedavg.*server_lr"),
        ({"hp": {"server_lr": "x"}}, r"'hp.server_lr': expected a number"),
        ({"hp": {"server_lr": 0}}, r"'hp.server_lr': must be > 0"),
        ({"grid": {"seed": [0, 1]}}, r"fedray sweep"),
        # a sweep file's own keys, mistyped: told as such
        ({"grdi": {"lr": [0.1]}}, r"unknown config key 'grdi'; did you mean 'grid'\?"),
        (
            {"seed": [0, 1]},
            r"'seed': expected an integer, got \[0, 1\]; several seeds are a sweep's key seeds",
        ),
    ],
)
def test_bad_keys_and_values_name_the_key(raw, pattern):
    with pytest.raises(ConfigError, match=pattern):
        from_dict(raw)


def test_every_mistake_of_a_config_is_told_at_once_each_naming_its_key():
    # A config with four mistakes is mended in one go: every unknown key and wrong type, then every
    # unknown name and value out of bounds, each on a line of its own. One mistake reads as before.
    with pytest.raises(ConfigError) as e:
        from_dict({"lrr": 0.1, "rounds": "abc", "seed": 1.5, "batch_size": 32})
    assert e.value.problems == [
        "unknown config key 'lrr'; did you mean 'lr'?",
        "config key 'rounds': expected an integer, got 'abc'",
        "config key 'seed': expected an integer, got 1.5",
    ]
    assert str(e.value).splitlines()[0] == "3 problems in the config:"
    assert str(e.value).splitlines()[1:] == [f"  - {p}" for p in e.value.problems]
    with pytest.raises(ConfigError) as e:
        from_dict({"algorithm": "fedavgg", "local_epochs": -1, "batch_size": 0})
    assert [p.split(":")[0] for p in e.value.problems] == [
        "config key 'algorithm'",
        "config key 'local_epochs'",
        "config key 'batch_size'",
    ]
    assert "did you mean 'fedavg'?" in e.value.problems[0]
    with pytest.raises(ConfigError) as e:  # an algorithm's hp: unknown keys, types and bounds together
        from_dict({"algorithm": "fedprox", "hp": {"muu": 3, "mu": -1, "server_lr": "x"}})
    assert [p.split(":")[0] for p in e.value.problems] == [
        "unknown config key 'hp.muu' for algorithm fedprox; did you mean 'hp.mu'? (its hp keys",
        "config key 'hp.server_lr'",
        "config key 'hp.mu'",
    ]
    with pytest.raises(ConfigError) as e:  # both kinds in one message: none waits for the next try
        from_dict({"partiton": "labels", "lr": "x", "model": "cnn", "rounds": -1})
    assert [p.split(":")[0].split(";")[0] for p in e.value.problems] == [
        "unknown config key 'partiton'",
        "config key 'lr'",
        "config key 'model'",
        "config key 'rounds'",
    ]
    with pytest.raises(ConfigError) as e:  # the hp's mistakes with the rest's, whichever kind they are
        from_dict({"lr": "x", "rounds": 0, "algorithm": "fedprox", "hp": {"muu": 3, "mu": -1}})
    assert [p.split(":")[0].split(";")[0] for p in e.value.problems] == [
        "config key 'lr'",
        "config key 'rounds'",
        "unknown config key 'hp.muu' for algorithm fedprox",
        "config key 'hp.mu'",
    ]
    with pytest.raises(ConfigError) as e:
        from_dict({"local_epochs": 0})
    assert str(e.value) == "config key 'local_epochs': must be >= 1, got 0" and e.value.problems == [
        str(e.value)
    ]


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


def test_a_key_given_twice_is_refused_naming_it_and_its_lines(tmp_path):
    # Before: YAML kept the last of the two without a word.
    path = tmp_path / "twice.yaml"
    path.write_text("rounds: 3\nlr: 0.1\nhp:\n  mu: 0.1\n  mu: 0.01\n")
    with pytest.raises(
        ConfigError, match=r"twice.yaml'?: refused: key 'mu' is given twice \(lines 4 and 5\)"
    ):
        load_config(path)
    path.write_text(
        "base: &b {lr: 0.1}\nother:\n  <<: *b\n  lr: 0.2\n"
    )  # an override of a merged key is YAML's own
    assert yaml.safe_load(path.read_text())["other"]["lr"] == 0.2
    from fedray.config.keys import read_yaml

    assert read_yaml(path)["other"] == {"lr": 0.2}


def test_an_empty_logger_name_is_refused_not_read_as_no_logger(capsys):
    # Before: `--logger ''` set loggers: [] and the run went on with none, without a word.
    from jobs.cli import main

    with pytest.raises(SystemExit) as e:
        main(["run", "--local", "--logger", " "])
    assert e.value.code == 2 and "--logger: a logger's name" in capsys.readouterr().err
    from jobs.cli_args import config_sets

    assert config_sets(type("A", (), {"sets": [], "loggers": ["tensorboard", "a, b"]})) == [
        'loggers=["tensorboard", "a, b"]'  # a name is never split or read as YAML
    ]


def test_an_experiment_name_with_a_newline_or_an_escape_is_refused():
    for name in ("two\nlines", "ansi\x1b[31mred", "tab\tbed"):
        with pytest.raises(ConfigError, match=r"config key 'experiment': a printable name"):
            from_dict({"experiment": name})
    assert from_dict({"experiment": "table 1 (Dir 0.5) — é"}).experiment == "table 1 (Dir 0.5) — é"


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


BAD_INPUT = [
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
    (["run", "--local", "--set", "experiment=a\x1b[2Jb"], "config key 'experiment': a printable name"),
    (
        ["run", "--local", "--set", "mlflow_tracking_uri=ftp://x"],
        "config key 'mlflow_tracking_uri': a tracking store",
    ),
    (["run", "."], "config file '.' is a folder, not a file"),
    (["run", "--local", "--output", "/etc/passwd"], "'output': '/etc/passwd' is a file, not a folder"),
    (["report", "/etc/passwd"], "results folder '/etc/passwd' is a file, not a folder"),
    (  # refused before the data is looked for (the case above says the data is not there)
        [
            "run",
            "--set",
            "dataset=fmnist",
            "--set",
            "data_root=/nonexistent",
            "--set",
            "model=simple_cnn",
            "--set",
            "partition_k=3",
        ],
        "config key 'partition_k' is not read by partition 'dirichlet' (it is read by: labels)",
    ),
]


@pytest.fixture(scope="module")
def rejected(tmp_path_factory):
    """Every BAD_INPUT command line's (exit code, stderr), all in one process that must never
    import Ray, and the folder they ran in."""
    cwd = tmp_path_factory.mktemp("bad-input")
    return clis_without_ray([args for args, _ in BAD_INPUT], cwd), cwd


@pytest.mark.parametrize("case", range(len(BAD_INPUT)), ids=[m for _, m in BAD_INPUT])
def test_cli_rejects_bad_input_fast_without_starting_ray(case, rejected):
    # "Fast" is structural (Ray is never imported, nothing is written), not a timed assertion.
    results, cwd = rejected
    rc, err = results[case]
    assert rc == 2, err
    assert BAD_INPUT[case][1] in err
    assert not (cwd / "out").exists()  # nothing written


@pytest.mark.parametrize("path", sorted((ROOT / "jobs" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_validates(path, tmp_path):
    # Every config a user is pointed to resolves (keys, values, hp, cross-key checks) without data
    # (download=true: the files need not be on this machine; client_files: a folder of as many
    # clients as the config says, made here, stands in for the one a harness writes).
    from fedray.data import client_files
    from fedray.sweeps.sweep_file import load_sweep

    raw = yaml.safe_load(path.read_text())
    sets = ["download=true"]
    if raw.get("dataset") == "client_files":
        one = {"x_train": np.zeros((2, 28, 28), np.uint8), "y_train": np.array([0, 1])}
        meta = {"num_classes": 10, "input_shape": [1, 28, 28]}
        held_out = np.full((2, 28, 28), 255, np.uint8)  # not a training sample (fedray refuses those)
        test = {**one, "x_test": held_out, "y_test": one["y_train"]}
        client_files.write(tmp_path / "clients", [one] * raw["num_clients"], meta, [test] * 3)
        sets.append(f"data_root={tmp_path / 'clients'}")
    if raw.get("dataset") in ("femnist", "shakespeare"):  # LEAF's JSON: a few users stand in
        from tests.data.test_leaf import write_leaf

        # as many users as a round takes (clients_per_round), each kept whole: LEAF's sampling and -k
        # are for LEAF's thousands of users; a Shakespeare role keeps a test sample from 800 up
        n = raw.get("clients_per_round", 3)
        size = 5 if raw["dataset"] == "femnist" else 810
        root = write_leaf(tmp_path / "leaf", {f"u{i}": size for i in range(n)}, kind=raw["dataset"])
        sets += [f"data_root={root}", "data.sample_fraction=null", "data.min_samples=0"]
    if "tune" in raw:  # a search (fedray tune): its block, its cells and the values its space reaches
        from fedray.sweeps.tune_plan import open_plan

        assert len(open_plan(path, sets, output=str(tmp_path / "out")).cells) >= 1
    elif any(key in raw for key in ("grid", "cases", "seeds")):  # a sweep file
        assert len(load_sweep(path, sets=sets).runs) >= 1
    else:
        load_config(path, sets=sets)


# ------------------------------------------------------------------------------------------------
# Keys the chosen partition (dataset) does not read
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw,message",
    [
        (
            {"partition_k": 11},
            "config key 'partition_k' is not read by partition 'dirichlet' (it is read by: labels)",
        ),
        (
            {"partition": "iid", "partition_beta": 0.1},
            "config key 'partition_beta' is not read by partition 'iid' "
            "(it is read by: dirichlet, quantity, dominant, clientwise_dirichlet)",
        ),
        (
            {"partition": "labels", "partition_min_size": 5},
            "'partition_min_size' is not read by partition 'labels' (it is read by: dirichlet, quantity)",
        ),
        (
            {"partition_name": "#C=2"},
            "config key 'partition_name' is not read by partition 'dirichlet' (it is read by: file)",
        ),
        ({"partition": "rotation", "partition_beta": 0.1}, "not read by partition 'rotation'"),
        (
            {"emnist_split": "letters"},
            "config key 'emnist_split' is not read by dataset 'digits' (it is read by: emnist)",
        ),
        (
            {"dataset": "fmnist", "synthetic_shape": [1, 4, 4]},
            "config key 'synthetic_shape' is not read by dataset 'fmnist' (it is read by: synthetic)",
        ),
    ],
)
def test_a_key_the_partition_or_dataset_does_not_read_is_refused_naming_it_and_its_readers(raw, message):
    with pytest.raises(ConfigError) as e:
        from_dict(raw)
    assert message in str(e.value)


def test_a_key_the_partition_does_not_read_is_refused_at_the_front_door_unless_at_its_default(tmp_path):
    # partition_k=11 with the default Dirichlet partition ran, under a new run id, the same numbers.
    with pytest.raises(ConfigError, match="'partition_k' is not read by partition 'dirichlet'"):
        load_config(None, ["partition_k=11"])
    f = tmp_path / "exp.yaml"
    f.write_text("partition: iid\npartition_beta: 0.1\n")
    with pytest.raises(ConfigError, match="'partition_beta' is not read by partition 'iid'"):
        load_config(f)
    # At its default an unread key changes neither a number nor the run id: a resolved config (every
    # key written out, as DIR/configs/RUN_ID.yaml and the reference harness's side files) loads.
    assert load_config(None, ["partition_k=2"]).run_id() == load_config(None).run_id()
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(yaml.safe_dump(load_config(None, ["partition=iid"]).to_dict()))
    assert load_config(resolved) == load_config(None, ["partition=iid"])
    cfg = load_config(None, ["partition=labels", "partition_k=3", "dataset=synthetic", "synthetic_size=600"])
    assert from_dict(cfg.to_dict()) == cfg and from_dict({"partition_k": 2}) == Config()
    with pytest.raises(ConfigError, match="'partition_k' is not read"):
        from_dict({**Config().to_dict(), "partition_k": 3})


def test_a_files_key_for_its_own_partition_gives_way_when_set_chooses_another(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("partition: dirichlet\npartition_beta: 0.1\n")
    cfg = load_config(f, ["partition=labels", "partition_k=3"])
    plain = load_config(None, ["partition=labels", "partition_k=3"])
    assert cfg.partition_beta == Config().partition_beta and cfg.run_id() == plain.run_id()
    # ... but a key the file's own partition does not read is the file's mistake, --set or not.
    f.write_text("partition: labels\npartition_beta: 0.1\n")
    with pytest.raises(ConfigError, match="'partition_beta' is not read by partition 'iid'"):
        load_config(f, ["partition=iid"])
    # The same for datasets: the file's synthetic keys give way to --set dataset=digits.
    f.write_text("dataset: synthetic\nsynthetic_size: 600\n")
    assert load_config(f, ["dataset=digits"]).run_id() == load_config(None).run_id()


def test_client_files_read_no_partition_key(tmp_path):
    with pytest.raises(
        ConfigError,
        match="'partition_beta' is not read by dataset 'client_files' \\(its files are the clients",
    ):
        from_dict({"dataset": "client_files", "data_root": str(tmp_path), "partition_beta": 0.1})


def test_the_unread_key_error_comes_before_any_data_is_read(tmp_path, monkeypatch, capsys):
    import fedray.data
    from jobs.cli import main

    def no_data(*args, **kwargs):
        raise AssertionError("data was read")

    for name in (
        "check_available",
        "check_partition",
        "load_dataset",
        "train_labels",
        "build_federated_data",
    ):
        monkeypatch.setattr(fedray.data, name, no_data)
    assert main(["run", "--local", "--set", "partition_k=3", "--output", str(tmp_path / "out")]) == 2
    assert "config key 'partition_k' is not read by partition 'dirichlet'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------
# Misnamed keys
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw,hint",
    [
        ({"learning_rate": 0.1}, "unknown config key 'learning_rate'; did you mean 'lr'?"),
        ({"epochs": 2}, "did you mean 'local_epochs'?"),
        ({"Num-Clients": 4}, "did you mean 'num_clients'?"),
        ({"mu": 0.1}, "unknown config key 'mu'; did you mean 'hp.mu' (a hyperparameter of fedprox, moon)?"),
        ({"algorithm": "moon", "mu": 0.1}, "did you mean 'hp.mu' (a hyperparameter of moon, fedprox)?"),
        ({"alpha": 0.5}, "did you mean 'hp.alpha' (a hyperparameter of fedrs) or 'partition_beta'?"),
        ({"hp.mu": 0.1}, "hyperparameters nest under hp: write hp: {mu: ...}"),
        ({"partiton": "iid"}, "did you mean 'partition'?"),  # a close spelling, as before
        ({"colour": 1}, "unknown config key 'colour'"),
    ],
)
def test_misnamed_keys_get_a_hint(raw, hint):
    with pytest.raises(ConfigError) as e:
        from_dict(raw)
    assert hint in str(e.value)
    if "did you mean" not in hint:
        assert "did you mean" not in str(e.value)


def test_every_hyperparameter_written_bare_points_to_hp():
    import dataclasses

    from fedray.algorithms import ALGORITHMS
    from fedray.config.keys import FIELDS, MISNAMED

    both = set()
    for name, alg in ALGORITHMS.items():
        for f in dataclasses.fields(alg.Hparams):
            if f.name in FIELDS:  # a config key of every algorithm too (drop_last: either drops)
                both.add(f.name)
                continue
            with pytest.raises(ConfigError) as e:
                from_dict({"algorithm": name, f.name: f.default})
            assert f"did you mean 'hp.{f.name}' (a hyperparameter of {name}" in str(e.value)
    assert both == {"drop_last"}
    assert all(k not in FIELDS and v in FIELDS for k, v in MISNAMED.items())


# ------------------------------------------------------------------------------------------------
# The client's Task
# ------------------------------------------------------------------------------------------------


def test_task_from_config_carries_every_field_from_the_key_of_its_name():
    import dataclasses

    from fedray.data import DataSpec
    from fedray.engine.client import Task

    # init_params: test_init_model.py; run_id: the run's, not a key (whose its clients' state files are)
    names = [f.name for f in dataclasses.fields(Task) if f.name not in ("spec", "init_params", "run_id")]
    defaults = Config()
    changed = {
        "seed": 7,
        "model": "simple_cnn",
        "local_epochs": 3,
        "batch_size": 17,
        "lr": 0.3,
        "momentum": 0.5,
        "weight_decay": 0.01,
        "participation": 0.5,
        "eval_batch_size": 99,
        "channels_last": False,
        "eval_train": False,
        "cuda_deterministic": False,
        "cuda_tf32": False,
        "head_bias": False,
        "model_init": "seed_plus_k",
        "weight_init": "torch",
        "batched_clients": "on",
        "client_state_memory_mb": 64.0,
        "drop_last": True,
    }
    assert sorted(changed) == sorted(names)  # a new Task field: give it a value here
    assert all(changed[n] != getattr(defaults, n) for n in names)
    spec = DataSpec((1, 28, 28), 10, 1 / 255)
    task = task_for(dataclasses.replace(defaults, **changed), spec)
    assert task.spec is spec and all(getattr(task, n) == changed[n] for n in names)
    assert task.run_id == dataclasses.replace(defaults, **changed).run_id()
