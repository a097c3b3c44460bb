"""`fedray reference NAME CONFIG --checkout PATH --output DIR`: a sweep's runs on the authors' code
and in fedray, on the same clients, into one results folder.

1. The reference runs every run of the sweep (``--jobs`` at once) through its wrapper; its
   partitions land in DIR/reference/partitions/, its per-round accuracy in DIR as runs whose
   ``source`` is its repository. Runs already imported are skipped (``--force`` runs them again).
2. fedray runs the same sweep on the reference's partitions: DIR/reference/NAME-fedray.yaml, run
   here with `fedray sweep` (resumable; ``--reference-only`` leaves it to you).

Then: ``fedray report DIR --cols source,algorithm`` (FedConcat: ``--stage classifier --round R``).
``--partitions-only`` draws only the reference's partitions (seconds), so the fedray side can start
while the reference runs. ``--check`` shows, on a tiny run, that the wrapper's shortcuts leave the
reference's trained weights bit for bit as they were. The references, and the options each takes
beyond the common ones, are the records of `jobs.reference.registry.REFERENCES`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobs.reference.record import Reference

EXIT_USAGE, EXIT_FAILED = 2, 1


def add_parser(sub: argparse._SubParsersAction, run_sweep: Callable[[Path, bool], int]) -> None:
    """The ``reference`` command; ``run_sweep(path, local)`` runs a sweep file as `fedray sweep` does
    (with ``--local`` where ``local``; the CLI hands its own, so this module does not import the CLI
    back). The names, their help and the options some references take come from the registry."""
    from jobs.reference.registry import REFERENCES, options, takers

    p = sub.add_parser(
        "reference", description="run a sweep on the authors' code and in fedray, on the same clients"
    )
    names = [f"{name} ({ref.about or ref.repo})" for name, ref in REFERENCES.items()]
    p.add_argument("name", help=f"the reference: {', '.join(names[:-1])}, or {names[-1]}")
    p.add_argument("config", nargs="?", help="sweep (or run) YAML, as for `fedray sweep`")
    p.add_argument(
        "--checkout", required=True, type=Path, help="a git checkout of the reference's repository"
    )
    p.add_argument("--output", required=True, help="results folder for both sides")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--only", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--jobs", type=int, default=1, help="reference runs at once (default 1)")
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads per reference run (default: torch's)"
    )
    p.add_argument("--reference-only", action="store_true", help="run the reference side only")
    p.add_argument(
        "--fedray-only", action="store_true", help="run the fedray side only (partitions must exist)"
    )
    p.add_argument(
        "--local",
        action="store_true",
        help="run the fedray side in this process, one run at a time (as `fedray sweep --local`): "
        "Ray's workers run niced, so on a machine busy with other work they wait",
    )
    for flag, opt in options().items():  # None (not given) for all: a reference that takes it has its default
        how = (
            {"action": "store_true", "default": None}
            if opt.switch
            else {"default": None, "type": opt.type, "choices": opt.choices, "metavar": opt.metavar}
        )
        p.add_argument(flag, help=f"{', '.join(takers(opt))}: {opt.help}", **how)
    p.set_defaults(func=cmd_reference, run_sweep=run_sweep)


def reference_options(ref: Reference, args: argparse.Namespace) -> dict[str, Any]:
    """The options ``ref`` takes, each as given or its default; a ReferenceError names an option it
    does not take that was given."""
    from jobs.reference.record import ReferenceError
    from jobs.reference.registry import options, takers

    for opt in options().values():
        if getattr(args, opt.dest, None) is not None and opt not in ref.options:
            who = takers(opt)
            raise ReferenceError(
                f"{ref.name}: {opt.flag} does not apply (only {', '.join(who)} take{'s' * (len(who) == 1)} it)"
            )
    return {
        o.dest: o.default if getattr(args, o.dest, None) is None else getattr(args, o.dest)
        for o in ref.options
    }


def cmd_reference(args: argparse.Namespace) -> int:
    from jobs.reference.record import ReferenceError
    from jobs.reference.registry import REFERENCES

    ref = REFERENCES.get(args.name)
    if ref is None:
        print(
            f"fedray: error: unknown reference {args.name!r} (known: {', '.join(REFERENCES)})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        opts = reference_options(ref, args)
    except ReferenceError as e:
        print(f"fedray: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    from fedray.config.keys import ConfigError
    from fedray.data import DatasetMissing
    from fedray.sweeps.sweep_file import load_sweep
    from jobs.reference.harness import check_checkout, run_wrapped, write_fedray_side

    out, checkout = Path(args.output).resolve(), args.checkout.resolve()
    side_kw: dict[str, Any] = {}  # where the fedray side runs: default, on the reference's partitions
    try:
        if opts.get("check"):
            return ref.check(ref, checkout, out)
        if args.config and not args.fedray_only:
            check_checkout(ref, checkout)
        sets = list(args.sets)
        if ref.clients is not None:  # clients the reference makes itself (FedRC: its generator's)
            clients, more = ref.clients(checkout, out, opts)
            print(f"clients: {clients} (dataset: client_files, data_root: {clients})", flush=True)
            if not args.config:
                return 0
            sets += more
            side_kw = {"place": lambda cfg, _: cfg, "where": f"each on the clients in {clients}"}
        elif not args.config:
            print("fedray: error: give a sweep or run config (or --check)", file=sys.stderr)
            return EXIT_USAGE
        runs = [r.config for r in load_sweep(args.config, sets, output=str(out), only=args.only).runs]
        for cfg in runs if ref.check_run is not None else ():
            ref.check_run(cfg)
        failed = 0
        if not args.fedray_only:
            failed = (ref.run or run_wrapped)(ref, runs, checkout, out, args.jobs, args.threads, opts)
    except (ConfigError, DatasetMissing) as e:  # ReferenceError is a ConfigError
        print(f"fedray: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    side = write_fedray_side(ref.name, runs, out, ref.repo, **side_kw)
    print(f"fedray side: {side}", flush=True)
    if args.reference_only or opts.get("partitions_only"):
        print(f"run it with: fedray sweep {side}{' --local' if args.local else ''}")
        return EXIT_FAILED if failed else 0
    rc = args.run_sweep(side, args.local)
    print(f"side by side: fedray report {out} {ref.report}")
    return rc or (EXIT_FAILED if failed else 0)
