"""The docs: docs/algorithms.md is what `fedray docs` writes now, every relative link in README.md
and docs/ finds its file in the repository, and the pages' examples are the code as it is (the
dependency rule docs/architecture.md states: tests/test_architecture.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from jobs.cli import main
from jobs.docs import END, PAGE, algorithm_docs, hp_keys, render_page
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
