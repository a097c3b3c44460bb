"""Each config key declares its roles once, on its field (fedray/config/roles.py), and every list of
keys fedray reads is derived from them: a declaration that contradicts itself is refused when its
class is made, the derived lists say what the keys' comments say, and the files' columns that name
a run are the keys declared to label one."""

from __future__ import annotations

import dataclasses
import typing

import pyarrow as pa
import pytest

from fedray.config import keys
from fedray.config.roles import SECTIONS, key, roles_of
from fedray.config.run_ids import content_file, run_id
from fedray.config.sections import DataSection


def _declare(**fields):
    return dataclasses.make_dataclass("C", [(name, typing.Any, spec) for name, spec in fields.items()])


def test_a_declaration_that_contradicts_itself_or_lacks_its_roles_is_refused():
    assert list(
        roles_of(_declare(lr=key("training", 0.1), out=key("results", "", in_run_id=False, setting=False)))
    )
    with pytest.raises(TypeError, match="'out': a key not in the run id is no setting"):
        roles_of(_declare(out=key("results", "", in_run_id=False)))  # setting left True
    with pytest.raises(TypeError, match="'m': a key a stack shares is one a pack shares"):
        roles_of(_declare(m=key("training", 0.9, stack=True)))
    with pytest.raises(TypeError, match="'x': section 'model' is not one of run, source"):
        roles_of(_declare(x=key("model", 1)))
    with pytest.raises(TypeError, match="'y' is declared without its roles"):
        roles_of(_declare(y=dataclasses.field(default=1)))


def test_the_lists_fedray_reads_are_the_keys_roles():
    roles = keys.ROLES
    assert list(roles) == list(keys.FIELDS)  # every key declared, in the order of Config
    # the run id leaves out what cannot change a number, and keys added later at their old value
    assert set(keys.NOT_IN_RUN_ID) >= {
        "output",
        "num_actors",
        "loggers",
        "checkpoint_every",
        "partition_name",
    }
    assert not {"lr", "seed", "num_cpus_per_actor", "num_gpus_per_actor"} & set(keys.NOT_IN_RUN_ID)
    assert keys.ADDED_LATER["channels_last"] is False and keys.field_default("channels_last") is True
    assert "lr" not in keys.ADDED_LATER and keys.ADDED_LATER["data"] == {}
    # a report's cell: runs that differ only in a per-run key are seeds of one setting
    assert set(keys.PER_RUN_KEYS) == {
        "seed",
        *keys.NOT_IN_RUN_ID,
        "num_cpus_per_actor",
        "num_gpus_per_actor",
        "pack_runs",
    }
    assert set(keys.FIXED_IN_SEARCH) == {
        *("seed", "data_seed", "validation_fraction", "evaluate_on", "rounds"),
        *("output", "experiment", "plugins", "dataset", "data_root"),
    }
    assert set(keys.STACK_KEYS) <= set(keys.PACK_KEYS)
    assert set(keys.DATASET_KEYS) <= set(keys.PACK_KEYS)  # another dataset option is another data set
    assert set(keys.REGISTERED) == {"algorithm", "model", "dataset", "partition"}
    assert set(keys.ON_OFF_KEYS) == {"batched_clients", "pack_runs"}
    assert set(keys.NAME_KEYS) == {
        "experiment",
        "output",
        "data_root",
        "partition_file",
        "partition_name",
        "init_model",
    }


def test_each_key_is_in_one_section_and_the_data_layers_view_holds_the_dataset_and_clients_keys():
    sections = keys.SECTION_KEYS
    assert list(sections) == list(SECTIONS)
    everywhere = [k for held in sections.values() for k in held]
    assert sorted(everywhere) == sorted(keys.FIELDS)  # each key in exactly one section
    data_view = {f.name for f in dataclasses.fields(DataSection)}
    assert set(sections["source"]) | set(sections["clients"]) <= data_view


def test_the_results_columns_that_name_a_run_are_the_keys_declared_to_label_one():
    from fedray.storage.results import METRICS_SCHEMA, RUN_COLUMNS

    arrow = {str: pa.string(), int: pa.int64()}
    labels = [c for c in RUN_COLUMNS if c != "source"]
    assert set(labels) == set(keys.LABEL_KEYS)
    for name in labels:  # each column of its key's type
        assert METRICS_SCHEMA.field(name).type == arrow[keys.field_type(name)], name


def test_run_ids_have_one_versioned_rule_and_a_file_key_is_its_content(tmp_path):
    cfg = keys.Config()
    assert cfg.run_id() == run_id(cfg, version=1)
    with pytest.raises(ValueError, match="run id version 2: fedray knows version 1"):
        run_id(cfg, version=2)
    part = tmp_path / "p-{seed}.json"
    conf = {
        "seed": 3,
        "dataset": "digits",
        "partition_file": str(part),
        "data_root": "d",
        "init_model": str(tmp_path),
    }
    assert content_file(conf, "partition_file") == tmp_path / "p-3.json"
    assert content_file(conf, "init_model") == tmp_path / "global.npz"  # a models folder: its global model
    assert content_file(conf, "data_root") is None  # a folder of a dataset, named by its path
    assert content_file({**conf, "dataset": "arrays"}, "data_root").name == "d"
    assert content_file({**conf, "init_model": ""}, "init_model") is None


# A key added the way docs/architecture.md says: one declaration in Config, nothing else.
NEW_KEY = '    demo_scale: float = key("training", 1.0, rule=bound(gt=0), as_before=1.0, pack=True)\n'
ONE_DECLARATION = """
import importlib.util, json, pathlib, sys, warnings
source = pathlib.Path("fedray/config/keys.py").read_text()
anchor = "    lr: float = key("
source = source.replace(anchor, NEW_KEY + anchor, 1)
import fedray.config  # its leaves, and the package, first; then the keys as the new source has them
spec = importlib.util.spec_from_loader("fedray.config.keys", loader=None, origin="fedray/config/keys.py")
module = importlib.util.module_from_spec(spec)
module.__file__ = "fedray/config/keys.py"
sys.modules["fedray.config.keys"] = module
exec(compile(source, "fedray/config/keys.py", "exec"), module.__dict__)
fedray.config.keys, fedray.config.Config = module, module.Config
warnings.simplefilter("ignore")
from fedray.config import keys
from fedray.experiment.checks import load_config
from fedray.sweeps.pack import pack_key
from fedray.sweeps.sweep_file import load_sweep
kept = json.loads(pathlib.Path("tests/config/run_ids_f4b49b0.json").read_text())
same = [load_config("jobs/configs/digits.yaml").run_id()] == kept["digits.yaml"]
same_sweep = sorted(r.run_id for r in load_sweep("jobs/configs/digits_sweep.yaml").runs) == kept["digits_sweep.yaml"]
base = load_config("jobs/configs/digits.yaml")
set_ = load_config("jobs/configs/digits.yaml", sets=["training.demo_scale=2"])
print(json.dumps({
    "kept": same and same_sweep,
    "added_later": keys.ADDED_LATER.get("demo_scale"),
    "section": "demo_scale" in keys.SECTION_KEYS["training"],
    "pack": "demo_scale" in keys.PACK_KEYS,
    "set": set_.demo_scale,
    "new_id": set_.run_id() != base.run_id(),
    "new_pack": pack_key(set_) != pack_key(base),
}))
"""


def test_a_new_key_is_one_declaration_and_every_run_keeps_its_id():
    """Add a key by its one declaration (in a fresh interpreter): every list that must know it does,
    runs that leave it at its old value keep their ids, and it loads, flat or in its section."""
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = f"NEW_KEY = {NEW_KEY!r}\n" + ONE_DECLARATION
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {
        "kept": True,
        "added_later": 1.0,
        "section": True,
        "pack": True,
        "set": 2.0,
        "new_id": True,
        "new_pack": True,
    }
