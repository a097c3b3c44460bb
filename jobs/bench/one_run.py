"""What the benchmark scripts pick to run: the config of one run from a run or sweep file, for those
that take one (``CONFIG [--set KEY=VALUE] [--only KEY=VALUE]``: jobs/bench/checkpoint.py,
jobs/bench/cuda.py), and the named variants or cases of ``--only A,B`` (jobs/bench/headline.py,
jobs/bench/scale.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


def picked_names(only: str, choices: Sequence[str], prog: str, what: str) -> list[str] | None:
    """The names of ``--only A,B``, or None (said on stderr, naming ``what``) when one is not a choice."""
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in choices]
    if unknown:
        print(f"{prog}: unknown {what}(s) {unknown}; choose from {list(choices)}", file=sys.stderr)
        return None
    return names


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("config")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--only", action="append", default=[], help="sweep files: KEY=VALUE picking the run")


def picked(args: argparse.Namespace, sets: Sequence[str]) -> Any | None:
    """The one run ``args.config`` with ``sets`` and ``args.only`` gives, or None (said on stderr)
    when it gives none or several."""
    from fedray.sweeps.sweep_file import SweepError, load_sweep

    try:
        runs = load_sweep(args.config, sets, only=args.only).runs
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    if len(runs) != 1:
        print(f"{args.config} with {args.only} gives {len(runs)} runs; pick one with --only", file=sys.stderr)
        return None
    return runs[0].config
