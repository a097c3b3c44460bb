"""The command line every in-process wrapper of a reference script shares (NIID-Bench's, FedRepo's,
FL-bench's): ``[--checkout P --result F --workdir D --threads T, and the wrapper's own options] --
SCRIPT ARGS``. Standard library only, so a wrapper imports it before the reference's modules."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def parse_wrapper_argv(
    argv: list[str],
    prog: str,
    script: argparse.ArgumentParser | None = None,
    options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> tuple[argparse.Namespace, str, list[str], argparse.Namespace | None] | None:
    """(the wrapper's options, the script, its arguments as given, as parsed by ``script`` if given);
    None (with usage printed) without the ``--``. ``options`` adds the wrapper's own options. The
    checkout and result come back resolved, and the working folder (default: the result's) made."""
    if "--" not in argv:
        print(f"usage: {prog} [options] -- SCRIPT ARGS...", file=sys.stderr)
        return None
    split = argv.index("--")
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("--checkout", required=True, type=Path)
    ap.add_argument("--result", required=True, type=Path)
    ap.add_argument("--workdir", type=Path, help="the run's working folder (default: the result's folder)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    if options is not None:
        options(ap)
    opts = ap.parse_args(argv[:split])
    name, *args = argv[split + 1 :]
    opts.checkout, opts.result = opts.checkout.resolve(), opts.result.resolve()
    opts.workdir = (opts.workdir or opts.result.parent).resolve()
    opts.workdir.mkdir(parents=True, exist_ok=True)
    return opts, name, args, script.parse_args(args) if script is not None else None
