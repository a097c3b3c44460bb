"""`fedray tune FILE`: search a config's (or each sweep cell's) settings on validation with Ray Tune,
then, for a sweep file, run its seeds at the chosen values on test (docs/tuning.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from jobs.cli_args import add_config_args, config_sets

EXIT_USAGE, EXIT_FAILED = 2, 1


def cmd_tune(args: argparse.Namespace) -> int:
    from fedray.config.coercion import ConfigError
    from fedray.data import DatasetMissing
    from fedray.sweeps.tune_plan import describe_plan, open_plan

    try:
        plan = open_plan(args.config, config_sets(args), args.output, args.plugins)
    except (ConfigError, DatasetMissing, OSError) as e:
        print(f"fedray: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    for line in describe_plan(plan) if args.dry_run or not args.quiet else ():
        print(line, flush=True)
    if args.dry_run:
        for label, cfg in plan.cells:
            print(
                f"  {label or cfg.algorithm}: {cfg.rounds} rounds, validation_fraction {cfg.validation_fraction:g}"
            )
        if plan.seeds:
            print(f"  then each cell at its chosen values on test, seeds {plan.seeds}")
        return 0
    return _run(plan, args)


def _say(line: str) -> None:
    print(line, flush=True)


def _run(plan: Any, args: argparse.Namespace) -> int:
    """`fedray.api.launch_tune` (`fedray.tune`'s sequence too; ``args.launch``, handed over by the
    command line so this module never imports the front door), its ends said as the CLI says them."""
    from fedray.storage.lock import RunLocked
    from fedray.sweeps.tuning import TuneError

    say = None if args.quiet else _say
    try:
        done = args.launch(
            plan, address=args.address, restart=args.restart, say=say, progress_s=args.progress_every
        )
    except ConnectionError as e:
        print(f"fedray: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (TuneError, RunLocked) as e:  # RunLocked: something not fedray's where the search's lock goes
        print(f"fedray: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        again = " (without --restart)" if args.restart else ""
        print(
            f"fedray: tuning interrupted; the same command{again} goes on: the trials' runs are kept and go on "
            "from their checkpoints, and every decision made is made again the same way (--restart starts over)",
            file=sys.stderr,
        )
        return 130
    if args.quiet:
        for doc in done.docs:
            chosen = ", ".join(f"{k}={v}" for k, v in doc["chosen"].items())
            said = f"{chosen} ({doc['metric']} {doc['value']})" if doc.get("trials") else "nothing searched"
            print(f"{doc['cell'] or doc['algorithm']}: {said}")
    return 0 if done.ok else EXIT_FAILED


def validation_picks(args: argparse.Namespace, values: Any, at: str, way: str) -> Any:
    """`--tuned`'s choice on validation: the val_ twin of ``--metric`` on the runs of the same
    settings that evaluated on validation; None where the folder has none."""
    from analysis.report import ReportError, run_values
    from analysis.report import validation_picks as picks_of

    try:
        validation = run_values(
            args.dir, f"val_{args.metric}", at, args.round, args.stage, include_unfinished=True, better=way
        )
    except ReportError:  # no run here recorded it
        return None
    return picks_of(values, validation)


def tuned_lines(out: str) -> list[str]:
    """What `fedray tune` chose for each cell of this folder (its tuned.yaml), one line a cell."""
    from fedray.sweeps.tuning import read_tuned

    cells = read_tuned(out)
    if not cells:
        return []
    lines = [f"tuned on validation ({out}/tuned.yaml; fedray report {out} --trials lists the trials):"]
    for c in cells:
        chosen = ", ".join(f"{k}={v}" for k, v in c["chosen"].items())
        if not c.get("trials"):
            lines.append(
                f"  {c['experiment']} {c['cell'] or c['algorithm']}: nothing searched (its config as it is)"
            )
            continue
        lines.append(
            f"  {c['experiment']} {c['cell'] or c['algorithm']}: {chosen} ({c['metric']} {c['value']}, {c['at']}, "
            f"of {c['trials']} trials, {c['stopped_early']} stopped early"
            + (
                f"; {c['trial_rounds']} of {c['full_trial_rounds']} trial-rounds)"
                if "full_trial_rounds" in c
                else ")"
            )
        )
    return lines


def cmd_trials(args: argparse.Namespace) -> int:
    """`fedray report DIR --trials`: every search's trials, as tuned.yaml records them."""
    import pandas as pd

    from fedray.sweeps.tuning import read_tuned

    cells = read_tuned(args.dir)
    if not cells:
        print(f"no tuning in {args.dir}/ (no tuned.yaml: fedray tune writes it)")
        return 1
    rows = [
        {
            "experiment": c["experiment"],
            "cell": c["cell"] or c["algorithm"],
            **{k: v for k, v in t["values"].items()},
            c["metric"]: t["value"],
            "rounds": t["rounds"],
            "ended": "diverged" if t.get("diverged") else "stopped" if t["stopped"] else "",
            "drawn": t.get("draws", 1),
            "chosen": "*" if t["runs"] == c["chosen_runs"] else "",
        }
        for c in cells
        for t in c.get("trial_list", [])
    ]
    from analysis.report import format_table

    print(format_table(pd.DataFrame(rows), args.format))
    if args.format in ("text", "markdown"):
        print(
            f"(each trial's {cells[0]['metric']} at {cells[0]['at']}, in the order drawn; rounds: the rounds it ran; "
            "ended: stopped at a rung, or diverged; drawn: how often the search drew it; *: chosen)"
        )
    if not args.no_plots:
        from analysis.plots import write_trial_plots

        if plots := write_trial_plots(args.dir, cells):
            print("plots: " + ", ".join(str(p) for p in plots))
    return 0


def add_parser(sub: Any, launch: Any) -> None:
    """``fedray tune``; ``launch(plan, ...)`` is `fedray.api.launch_tune` (the command line's, handed
    over so this module never imports the front door)."""
    p = sub.add_parser(
        "tune",
        help="search a config's settings on validation with Ray Tune (a sweep file: each cell, then its seeds on test)",
    )
    p.add_argument("config", help="a config or sweep YAML with a tune: block (docs/tuning.md)")
    add_config_args(
        p,
        "override a config key (e.g. --set rounds=10); repeatable",
        "a plug-in every trial imports first (docs/extending.md); repeatable",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="start the search over: its trials' runs, and a sweep file's runs on test, from the start",
    )
    p.add_argument("--dry-run", action="store_true", help="say what would be searched; run nothing")
    p.add_argument("--quiet", action="store_true", help="print the choices only")
    p.add_argument(
        "--address", help="Ray address to attach to (default: RAY_ADDRESS, else start a local Ray)"
    )
    p.add_argument(
        "--progress-every",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="print the search's progress table this often (default 30)",
    )
    p.set_defaults(func=cmd_tune, launch=launch)
