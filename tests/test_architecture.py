"""The house's rules, checked on the code as it is (docs/architecture.md): what each top-level package
may import, no import cycles, fedray's folders as layers that import only those below them, short
functions and algorithm files, and tests laid out as the layers are."""

from __future__ import annotations

import ast

from jobs.dev.import_graph import config_reach, cycles, graph, modules
from tests.conftest import ROOT

# the library: no Ray, nothing above it (but its front door)
FORBIDDEN = {
    "fedray": {
        "ray",
        "actors",
        "jobs",
        "analysis",
    },
    "actors": {"jobs", "analysis"},  # the Ray layer: fedray and ray only
    "analysis": {"ray", "actors", "jobs"},  # results: reads fedray's files, no Ray
}


def _imports(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):  # function-level imports too
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_every_algorithm_file_is_short():
    """An algorithm's own file reads like its paper: at most 180 lines; what is longer moves into its
    family's folder beside it (docs/architecture.md)."""
    import importlib
    import inspect

    from fedray.algorithms import ALGORITHMS

    long = {}
    for name, alg in ALGORITHMS.items():
        path = inspect.getfile(importlib.import_module(alg.module))
        n = len(open(path).read().splitlines())
        if n > 180:
            long[name] = n
    assert not long, f"algorithm files over 180 lines: {long}"
    assert {a.module.split(".")[2] for a in ALGORITHMS.values()} <= {
        "baselines",
        "clustered",
        "concat",
        "mixture",
        "relay",
        "sampling",
        "splitting",
    }, "every algorithm lives in its family's folder"


# fedray.api, the Python front door (fedray.run, fedray.sweep), runs on Ray and reads results: it may
# import the Ray layer and the readers inside its functions, and nothing in the library imports it.
FRONT_DOOR = ("fedray/api.py", {"ray", "jobs"})


def test_the_dependency_rule():
    bad = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel == FRONT_DOOR[0]:
                forbidden = FRONT_DOOR[1]
            for name in sorted(_imports(ast.parse(path.read_text())) & forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, bad


def _module_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, function-level imports included (``from pkg import
    sub`` counts as an import of the submodule, not of the package's ``__init__``)."""
    return graph(modules(ROOT))


_cycles = cycles


def test_cycle_finder():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back_even_inside_a_function():
    """No import cycle among the project's modules, function-level imports counted: fedray's config
    keys import only their own folder's coercion, hparams, roles, run ids, sections and plug-ins (the registry checks are
    fedray.experiment.checks's; the plug-ins' hashes in the run id come from
    fedray.config.plugins, a leaf itself), and the CLI hands the reference harness its sweep
    runner instead of being imported back."""
    graph = _module_graph()
    assert graph["fedray.config.keys"] <= {
        "fedray.config.hparams",
        "fedray.config.coercion",
        "fedray.config.plugins",
        "fedray.config.roles",
        "fedray.config.run_ids",
        "fedray.config.sections",
    }, graph["fedray.config.keys"]
    # the run id's rule reads the roles a config's class declares, never the config's module
    assert graph["fedray.config.run_ids"] <= {
        "fedray.config.plugins",
        "fedray.config.roles",
        "fedray.config.sections",
    }, graph["fedray.config.run_ids"]
    assert not graph["fedray.config.roles"]  # a leaf: the standard library only
    assert not graph["fedray.config.sections"]  # a leaf: the standard library only
    assert not graph["fedray.config.plugins"], graph["fedray.config.plugins"]  # the standard library only
    front = {m for m, deps in graph.items() if "fedray.api" in deps}
    assert front <= {"jobs.cli"}, f"only the command line goes through the front door: {front}"
    assert not _cycles(graph)


# fedray's folders are its layers, bottom up (docs/architecture.md and each folder's __init__): a
# module imports its own folder and those of the layers below it, never one above, function-level
# imports included. The package's own __init__ (public names, moved modules) and the vocabulary
# every layer speaks (params, records) are at the bottom; the front door (api, progress) on top.
LAYERS = [
    ("fedray", "fedray.params", "fedray.records"),
    ("fedray.config",),
    ("fedray.models",),
    ("fedray.data",),
    ("fedray.storage",),
    ("fedray.engine",),
    ("fedray.federation",),
    ("fedray.algorithms",),
    ("fedray.experiment",),
    ("fedray.sweeps",),
    ("fedray.progress", "fedray.api"),
]


def _layer(module: str) -> int:
    """The index in LAYERS of the folder (or top-level module) that holds ``module``."""
    parts = module.split(".")
    place = ".".join(parts[:2])
    return next(i for i, names in enumerate(LAYERS) if place in names)


def test_every_module_of_fedray_is_in_a_layer_and_the_top_level_holds_few():
    places = {".".join(m.split(".")[:2]) for m in _module_graph() if m.startswith("fedray")}
    listed = {name for names in LAYERS for name in names}
    assert places == listed, (places - listed, listed - places)
    top = sorted(p.name for p in (ROOT / "fedray").glob("*.py"))
    assert top == ["__init__.py", "api.py", "params.py", "progress.py", "records.py"], top
    for folder in (ROOT / "fedray").iterdir():
        if folder.is_dir() and (folder / "__init__.py").exists():
            doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
            assert "May import" in doc, (
                f"fedray/{folder.name}/__init__.py: say what the folder holds and what it may import"
            )


def test_no_function_of_fedray_or_actors_runs_past_a_hundred_lines():
    # a function reads in a screen or two; a longer one is doing several jobs (train_stacked was
    # 265 lines doing five)
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for folder in ("fedray", "actors")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 100
    ]
    assert not long, long


def test_no_module_of_fedray_imports_a_layer_above_its_own():
    upward = [
        f"{module} imports {dep}"
        for module, deps in sorted(_module_graph().items())
        if module.startswith("fedray")
        for dep in sorted(deps)
        if dep.startswith("fedray") and _layer(dep) > _layer(module)
    ]
    assert not upward, upward


def test_below_the_experiment_layer_no_function_takes_the_whole_config():
    # each layer takes the section it reads (fedray/config/sections.py: the data layer a
    # DataSection, an algorithm's check a RunPlan, the engine and the federation a Task)
    below = (
        "fedray.models",
        "fedray.data",
        "fedray.storage",
        "fedray.engine",
        "fedray.federation",
        "fedray.algorithms",
    )
    mods = {name: path for name, path in modules(ROOT).items() if name.startswith(below)}
    assert len(mods) > 80
    whole, _ = config_reach(mods, [])
    assert not whole, whole


def test_the_config_reach_finds_a_function_that_takes_the_config(tmp_path):
    for source in ("def f(cfg):\n    pass\n", "def f(c: Config) -> None:\n    pass\n"):
        (tmp_path / "m.py").write_text(source)
        assert config_reach({"m": tmp_path / "m.py"}, [])[0] == ["m"], source
    (tmp_path / "m.py").write_text("def f(section: DataSection):\n    pass\n")
    assert config_reach({"m": tmp_path / "m.py"}, [])[0] == []


def test_the_layer_rule_catches_an_import_from_above():
    assert _layer("fedray.engine.batched") > _layer("fedray.storage.checkpoint")
    assert _layer("fedray.federation") == _layer("fedray.federation.host")
    assert _layer("fedray.api") == len(LAYERS) - 1 and _layer("fedray.params") == 0


# the tests mirror the layers: a folder of tests for each (tests/config/, tests/data/, ...), and
# only the suite's own files directly in tests/
TEST_FOLDERS = {
    "config",
    "data",
    "models",
    "storage",
    "engine",
    "federation",
    "algorithms",
    "sweeps",
    "front",
    "analysis",
    "reference",
}


def test_the_tests_are_laid_out_as_the_layers_with_few_files_at_the_top():
    top = sorted(p.name for p in (ROOT / "tests").glob("*.py"))
    assert top == ["conftest.py", "helpers.py", "test_architecture.py", "test_docs.py"], top
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and list(p.glob("test_*.py"))}
    assert folders == TEST_FOLDERS, folders ^ TEST_FOLDERS
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert len(names) == len(set(names)), "two test files of one name: pytest imports them by their name"
