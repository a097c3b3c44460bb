"""The docs: docs/algorithms.md is what `fedray docs` writes now, every relative link in README.md
and docs/ finds its file in the repository, and the dependency rule docs/architecture.md states holds."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

import pytest

from jobs.cli import main
from jobs.docs import END, PAGE, algorithm_docs, hp_keys, render_page
from jobs.import_graph import cycles, graph, modules
from tests.conftest import ROOT

PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "algorithms").glob("*.md")),
]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_PATH = re.compile(r"`(\.\./[^`\s]*)`")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)


def test_algorithms_page_is_what_fedray_docs_writes():
    committed = PAGE.read_text()
    assert render_page(committed) == committed, "docs/algorithms.md is stale: run `fedray docs`"


def test_fedray_docs_check_and_rewrite(tmp_path, capsys):
    page = tmp_path / "algorithms.md"
    committed = PAGE.read_text()
    page.write_text(committed.replace("| `server_lr` |", "| `server_lr_old` |", 1))
    assert main(["docs", "--check", "-o", str(page)]) == 1
    assert "run `fedray docs`" in capsys.readouterr().err
    assert main(["docs", "-o", str(page)]) == 0 and page.read_text() == committed
    assert main(["docs", "--check", "-o", str(page)]) == 0
    page.write_text("# no markers\n")
    assert main(["docs", "-o", str(page)]) == 2 and END in capsys.readouterr().err


def test_every_hp_key_of_every_algorithm_has_a_meaning():
    missing = [f"{d.name}: hp.{k.name}" for d in algorithm_docs() for k in d.keys if not k.meaning]
    assert not missing, f"give these fields a comment (or metadata doc), then run `fedray docs`: {missing}"


@dataclass
class _Base:
    a: int = 1  # the a
    # the b, above
    # on two lines
    b: float = 0.5


@dataclass
class _Sub(_Base):
    c: str = (
        "x"  # wrapped by a formatter, as a comment too long for the line is: the default sits in parentheses
    )
    d: list[int] = field(default_factory=list, metadata={"doc": "from the metadata"})  # not this
    e: bool = False


def test_a_fields_meaning_comes_from_metadata_else_its_comments():
    keys = {k.name: k for k in hp_keys(_Sub)}
    assert [k.name for k in keys.values()] == ["a", "b", "c", "d", "e"]
    assert keys["a"].meaning == "the a" and keys["a"].defined_in == "test_docs"
    assert keys["b"].meaning == "the b, above on two lines"
    assert keys["c"].meaning.startswith("wrapped by a formatter,") and keys["c"].default == "x"
    assert keys["d"].meaning == "from the metadata" and keys["d"].default == []
    assert keys["e"].meaning == "" and keys["e"].type == "bool"


def _links(text: str) -> list[str]:
    """Link targets, and paths written as code that climb out of the page's folder (`../x`)."""
    text = FENCE.sub("", text)  # a link inside a code block is not a link
    return INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text) + CODE_PATH.findall(text)


def test_link_finder():
    text = "[a](x.md) ![b](img/p.png) [c](https://e.org) [d](#top)\n```\n[e](nope.md)\n```\n[f]: y.md\n`../z.md`\n"
    assert _links(text) == ["x.md", "img/p.png", "https://e.org", "#top", "y.md", "../z.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_finds_a_file_in_the_repository(page):
    bad = []
    for target in _links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the page itself
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.is_relative_to(ROOT):
            bad.append(f"{target} (outside the repository)")
        elif not path.exists():
            bad.append(f"{target} (no such file)")
    assert not bad, f"{page.relative_to(ROOT)}: {bad}"


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_citation_of_the_algorithm_notes_finds_its_section():
    """The code, configs and docs cite the algorithm notes as ``docs/algorithms/FILE.md#section``:
    each cited file exists and has a heading with that anchor. No citation points outside the
    repository (the notes the code was first written from are not in it)."""
    import subprocess

    files = subprocess.run(
        ["git", "ls-files", "*.py", "*.yaml", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    anchors: dict[str, set[str]] = {}
    bad = []
    for f in files:
        if f.startswith("docs/results/") or not (ROOT / f).exists():
            continue
        text = (ROOT / f).read_text()
        for m in re.finditer(r"docs/algorithms/([a-z][\w-]*\.md)(?:#([\w-]+))?", text):
            note = ROOT / "docs" / "algorithms" / m.group(1)
            if not note.exists():
                bad.append(f"{f}: {m.group(0)} (no such note)")
                continue
            if note.name not in anchors:
                anchors[note.name] = {
                    _anchor(h) for h in re.findall(r"^#+ (.+)$", FENCE.sub("", note.read_text()), re.M)
                }
            if m.group(2) and m.group(2) not in anchors[note.name]:
                bad.append(f"{f}: {m.group(0)} (no such section)")
        if f != "tests/test_docs.py" and re.search(r"ALGORITHMS\.md|register rows? \d|DESIGN ?§", text):
            bad.append(f"{f}: cites notes that are not in the repository")
    assert not bad, "\n".join(bad)


# --- the dependency rule (docs/architecture.md) -------------------------------------------------

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
    keys import only their own folder's coercion, hparams and plug-ins (the registry checks are
    fedray.experiment.validation's; the plug-ins' hashes in the run id come from
    fedray.config.plugins, a leaf itself), and the CLI hands the reference harness its sweep
    runner instead of being imported back."""
    graph = _module_graph()
    assert graph["fedray.config.keys"] <= {
        "fedray.config.hparams",
        "fedray.config.coercion",
        "fedray.config.plugins",
    }, graph["fedray.config.keys"]
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


def test_the_layer_rule_catches_an_import_from_above():
    assert _layer("fedray.engine.batched") > _layer("fedray.storage.checkpoint")
    assert _layer("fedray.federation") == _layer("fedray.federation.host")
    assert _layer("fedray.api") == len(LAYERS) - 1 and _layer("fedray.params") == 0


def test_fidelity_page_is_what_fedray_fidelity_writes_from_the_kept_results(tmp_path):
    # docs/fidelity.md is regenerated, never typed: from the results kept in docs/results/ the command
    # writes the page as committed (sections whose results were on an earlier machine kept as they are).
    import shutil

    from tests.helpers import FEDRAY, run

    page = tmp_path / "fidelity.md"
    shutil.copyfile(ROOT / "docs" / "fidelity.md", page)
    p = run([*FEDRAY, "fidelity", "docs/fidelity.yaml", "--keep-missing", "-o", str(page)], cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert page.read_text() == (ROOT / "docs" / "fidelity.md").read_text()
    for image in ("fidelity-fedcat.png", "fidelity-layercfl-onset.png"):
        assert (tmp_path / image).exists() and (ROOT / "docs" / image).exists()


@pytest.mark.parametrize("page", ["README.md", "docs/sweeps-and-reports.md"])
def test_the_sample_sweeps_run_ids_are_the_ones_the_sweep_file_gives(page):
    # The pages show `fedray sweep jobs/configs/digits_sweep.yaml`'s output; a reader matches its
    # run ids against their own results folder, so a change to what a run id hashes must show here.
    from fedray.sweeps.sweep_file import load_sweep

    shown = set(re.findall(r"\((fedavg-digits-s\d-[0-9a-f]{10}),", (ROOT / page).read_text()))
    runs = {r.run_id for r in load_sweep(ROOT / "jobs" / "configs" / "digits_sweep.yaml").runs}
    assert shown and shown <= runs, (shown - runs, runs)


def test_an_old_module_name_imports_the_module_it_moved_to_and_says_so_once():
    # a plug-in written against an earlier fedray (from fedray.hparams import bound) keeps working:
    # it gets the module itself, and one warning names the new place
    import subprocess
    import sys

    code = (
        "from fedray.hparams import bound\n"
        "from fedray.hparams import one_of\n"
        "import fedray.evaluation as old, fedray.algorithms.evaluation as new\n"
        "import fedray.config.hparams as h\n"
        "assert bound is h.bound and old is new\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("fedray.hparams is now fedray.config.hparams") == 1, p.stderr
    assert p.stderr.count("fedray.evaluation is now fedray.algorithms.evaluation") == 1, p.stderr
    assert "FedrayMovedWarning" in p.stderr


def test_the_worked_example_in_architecture_md_is_the_code_as_it_is():
    # each code block of the worked example stands, word for word, in a file the section links to
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page[page.index("### Worked example") :]
    section = section[: section.index("Then, for a new algorithm:")]
    linked = {ROOT / "docs" / target for target in INLINE_LINK.findall(section)}
    sources = {path: path.read_text() for path in linked if path.suffix == ".py"}
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(blocks) >= 3 and len(sources) >= 3
    for block in blocks:
        assert any(block.strip() in text for text in sources.values()), f"not in the code:\n{block}"
