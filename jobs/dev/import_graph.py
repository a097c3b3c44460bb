"""Figures of the project's import graph, to hold a layout change against the one before it.

    python -m jobs.dev.import_graph [--root DIR] [--key lr --key batched_clients ...]

Reads fedray/, actors/, jobs/ and analysis/ (not tests) as text, every import counted, those
inside functions too (``from pkg import sub`` as an import of the submodule), and prints:

- files, and the files directly in fedray/;
- import edges between the project's modules, and import levels (the longest chain of imports);
- cycles (groups of modules that import each other, directly or around a loop);
- imports in fedray/ that run back up its layers (a folder importing one after it in the order the
  package's ``__init__`` names; "-" where the tree has no such order);
- how far the config reaches: the files with a function that takes the whole config (a parameter
  annotated ``Config`` or named ``cfg``), and for each ``--key`` the files that read it as an
  attribute (``.lr``), from the command line (jobs/cli.py) to where it is used.

``--root`` reads another checkout (a ``git worktree add`` of an earlier commit) with this module.
tests/test_docs.py holds the project to its rules with the same graph (`modules`, `graph`, `cycles`).
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

PACKAGES = ("fedray", "actors", "jobs", "analysis")


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    out = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in mods:
                deps |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                    for a in node.names
                }
        out[name] = deps - {name}
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while comp[-1:] != [v]:
                comp.append(stack.pop())
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def levels(g: dict[str, set[str]]) -> int:
    """The longest chain of imports (modules in a cycle counted once)."""
    depth: dict[str, int] = {}

    def d(v: str, seen: frozenset[str]) -> int:
        if v in depth:
            return depth[v]
        below = [d(w, seen | {v}) for w in g[v] if w not in seen]
        depth[v] = 1 + max(below, default=0)
        return depth[v]

    return max((d(v, frozenset()) for v in g), default=0)


def layer_order(root: Path) -> list[str] | None:
    """fedray/'s folders in the order its __init__ names them as layers, or None."""
    doc = ast.get_docstring(ast.parse((root / "fedray" / "__init__.py").read_text())) or ""
    m = re.search(r"The folders below are the layers.*?:(.*?);\s*then", doc, re.DOTALL)
    if m is None:
        return None
    return re.findall(r"`(\w+)/`", m.group(1))


def upward(g: dict[str, set[str]], order: list[str]) -> list[str]:
    rank = {name: i for i, names in enumerate(order) for name in names.split("|")}

    def place(module: str) -> int:
        parts = module.split(".")
        if len(parts) > 1 and parts[1] in rank:
            return rank[parts[1]] + 1
        # the package's __init__ and the vocabulary below every layer; the front door above them
        return 0 if module in ("fedray", "fedray.params", "fedray.records") else len(order) + 1

    return [
        f"{a} -> {b}"
        for a, deps in g.items()
        if a.startswith("fedray")
        for b in deps
        if b.startswith("fedray") and place(b) > place(a)
    ]


def config_reach(mods: dict[str, Path], keys: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    whole, by_key = [], {k: [] for k in keys}
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        takes = any(
            (a.arg == "cfg" or (a.annotation is not None and "Config" in ast.unparse(a.annotation)))
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        )
        if takes:
            whole.append(name)
        attrs = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        for k in keys:
            if k in attrs:
                by_key[k].append(name)
    return whole, by_key


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.dev.import_graph", description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[2]), help="the checkout to read")
    ap.add_argument("--key", action="append", default=[], help="a config key to follow (repeatable)")
    args = ap.parse_args(argv)
    root = Path(args.root)
    mods = modules(root)
    g = graph(mods)
    top = sorted(p.name for p in (root / "fedray").glob("*.py"))
    print(f"files: {len(mods)} ({len(top)} directly in fedray/: {', '.join(top)})")
    print(f"import edges: {sum(len(d) for d in g.values())}; import levels: {levels(g)}")
    lib = {m: {d for d in deps if d.startswith("fedray")} for m, deps in g.items() if m.startswith("fedray")}
    print(
        f"within fedray/: {len(lib)} modules, {sum(len(d) for d in lib.values())} edges, {levels(lib)} levels"
    )
    found = cycles(g)
    print(f"cycles: {len(found)}" + "".join(f"\n  {' <-> '.join(c)}" for c in found))
    order = layer_order(root)
    if order is None:
        print("imports in fedray/ that run back up its layers: - (no layer folders)")
    else:
        up = upward(g, order)
        print(f"imports in fedray/ that run back up its layers ({' < '.join(order)}): {len(up)}")
        for line in up:
            print(f"  {line}")
    whole, by_key = config_reach(mods, args.key or ["lr", "batched_clients"])
    print(f"files with a function that takes the whole config: {len(whole)}")
    for key, files in by_key.items():
        print(f"files that read .{key}: {len(files)}: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
