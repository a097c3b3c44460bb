"""Plug-ins: a module outside fedray registers an algorithm and a model; it runs in-process and on
Ray with the same numbers, from any working directory; a plug-in's bad hyperparameter, a plug-in
that does not import in the actors and a changed plug-in are each handled as the built-ins' errors
are; an installed package registers itself through its entry point."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from fedray.config import plugins
from fedray.config.keys import ConfigError
from tests.conftest import ROOT, small_config

EXAMPLE = ROOT / "examples" / "plugin"


@pytest.fixture
def isolated(monkeypatch):
    """The registries, the loaded plug-ins and sys.modules as they were before the test: a plug-in
    loaded here leaves nothing behind for the rest of the suite."""
    from fedray.algorithms import ALGORITHMS
    from fedray.data import DATASETS, PARTITIONS
    from fedray.models import MODELS

    saved = [(d, dict(d)) for d in (ALGORITHMS, MODELS, DATASETS, PARTITIONS, plugins._LOADED)]
    before, path = dict(plugins._LOADED), list(sys.path)
    yield
    loaded = set(plugins._LOADED.values()) - set(before.values())
    loaded |= set(plugins._ENTRY_MODULES)
    for d, copy in saved:
        d.clear()
        d.update(copy)
    for name in [m for m in sys.modules if m.split(".")[0] in loaded]:  # the plug-ins' modules only
        del sys.modules[name]
    sys.path[:] = path


def metrics(out):
    from analysis import load_metrics

    m = load_metrics(out)
    m = m[~m["metric"].str.contains("seconds|bytes")]
    return m.set_index(["round", "metric", "scope", "entity"])["value"].sort_index()


@pytest.mark.ray
def test_the_example_plugin_runs_from_any_directory_in_process_and_on_ray_with_the_same_numbers(
    tmp_path, monkeypatch, isolated, ray_session
):
    from jobs.cli import main

    monkeypatch.chdir(tmp_path)  # the config names fedavgm.py relative to itself, not to here
    cfg = str(EXAMPLE / "config.yaml")
    assert main(["run", cfg, "--local", "--set", "rounds=3", "--output", "local"]) == 0
    assert main(["run", cfg, "--set", "rounds=3", "--set", "num_actors=2", "--output", "ray"]) == 0
    local, ray_ = metrics(tmp_path / "local"), metrics(tmp_path / "ray")
    assert len(local) > 20 and local.equals(ray_)  # bit for bit, velocity_norm included
    assert (local.xs("velocity_norm", level="metric") > 0).all()
    from analysis import load_runs

    run = load_runs(tmp_path / "ray").iloc[0]
    assert run["status"] == "finished" and run["summary"]["placement"]["actors"] == 2
    # the recorded config names it, pinned to the source it ran
    assert run["config"]["plugins"] == [plugins.pinned(str(EXAMPLE / "fedavgm.py"))]


def test_fedavgm_with_no_momentum_is_fedavg_exactly(tmp_path, isolated):
    """The plug-in's reduces-to test: beta 0, server_lr 1 is FedAvg, value for value."""
    from tests.conftest import small_config
    from tests.helpers import run_metrics

    fedavgm = run_metrics(
        small_config(
            tmp_path / "m",
            algorithm="fedavgm",
            plugins=[str(EXAMPLE / "fedavgm.py")],
            hp={"beta": 0.0, "server_lr": 1.0},
        )
    )
    fedavg = run_metrics(small_config(tmp_path / "a"))
    keep = ["accuracy", "loss", "train_accuracy", "sgd_loss"]
    a, b = (df[df["metric"].isin(keep)].reset_index(drop=True) for df in (fedavgm, fedavg))
    assert len(a) and a.equals(b), a.compare(b)
    moved = run_metrics(
        small_config(tmp_path / "b", algorithm="fedavgm", plugins=[str(EXAMPLE / "fedavgm.py")])
    )
    assert not moved[moved["metric"].isin(keep)].reset_index(drop=True).equals(b)  # momentum changes it


def test_a_plugins_bad_hyperparameter_is_refused_before_anything_runs_with_the_builtins_message(
    tmp_path, isolated
):
    from fedray.experiment.checks import load_config

    # without the plug-in, no such algorithm
    with pytest.raises(ConfigError, match=r"unknown value 'fedavgm'"):
        load_config(None, ["algorithm=fedavgm"])
    with pytest.raises(ConfigError, match=r"^config key 'hp.beta': must be in \[0, 1\), got 1.5$"):
        load_config(EXAMPLE / "config.yaml", ["hp.beta=1.5"], output=str(tmp_path))
    with pytest.raises(
        ConfigError,
        match=r"unknown config key 'hp.mu' for algorithm fedavgm \(its hp keys: beta, server_lr\)",
    ):
        load_config(EXAMPLE / "config.yaml", ["hp.mu=0.1"], output=str(tmp_path))
    with pytest.raises(ConfigError, match=r"plugin 'nope.py': no such file"):
        load_config(None, [], plugins=["nope.py"])
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_a_changed_plugin_is_another_run_and_never_resumes_or_skips_the_old_one(tmp_path, isolated):
    from analysis import load_runs
    from fedray.experiment.checks import load_config
    from tests.helpers import run

    mine = tmp_path / "mine"
    shutil.copytree(EXAMPLE, mine)
    cmd = [
        sys.executable,
        "-m",
        "jobs.cli",
        "run",
        str(mine / "config.yaml"),
        "--local",
        "--set",
        "rounds=1",
        "--output",
        str(tmp_path / "out"),
    ]
    assert run(cmd, ROOT).returncode == 0
    first = load_runs(tmp_path / "out")["run_id"].tolist()
    # unchanged: that run (skipped)
    assert load_config(mine / "config.yaml", ["rounds=1"]).run_id() == first[0]
    source = mine / "fedavgm.py"
    source.write_text(
        source.read_text().replace("w[k] - hp.server_lr * v[k]", "w[k] - 0.5 * hp.server_lr * v[k]")
    )
    # This process imported the old code, which is what would run here: refused, not mislabelled.
    with pytest.raises(ConfigError, match="changed since this process imported it"):
        load_config(mine / "config.yaml", ["rounds=1"])
    assert run(cmd, ROOT).returncode == 0  # a new process: a new run, not the old one skipped or resumed
    runs = load_runs(tmp_path / "out")
    assert len(runs) == 2 and set(first) < set(runs["run_id"]) and (runs["status"] == "finished").all()
    # The report never reads the two versions as two seeds of one setting: a column each, by hash.
    from analysis import pivot, run_values

    cells = pivot(run_values(tmp_path / "out"), rows=("partition",), cols=("algorithm",))
    assert len(cells) == 2 and (cells["n"] == 1).all(), cells
    assert all("fedavgm.py@" in c for c in cells["col"]), cells["col"].tolist()
    # The first run's saved config names the source it ran: read now, it refuses the changed one.
    saved = tmp_path / "out" / "configs" / f"{first[0]}.yaml"
    assert f"fedavgm.py#sha256={plugins.digest(str(EXAMPLE / 'fedavgm.py'))}" in saved.read_text()
    with pytest.raises(
        ConfigError, match=r"plugin '.*fedavgm.py' is not the source this config was recorded with"
    ):
        load_config(saved)
    copy = tmp_path / "copy"  # the same source elsewhere is the same plug-in: its hash, not its path
    shutil.copytree(EXAMPLE, copy)
    assert plugins.digest(str(copy / "fedavgm.py")) == plugins.digest(str(EXAMPLE / "fedavgm.py"))


FAILS_IN_ACTORS = """
import sys
import fedray
from fedray.algorithms.baselines import fedavg

if "default_worker" in " ".join(sys.argv):  # a Ray worker: the package is on the driver's machine only
    import secret_dependency_of_the_lab  # noqa: F401
fedray.register_algorithm("fedavg_copy", fedavg)
"""


@pytest.mark.ray
def test_a_plugin_that_does_not_import_in_the_workers_fails_the_run_before_a_round_naming_it(
    tmp_path, isolated, ray_session
):
    from analysis import load_runs
    from fedray.api import run
    from fedray.config.plugins import PluginError

    plugin = tmp_path / "labplug.py"
    plugin.write_text(FAILS_IN_ACTORS)
    with pytest.raises((PluginError, ConfigError)) as e:
        # one client actor: each one more costs the suite its start-up and checks nothing more
        run(
            algorithm="fedavg_copy",
            plugins=[str(plugin)],
            rounds=2,
            num_actors=1,
            output=str(tmp_path / "out"),
        )
    text = str(e.value)
    assert "labplug.py" in text and "failed to import in" in text and "node" in text, text
    assert "ModuleNotFoundError" in text and "secret_dependency_of_the_lab" in text, text
    assert not (tmp_path / "out" / "metrics").exists()  # it failed before any round: no metric row
    runs = load_runs(tmp_path / "out")
    assert list(runs["status"]) == ["failed"] and "secret_dependency_of_the_lab" in runs["summary"].iloc[
        0
    ].get("error", "") + str(runs.iloc[0].to_dict())


def test_the_coordinator_checks_its_plugins_against_what_the_driver_read(tmp_path, isolated):
    # Before: only the client actors compared their plug-ins' digests with the driver's; the
    # coordinator (which runs the algorithm's server side) imported whatever it found. Its code is
    # run in this process here (an actor of it starts a worker: seconds of imports).
    from actors.coordinator import CoordinatorCode
    from actors.launch import ActorGroup

    plugin = tmp_path / "labplug_server.py"
    plugin.write_text("import fedray\n")
    group = ActorGroup(None, {}, [], 1.0, plugins={str(plugin): "0" * 64})
    with pytest.raises(plugins.PluginError) as e:
        list(CoordinatorCode().run({"plugins": [str(plugin)]}, group))
    assert "labplug_server.py' in the coordinator on node" in str(e.value), str(e.value)
    assert "is not the one the driver read (sha256" in str(e.value) and "000000000000 there" in str(e.value)


def test_a_packs_worker_checks_its_plugins_against_what_the_driver_read(tmp_path, isolated):
    # A pack's worker (`fedray.sweeps.pack`) runs its runs' algorithms and clients: it checks its plug-ins as
    # the coordinator and the client actors do (before, it imported whatever it found).
    from actors.coordinator import PackWorkerCode

    plugin = tmp_path / "labplug_pack.py"
    plugin.write_text("import fedray\n")
    with pytest.raises(plugins.PluginError) as e:
        list(PackWorkerCode().run([{"plugins": [str(plugin)]}], [False], plugins={str(plugin): "0" * 64}))
    assert "labplug_pack.py' in a pack's worker on node" in str(e.value), str(e.value)
    assert "is not the one the driver read (sha256" in str(e.value) and "000000000000 there" in str(e.value)


def test_a_packages_digest_covers_its_data_files_too(tmp_path):
    # Before: only its .py files, so a changed YAML or JSON it reads was the same run.
    pkg = tmp_path / "labpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import fedray\n")
    (pkg / "table.json").write_text('{"beta": 0.9}')
    before = plugins.digest(str(pkg))
    (pkg / "table.json").write_text('{"beta": 0.5}')
    after = plugins.digest(str(pkg))
    assert after != before
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"compiled")  # a cache is not the source
    assert plugins.digest(str(pkg)) == after


def test_an_installed_package_registers_through_its_entry_point(tmp_path, isolated, monkeypatch):
    from fedray.experiment.checks import from_dict

    site = tmp_path / "site"
    (site / "labmodels").mkdir(parents=True)
    (site / "labmodels" / "__init__.py").write_text(
        "import fedray\nfrom fedray.models import mlp\nfedray.register_model('lab_mlp')(lambda s, c: mlp(s, c, hidden=32))\n"
    )
    dist = site / "labmodels-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: labmodels\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[fedray.plugins]\nlabmodels = labmodels\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(plugins, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(plugins, "_ENTRY_MODULES", [])
    cfg = from_dict({"model": "lab_mlp", "rounds": 1, "plugins": []})
    assert cfg.plugins == ["labmodels"]  # named in the resolved config, so in the run id by its source
    first = cfg.run_id()
    assert first != from_dict({"rounds": 1}).run_id()
    (site / "labmodels" / "__init__.py").write_text(
        (site / "labmodels" / "__init__.py").read_text() + "# v2\n"
    )
    assert from_dict({"model": "lab_mlp", "rounds": 1}).run_id() != first  # a new version: another run


def test_a_registration_made_in_main_is_refused_with_what_to_do(isolated, monkeypatch):
    """A model registered in a notebook cell has no file: no hash for the run id, nothing for Ray's
    workers to import. The error says to put it in a file and name it as a plug-in."""
    import types

    import fedray
    from fedray.experiment.checks import from_dict
    from fedray.models import mlp

    main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)

    def cell_model(shape, classes):
        return mlp(shape, classes)

    cell_model.__module__ = "__main__"
    fedray.register_model("cell_model")(cell_model)
    with pytest.raises(
        ConfigError, match=r"module '__main__' registered, which has no source file.*plugins:"
    ):
        from_dict({"model": "cell_model"})


def test_a_plugin_name_that_shadows_another_module_is_refused(tmp_path, isolated):
    from fedray.experiment.checks import from_dict

    shadow = tmp_path / "json.py"  # a module named json is imported already, from the standard library
    shadow.write_text("x = 1\n")
    with pytest.raises(ConfigError, match=r"a module named 'json' is imported already .* rename the plug-in"):
        from_dict({"plugins": [str(shadow)]})


def test_registering_a_name_twice_is_refused(isolated):
    import fedray
    from fedray.algorithms.baselines import fedavg

    with pytest.raises(ValueError, match="algorithm 'fedavg' is registered already"):
        fedray.register_algorithm("fedavg", fedavg)
    with pytest.raises(ValueError, match="does not define Hparams"):
        fedray.register_algorithm("broken", sys.modules[__name__])
    with pytest.raises(ValueError, match="model 'mlp' is registered already"):
        fedray.register_model("mlp")(lambda s, c: None)


def test_the_plugin_path_of_a_config_is_relative_to_the_config(tmp_path, isolated):
    from fedray.experiment.checks import load_config

    cfg = load_config(EXAMPLE / "config.yaml", ["rounds=1"])
    assert cfg.plugins == [str(EXAMPLE / "fedavgm.py")] and Path(cfg.plugins[0]).is_absolute()


SOURCED = '''
"""A plug-in data set of clients made on demand: each client's blobs drawn from (seed, client)."""
from dataclasses import dataclass

import numpy as np

import fedray


@dataclass(frozen=True)
class Blobs(fedray.ClientSource):
    seed: int
    num_clients: int

    def split(self, cid):
        return 20 + cid % 7, 5

    def samples(self, cid):
        g = np.random.default_rng([self.seed, cid])
        n = sum(self.split(cid))
        y = g.integers(0, 3, n)
        return fedray.ArrayDataset((g.normal(size=(n, 4)) + 2 * y[:, None]).astype(np.float32), y)


def federate(cfg):
    clients = fedray.SourcedClients(Blobs(cfg.seed, cfg.num_clients))
    test = [clients.source.samples(c) for c in range(3)]
    x, y = np.concatenate([t.x for t in test]), np.concatenate([t.y for t in test])
    empty = fedray.ArrayDataset(np.zeros((0, 4), np.float32), np.zeros(0, np.int64))
    spec = fedray.DataSpec((4,), 3, scale=1.0)
    return fedray.FederatedData(fedray.Dataset("blobs", empty, fedray.ArrayDataset(x, y), spec), clients, None)


fedray.register_dataset(fedray.DatasetKind(
    "blobs", lambda cfg: federate(cfg).dataset, lambda cfg: fedray.DatasetInfo((4,), 3, None), federate=federate))
'''


@pytest.mark.ray
def test_a_plugin_data_set_of_clients_made_on_demand_runs_on_ray_with_the_in_process_numbers(
    tmp_path, isolated, ray_session
):
    """The plug-in's ClientSource travels to the actors by reference (the plug-in is imported
    there first), every actor makes the clients it runs, and the numbers are the in-process ones."""
    from analysis import load_clients, load_runs
    from fedray.api import run

    plugin = tmp_path / "blobs_plug.py"
    plugin.write_text(SOURCED)
    cfg = dict(
        dataset="blobs",
        model="logreg",
        algorithm="scaffold",
        num_clients=12,
        participation=0.5,
        rounds=3,
        local_epochs=1,
        batch_size=8,
        lr=0.1,
        plugins=[str(plugin)],
    )
    run(cfg, local=True, output=str(tmp_path / "local"))
    run(cfg, output=str(tmp_path / "ray"), num_actors=2)
    local, ray_ = metrics(tmp_path / "local"), metrics(tmp_path / "ray")
    assert len(local) > 10 and local.equals(ray_)
    assert load_runs(tmp_path / "ray").iloc[0]["summary"]["placement"]["clients_per_actor"] == [6, 6]
    clients = load_clients(tmp_path / "ray")
    assert list(clients["num_train"]) == [20 + c % 7 for c in range(12)] and (clients["num_test"] == 5).all()
    assert not (tmp_path / "ray" / "partitions").exists()  # clients made on demand index no arrays


def test_label_smoothing_with_no_smoothing_is_fedavg_exactly(tmp_path, isolated):
    """examples/plugin/fedavg_ls.py's reduces-to test: eps = 0 is FedAvg, value for value, and
    eps > 0 moves the numbers."""
    from tests.conftest import small_config
    from tests.helpers import run_metrics

    plugin = [str(EXAMPLE / "fedavg_ls.py")]
    keep = ["accuracy", "loss", "train_accuracy", "sgd_loss"]
    fedavg = run_metrics(small_config(tmp_path / "a"))
    b = fedavg[fedavg["metric"].isin(keep)].reset_index(drop=True)
    for eps, same in ((0.0, True), (0.3, False)):
        ls = run_metrics(
            small_config(tmp_path / f"ls{eps}", algorithm="fedavg_ls", plugins=plugin, hp={"smoothing": eps})
        )
        a = ls[ls["metric"].isin(keep)].reset_index(drop=True)
        assert len(a) and a.equals(b) == same


def test_a_plug_in_objective_trains_batched_with_no_extra_code(tmp_path, isolated):
    """examples/plugin/fedavg_ls.py (label smoothing, its own loss term) runs stacked, to the
    per-client numbers."""
    from tests.engine.test_batched import _off_and_on_agree

    plugin = EXAMPLE / "fedavg_ls.py"
    over = dict(
        dataset="digits",
        model="mcmahan_cnn",
        num_clients=8,
        participation=0.5,
        rounds=3,
        local_epochs=2,
        lr=0.05,
        momentum=0.0,
        seed=3,
        algorithm="fedavg_ls",
        hp={"smoothing": 0.2},
        plugins=[str(plugin)],
    )
    _off_and_on_agree(tmp_path, over)


WRONG_SHAPE = """
import numpy as np
import fedray
from fedray.algorithms.baselines import fedavg
from fedray.algorithms.baselines.fedavg import Hparams, State, evaluate, init, models  # noqa: F401


def round(state, fed, hp, rnd):
    state, records = fedavg.round(state, fed, hp, rnd)
    params = dict(state.params)
    name = sorted(k for k in params if k.endswith("bias"))[-1]
    params[name] = np.asarray(params[name])[:-1]  # an aggregate one entry short
    return State(params), records


fedray.register_algorithm("fedavg_short", __import__(__name__))
"""


def test_an_aggregate_of_the_wrong_shape_is_named_with_its_algorithm_parameter_and_shapes(tmp_path, isolated):
    from analysis import load_runs
    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import execute
    from fedray.storage.export import ModelShapeError
    from tests.conftest import small_config

    plugin = tmp_path / "short.py"
    plugin.write_text(WRONG_SHAPE)
    cfg = small_config(tmp_path, algorithm="fedavg_short", plugins=[str(plugin)])
    with pytest.raises(
        ModelShapeError,
        match=r"algorithm 'fedavg_short': its global model after round 1 has parameter '.*bias' "
        r"of shape \(\d+,\); the model's is \(\d+,\)",
    ):
        list(execute(cfg, make_local_federation))
    assert load_runs(cfg.output)["status"][0] == "failed"


NESTED_MODELS = """
import fedray
from fedray.algorithms.baselines.fedavg import Hparams, State, evaluate, init, round  # noqa: F401
from fedray.storage.export import global_model


def models(state, hp):
    return [global_model(state.params)]  # global_model already returns the list


fedray.register_algorithm("fedavg_nested", __import__(__name__))
"""


def test_models_that_are_not_saved_models_are_named_with_the_algorithm_after_round_1(tmp_path, isolated):
    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import execute
    from tests.conftest import small_config

    plugin = tmp_path / "nested.py"
    plugin.write_text(NESTED_MODELS)
    cfg = small_config(tmp_path, algorithm="fedavg_nested", plugins=[str(plugin)], rounds=5)
    with pytest.raises(
        TypeError,
        match=r"algorithm 'fedavg_nested': models\(state, hp\) must return a list of "
        r"fedray.storage.export.SavedModel; item 0 after round 1 is a list .*return it, not a list holding it",
    ):
        list(execute(cfg, make_local_federation))


def test_a_file_plugin_is_imported_by_its_path_and_what_lies_beside_it_shadows_nothing(tmp_path, isolated):
    # A plug-in's folder was put first on sys.path: a `colorsys.py` (or `ray.py`, `numpy.py`) beside
    # the plug-in file then stood in for the installed module everywhere in the process.
    import importlib.util

    from fedray.experiment.checks import load_config

    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "colorsys.py").write_text("raise RuntimeError('the planted colorsys ran')\n")
    shutil.copy(EXAMPLE / "fedavgm.py", lab / "fedavgm.py")
    sys.modules.pop("colorsys", None)
    cfg = load_config(None, ["algorithm=fedavgm", "rounds=1"], plugins=[str(lab / "fedavgm.py")])
    assert cfg.algorithm == "fedavgm" and sys.modules["fedavgm"].__file__ == str(lab / "fedavgm.py")
    assert str(lab) not in sys.path
    found = importlib.util.find_spec("colorsys")
    assert found is not None and Path(found.origin).parent != lab  # the standard library's
    import colorsys  # noqa: F401 - the real one imports

    shutil.rmtree(lab)


DROPOUT_MODEL = """
import math

from torch import nn

import fedray
from fedray.models import EncoderHead


@fedray.register_model("dropout_mlp")
def dropout_mlp(input_shape, num_classes):
    d = math.prod(input_shape)
    encoder = nn.Sequential(nn.Flatten(), nn.Linear(d, 64), nn.ReLU(), nn.Dropout(0.5))
    return EncoderHead(encoder, nn.Linear(64, num_classes), 64)
"""


@pytest.mark.ray
def test_a_model_with_dropout_gives_the_in_process_numbers_on_3_actors(tmp_path, isolated, ray_session):
    """Dropout's masks come from each client's own stream (fedray.engine.train.own_draws), not from what
    the process drew before: before, the numbers depended on which clients shared an actor (this
    test failed). FedEM: each client trains K components a round, each with its own masks."""
    from fedray.api import run

    plugin = tmp_path / "dropout_plug.py"
    plugin.write_text(DROPOUT_MODEL)
    cfg = dict(
        dataset="synthetic",
        synthetic_size=600,
        model="dropout_mlp",
        algorithm="fedem",
        num_clients=6,
        rounds=2,
        batch_size=32,
        plugins=[str(plugin)],
    )
    run(cfg, local=True, output=str(tmp_path / "local"), quiet=True)
    run(cfg, output=str(tmp_path / "ray"), num_actors=3, quiet=True)
    local, ray_ = metrics(tmp_path / "local"), metrics(tmp_path / "ray")
    assert len(local) > 10 and local.equals(ray_), local.compare(ray_)


# --- the stable surface a plug-in author writes with (docs/extending.md#what-is-stable) ------------


def _stable_names() -> set[str]:
    page = (ROOT / "docs" / "extending.md").read_text()
    section = page[page.index("## What is stable") :]
    section = section[: section.index("The example plug-ins")]
    return set(re.findall(r"`(\w+)`", section)) - {"NAME", "fedray"}


def test_every_name_docs_call_stable_is_fedrays_own_and_resolves():
    import fedray

    stable = _stable_names()
    assert {"train_reply", "single_model_records", "global_model", "Federation", "bound"} <= stable
    assert stable <= set(fedray.__all__), stable - set(fedray.__all__)
    for name in fedray.__all__:
        assert getattr(fedray, name) is not None, name


def test_the_example_plugins_import_only_fedray_itself():
    # what docs/extending.md's examples show is what a plug-in author may lean on: no internal module
    import ast

    for path in sorted((ROOT / "examples").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fedray":
                raise AssertionError(f"{path.relative_to(ROOT)}: from {node.module} import ...")
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name == "fedray" or not alias.name.startswith("fedray."), (path, alias.name)


def test_a_federation_says_how_many_clients_it_has(tmp_path):
    from fedray.data import build_federated_data
    from fedray.experiment.local import make_local_federation

    cfg = small_config(tmp_path, num_clients=7)
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    try:
        assert fed.num_clients == len(fed.client_ids) == 7
    finally:
        fed.close()


# --- a plug-in author's mistakes, named where they happen ---------------------------------------

PER_SAMPLE_LOSS = """
import torch
import fedray


def per_sample(model, batch, context):
    out = model(batch.x)
    each = torch.nn.functional.cross_entropy(out, batch.y, reduction="none")  # the slip: not reduced
    return fedray.Step(out, each.mean(), each)


def update(client, cstate, msg):
    trained = yield fedray.LocalUpdate(msg["params"], msg["round"], objective=per_sample)
    return fedray.train_reply(client, trained.params, trained.stats), cstate


from fedray.algorithms.baselines.fedavg import Hparams, State, evaluate, init, models  # noqa: E402,F401


def round(state, fed, hp, rnd):
    replies = fed.map(update, fed.sample(1.0, fed.task.rng("sample", rnd=rnd)), {"params": state.params, "round": rnd})
    return State(fedray.fedavg_aggregate(replies)), fedray.train_records(replies)


fedray.register_algorithm("per_sample", __import__(__name__))
"""


@pytest.mark.parametrize("engine", ["off", "on"])
def test_a_loss_that_is_not_a_scalar_is_named_in_one_line_on_either_engine(tmp_path, isolated, engine):
    # reduction="none", the most common slip: once 26 lines of fedray's and torch's frames ending in
    # "grad can be implicitly created only for scalar outputs" (functorch's vjp advice, stacked)
    from tests.helpers import FEDRAY, run

    plugin = tmp_path / "per_sample.py"
    plugin.write_text(PER_SAMPLE_LOSS)
    args = [*FEDRAY, "run", "--local", "--plugin", str(plugin), "--output", str(tmp_path / "out")]
    sets = ["algorithm=per_sample", "rounds=2", "num_clients=4", f"batched_clients={engine}"]
    p = run([*args, *(x for kv in sets for x in ("--set", kv))], cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    said = next(line for line in lines if "failed" in line)
    assert said.startswith("fedray: run per_sample-digits-") and "algorithm per_sample, client 0: " in said
    line = PER_SAMPLE_LOSS.splitlines().index("def per_sample(model, batch, context):") + 1
    assert f"objective per_sample.per_sample ({plugin}:{line}) returned Step.loss of shape (32,): " in said
    assert "must be scalars, one number for the batch" in said
    assert "Traceback" not in p.stderr and "grad can be implicitly created" not in p.stderr
    assert len(lines) == 2 and "--traceback prints it here" in lines[1]
    again = run([*args, "--traceback", *(x for kv in sets for x in ("--set", kv))], cwd=tmp_path)
    assert "Traceback (most recent call last)" in again.stderr and said in again.stderr


TENSOR_STATE = """
import torch
import fedray
from fedray.algorithms.baselines.fedavg import Hparams, State, evaluate, init, models  # noqa: F401


def keeps_tensors(client, cstate, msg):
    trained = yield fedray.LocalUpdate(msg["params"], msg["round"])
    kept = {"last": {k: torch.from_numpy(v) for k, v in trained.params.items()}}  # the slip: tensors
    return fedray.train_reply(client, trained.params, trained.stats), kept


def round(state, fed, hp, rnd):
    replies = fed.map(keeps_tensors, fed.sample(1.0, fed.task.rng("sample", rnd=rnd)), {"params": state.params, "round": rnd})
    return State(fedray.fedavg_aggregate(replies)), fedray.train_records(replies)


fedray.register_algorithm("keeps_tensors", __import__(__name__))
"""


def test_a_client_state_that_is_not_plain_data_is_named_in_the_round_it_is_returned(tmp_path, isolated):
    # once: every round trained until the first checkpoint (round 10 of 20), then an error that did
    # not name the client function
    from analysis import load_runs
    from tests.helpers import FEDRAY, run

    plugin = tmp_path / "keeps.py"
    plugin.write_text(TENSOR_STATE)
    sets = ["algorithm=keeps_tensors", "rounds=20", "checkpoint_every=10", "num_clients=4"]
    args = [*FEDRAY, "run", "--local", "--plugin", str(plugin), "--output", str(tmp_path / "out")]
    p = run([*args, *(x for kv in sets for x in ("--set", kv))], cwd=tmp_path)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    line = TENSOR_STATE.splitlines().index("def keeps_tensors(client, cstate, msg):") + 1
    said = next(x for x in p.stderr.splitlines() if "failed" in x)
    assert (
        f"algorithm keeps_tensors, client 0: ClientStateError: client function keeps.keeps_tensors "
        f"({plugin}:{line}) returned for client 0 a state that is not plain data: its state['last']['"
    ) in said
    assert "a torch.Tensor cannot be checkpointed" in said
    (row,) = load_runs(tmp_path / "out").to_dict("records")
    assert row["status"] == "failed" and row["summary"]["rounds_done"] == 0  # nothing past round 1


# --- a plug-in dataset with a key of its own (examples/plugin/noisy_digits.py) ------------------------


def _noisy(tmp_path, name, **over):
    from tests.conftest import small_config

    keys = dict(dataset="noisy_digits", model="mlp", plugins=[str(EXAMPLE / "noisy_digits.py")], rounds=2)
    return small_config(tmp_path / name, **{**keys, **over})


def test_a_plugin_datasets_own_key_is_read_checked_and_named_and_no_noise_is_digits(tmp_path, isolated):
    from fedray.config.keys import ConfigError
    from tests.conftest import small_config
    from tests.helpers import run_metrics

    quiet = _noisy(tmp_path, "quiet", data={"noise": 0})
    assert (
        quiet.data == {"noise": 0.0} and quiet.run_id() != _noisy(tmp_path, "x", data={"noise": 1}).run_id()
    )
    assert _noisy(tmp_path, "x").data == {}  # its default, left out: the same run as writing it
    assert _noisy(tmp_path, "x", data={"noise": 2.0}).run_id() == _noisy(tmp_path, "x").run_id()
    digits = run_metrics(small_config(tmp_path / "digits", dataset="digits", model="mlp", rounds=2))
    keep = ["accuracy", "loss", "sgd_loss"]
    same = [m[m["metric"].isin(keep)].reset_index(drop=True) for m in (digits, run_metrics(quiet))]
    assert len(same[0]) and same[0].equals(same[1])  # noise 0 is digits, value for value
    noisy = run_metrics(_noisy(tmp_path, "noisy", data={"noise": 4}))
    assert not noisy[noisy["metric"].isin(keep)].reset_index(drop=True).equals(same[0])
    with pytest.raises(ConfigError, match=r"config key 'data.noise': must be >= 0, got -1"):
        _noisy(tmp_path, "bad", data={"noise": -1})
    with pytest.raises(
        ConfigError,
        match=r"unknown config key 'data.nois' for dataset noisy_digits; did you mean 'data.noise'",
    ):
        _noisy(tmp_path, "bad", data={"nois": 1})
    with pytest.raises(
        ConfigError, match=r"unknown config key 'data.noise' for dataset digits \(it has no data keys\)"
    ):
        small_config(tmp_path / "bad", dataset="digits", data={"noise": 1})


def test_a_plugin_datasets_own_key_trains_batched_to_the_per_client_numbers(tmp_path, isolated):
    from tests.engine.test_batched import _off_and_on_agree

    _off_and_on_agree(
        tmp_path,
        dict(
            dataset="noisy_digits", model="mlp", plugins=[str(EXAMPLE / "noisy_digits.py")], data={"noise": 3}
        ),
    )


@pytest.mark.ray
def test_a_plugin_datasets_own_key_runs_on_ray_with_the_in_process_numbers(tmp_path, isolated, ray_session):
    from fedray.api import run

    cfg = dict(
        dataset="noisy_digits",
        model="mlp",
        rounds=2,
        num_clients=4,
        plugins=[str(EXAMPLE / "noisy_digits.py")],
        data={"noise": 3},
    )
    run(cfg, local=True, output=str(tmp_path / "local"), quiet=True)
    run(cfg, output=str(tmp_path / "ray"), num_actors=2, quiet=True)
    local, ray_ = metrics(tmp_path / "local"), metrics(tmp_path / "ray")
    assert len(local) > 10 and local.equals(ray_)
