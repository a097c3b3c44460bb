"""Plug-ins: a user's own algorithms, models, datasets and partitions, registered from a module.

A plug-in is a Python module that calls fedray's ``register_*`` functions when it is imported
(docs/extending.md). A config names it under ``plugins:`` (or ``fedray run --plugin``) as

- a ``.py`` file, or a package folder (one with ``__init__.py``): a path, relative to the config
  file that names it (to the working directory on the command line); it is imported under its
  file (folder) name, and travels to every Ray node with Ray's ``runtime_env`` (``py_modules``);
- an importable module name (``my_package.fl``): installed wherever the run's actors run.

An installed package can also register itself through an entry point of group ``fedray.plugins``
(``[project.entry-points."fedray.plugins"] my_fl = "my_package.fl"``): every fedray process
imports those first.

Every process of a run imports the run's plug-ins before it reads anything the plug-ins define:
the driver before it validates the config, the coordinator and every client actor when they start
(`activate`). A run names its plug-ins in its resolved config and their content in its run id
(`digest`), so a changed plug-in is a new run: it never resumes, skips or mixes with the results of
the old one. A client actor checks that what it imported is what the driver hashed.

This module is a leaf: the standard library only.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import socket
import sys
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENTRY_POINTS = "fedray.plugins"  # the entry-point group installed plug-ins declare


class PluginError(ImportError):
    """A plug-in cannot be found or imported; the message names it, where, and why."""


@dataclass(frozen=True)
class Plugin:
    spec: str  # as the config names it: an absolute path (file, package folder) or a module name
    name: str  # the module name it is imported under
    path: Path | None  # the file or package folder (None: an installed module not found here)

    @property
    def shipped(self) -> bool:
        """A path fedray ships to the Ray nodes (py_modules); a module name is installed there."""
        return looks_like_path(self.spec)


def looks_like_path(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or "\\" in spec or spec.startswith(".")


# A recorded config (configs/RUN_ID.yaml, the runs table) pins each plug-in to the source it ran:
# ``PATH_OR_MODULE#sha256=HEX``. Read back, a pinned plug-in must still have that source.
PIN = "#sha256="


def pinned(spec: str) -> str:
    """``spec`` (already `resolve`d) pinned to its source as it is now."""
    return f"{spec}{PIN}{digest(spec)}"


def resolve(spec: str, base: str | Path | None = None) -> str:
    """``spec`` as a config keeps it: a path made absolute (relative to ``base``, else the working
    directory), a module name as it is. Refuses a path that is not a ``.py`` file or a package, and a
    pinned spec (``...#sha256=HEX``, as a recorded config names it) whose source is not that one."""
    spec = str(spec).strip()
    if PIN in spec:
        name, want = spec.rsplit(PIN, 1)
        found = resolve(name, base)
        have = digest(found)
        if have != want:
            raise PluginError(
                f"plugin {name!r} is not the source this config was recorded with (sha256 {want[:12]}... "
                f"then, {have[:12]}... now): it would be another run; restore that source, or run the "
                "plug-in as it is now from a config that names it without #sha256="
            )
        return found
    if not spec:
        raise PluginError("plugins: an empty name")
    if not looks_like_path(spec):
        return spec
    p = Path(spec).expanduser()
    if not p.is_absolute():
        p = Path(base or ".") / p
    p = p.resolve()
    if p.is_dir() and not (p / "__init__.py").is_file():
        raise PluginError(
            f"plugin {spec!r}: {p} is a folder without __init__.py (a plug-in is a .py file or a package)"
        )
    if not p.exists():
        raise PluginError(f"plugin {spec!r}: no such file or folder ({p})")
    if p.is_file() and p.suffix != ".py":
        raise PluginError(f"plugin {spec!r}: {p} is not a .py file")
    return str(p)


def describe(spec: str) -> Plugin:
    """Where ``spec`` (already `resolve`d) is on this machine."""
    if looks_like_path(spec):
        p = Path(spec)
        return Plugin(spec, p.stem if p.suffix == ".py" else p.name, p if p.exists() else None)
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError):
        found = None
    if found is None or found.origin in (None, "built-in", "frozen"):
        return Plugin(spec, spec, None)
    origin = Path(found.origin)
    return Plugin(spec, spec, origin.parent if origin.name == "__init__.py" else origin)


def _files(path: Path) -> list[Path]:
    """A plug-in's files: the file, or every file of the package (its data files too: a YAML or
    JSON it reads changes what it does), but for compiled caches."""
    if path.is_file():
        return [path]
    return sorted(
        p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def digest(spec: str) -> str:
    """SHA-256 of the plug-in's source (a package: every file, by relative path and content)."""
    plugin = describe(spec)
    if plugin.path is None:
        raise PluginError(
            f"plugin {spec!r}: cannot be found on {socket.gethostname()} (not a file, package or importable module)"
        )
    return _source_digest(plugin.path)


_DIGESTS: dict[tuple, str] = {}  # the files' (path, size, mtime) -> their digest: run ids ask often


def _source_digest(path: Path) -> str:
    files = _files(path)
    key = tuple((str(f), (st := f.stat()).st_size, st.st_mtime_ns) for f in files)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        for f in files:
            rel = f.name if path.is_file() else f.relative_to(path).as_posix()
            h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def _imported_digest(module: object) -> str:
    """The digest of the source ``module`` was imported from ("" when it has no file)."""
    src = Path(getattr(module, "__file__", "") or "")
    return _source_digest(src.parent if src.name == "__init__.py" else src) if src.is_file() else ""


def py_modules(specs: Iterable[str]) -> list[str]:
    """The paths Ray's ``runtime_env`` ships to every node for these plug-ins (files and packages)."""
    return [s for s in specs if looks_like_path(s)]


_LOADED: dict[str, str] = {}  # spec -> module name, in this process
_SOURCES: dict[str, str] = {}  # spec -> the digest of the source this process imported
_ENTRY_POINTS_LOADED = False
_ENTRY_MODULES: list[str] = []  # the modules of the entry-point plug-ins imported here


def load_entry_points() -> list[str]:
    """Import every installed plug-in of entry-point group ``fedray.plugins`` (once per process)."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:  # the installed packages' metadata scanned once: 17 ms a scan here
        return list(_ENTRY_MODULES)
    names = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINTS):
        names.append(ep.value.split(":")[0])
        if names[-1] not in _ENTRY_MODULES:
            _ENTRY_MODULES.append(names[-1])
        if not _ENTRY_POINTS_LOADED:
            try:
                ep.load()
            except Exception as e:
                raise PluginError(_failure(f"entry point {ep.name!r} ({ep.value})", e)) from e
    _ENTRY_POINTS_LOADED = True
    return names


def _failure(what: str, e: BaseException, where: str = "") -> str:
    tb = traceback.extract_tb(e.__traceback__)
    at = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
    node = where or f"this process on {socket.gethostname()}"
    return f"plugin {what} failed to import in {node}: {type(e).__name__}: {e}{at}"


def activate(specs: Sequence[str], where: str = "", expect: dict[str, str] | None = None) -> None:
    """Import the installed entry-point plug-ins and ``specs`` (resolved) in this process, once each.

    A file or package is imported under its name from its folder where that exists here, else from
    what Ray's ``py_modules`` put on ``sys.path`` (another node). ``expect`` (spec -> `digest`):
    what the driver hashed; a plug-in whose source differs here is an error. ``where`` names this
    process in errors (``client actor on node 10.0.0.7``)."""
    load_entry_points()
    for spec in specs:
        if spec in _LOADED:
            now = describe(spec).path
            if now is not None and spec in _SOURCES and _source_digest(now) != _SOURCES[spec]:
                raise PluginError(
                    f"plugin {spec!r} changed since this process imported it: its new code would not run "
                    "here, so its runs would carry the new source's hash with the old behaviour; start a new "
                    "process (in a notebook: restart the kernel)"
                )
            continue
        plugin = describe(spec)
        held = sys.modules.get(plugin.name)
        if held is not None and plugin.path is not None and plugin.shipped:
            held_at = getattr(held, "__file__", None) or ""
            own = plugin.path / "__init__.py" if plugin.path.is_dir() else plugin.path
            if held_at and Path(held_at).resolve() != own.resolve():
                raise PluginError(
                    f"plugin {spec!r}: a module named {plugin.name!r} is imported already from {held_at}; "
                    "rename the plug-in's file"
                )
        try:
            if plugin.path is not None and plugin.shipped and held is None:
                module = _import_from(plugin.name, plugin.path)
            else:  # an installed module, or what Ray's py_modules put on this node's sys.path
                module = importlib.import_module(plugin.name)
        except Exception as e:
            if held is None:
                sys.modules.pop(plugin.name, None)  # no half-imported plug-in left behind
            raise PluginError(_failure(repr(spec), e, where)) from e
        here = _imported_digest(module)
        if expect and spec in expect and here != expect[spec]:
            raise PluginError(
                f"plugin {spec!r} in {where or 'this process'} is not the one the driver read "
                f"(sha256 {here[:12] or 'unknown'} here, {expect[spec][:12]} there): the same version must be "
                "on every node"
            )
        _LOADED[spec] = plugin.name
        if here:
            _SOURCES[spec] = here


def _import_from(name: str, path: Path) -> Any:
    """Import the plug-in file or package at ``path`` as module ``name``, by its path: its folder is
    never put on ``sys.path``, so a ``numpy.py`` or ``ray.py`` lying beside it shadows nothing."""
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(
            name, path / "__init__.py", submodule_search_locations=[str(path)]
        )
    else:
        spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path} as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: its own imports of itself, pickling by name
    spec.loader.exec_module(module)
    return module


def is_plugin_module(module: str) -> bool:
    """Whether ``module`` belongs to a plug-in imported in this process (its dataclasses may be in a
    checkpoint, as fedray's own)."""
    names = set(_LOADED.values()) | set(_ENTRY_MODULES)
    return any(module == n or module.startswith(n + ".") for n in names)


def origin(module: str) -> str | None:
    """The plug-in (as `activate` took it) that module ``module`` belongs to; None for fedray's own."""
    if not module or module == "fedray" or module.startswith("fedray."):
        return None
    for spec, name in _LOADED.items():
        if module == name or module.startswith(name + "."):
            return spec
    return module or None  # an entry-point plug-in (or a module that registered without being named)
