"""The `fedray` command: run, sweep, report, bench, fidelity (docs/fidelity.md), docs
(docs/algorithms.md) and reference (the authors' code side by side; jobs/reference/).

Config errors and missing data sets are reported before Ray is imported or started.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from fedray import progress
from fedray.config.coercion import count
from jobs.cli_args import add_config_args, config_sets

# the command's clock starts with its process: a run's done line says what it took "in all"
progress.command_started()

EXIT_USAGE = 2  # bad config, bad data path: the user's input
EXIT_FAILED = 1  # the run itself failed


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config", nargs="?", help="experiment YAML (default: the embedded default, digits + FedAvg)"
    )
    add_config_args(
        p,
        "override a config key, dotted for hp (e.g. --set hp.server_lr=0.5); repeatable",
        "a plug-in to import first: a .py file, a package folder or a module name (docs/extending.md); repeatable",
    )
    p.add_argument("--local", action="store_true", help="run in-process without Ray (debugging, tests)")
    p.add_argument(
        "--address", help="Ray address to attach to (default: RAY_ADDRESS, else start a local Ray)"
    )
    p.add_argument(
        "--force", action="store_true", help="re-run even if this run already finished in the output folder"
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="start an unfinished run over instead of going on from its latest checkpoint",
    )
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.add_argument(
        "--traceback",
        action="store_true",
        help="on a plug-in's mistake (an objective's loss not a scalar, a client state not plain data), print "
        "the traceback too, not only the line that says it (or set FEDRAY_TRACEBACK=1)",
    )


def _say(line: str) -> None:
    """A line about what fedray is doing before a run's own lines (starting a local Ray)."""
    print(line, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    from fedray.api import begin, prepare
    from fedray.config.keys import ConfigError
    from fedray.data import DatasetMissing, PartitionError
    from fedray.data.client_files import ClientFilesError
    from fedray.storage.files import DamagedResults
    from fedray.storage.results import run_status

    try:
        cfg = prepare(args.config, config_sets(args), args.plugins, output=args.output)
    except (ConfigError, DatasetMissing, PartitionError, ClientFilesError, OSError) as e:
        print(f"fedray: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        begun = begin(cfg, args.local, args.address, args.force, args.restart, _say)
    except (ConnectionError, ConfigError) as e:  # no Ray to resolve auto on; the data is not the run's
        print(f"fedray: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except DamagedResults:  # the run's record in its output folder, not Ray: `main` says which file
        raise
    except Exception as e:  # noqa: BLE001 - Ray's start, a plug-in shipped with the job: said, not a traceback
        where = "starting the run in this process" if args.local else "attaching to Ray"
        print(f"fedray: error: {where}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED
    cfg, events = begun.cfg, begun.events
    run_id = cfg.run_id()
    if begun.said and not args.quiet:
        print(begun.said, flush=True)
    if begun.state == "running":
        print(f"fedray: error: {begun.busy()}", file=sys.stderr)
        return EXIT_FAILED
    if events is None:
        print(f"run {run_id} already finished in {cfg.output}/ (use --force to run it again)")
        return 0

    t0 = time.perf_counter()
    try:
        for ev in events:
            for line, to_stderr in progress.run_lines(ev, cfg, args.quiet, t0):
                print(line, file=sys.stderr if to_stderr else sys.stdout, flush=True)
    except KeyboardInterrupt:
        events.close()  # frees the actors and records the run as interrupted
        from fedray.storage.checkpoint import Checkpoints

        try:
            latest = Checkpoints(cfg.output, run_id, cfg.keep_checkpoints).latest()
        except Exception:  # noqa: BLE001 - only what to tell the user depends on it
            latest = None
        if latest is None:  # stopped before its first checkpoint (Ray's start-up, the first rounds)
            print(
                f"fedray: interrupted before run {run_id} wrote a checkpoint; the same command (or job) run "
                "again starts it from the beginning",
                file=sys.stderr,
            )
        else:
            print(
                f"fedray: interrupted; the same command (or job) run again goes on from run {run_id}'s "
                f"checkpoint after round {latest.round} (in {cfg.output}/checkpoints/)",
                file=sys.stderr,
            )
        return 130
    except Exception as e:  # noqa: BLE001 - reported to the user with the real cause
        from fedray.federation import ClientError
        from fedray.storage.lock import RunLocked

        if isinstance(e, RunLocked):
            print(f"fedray: error: {e}", file=sys.stderr)
            return EXIT_FAILED
        if isinstance(e, ConnectionError):  # no Ray to run on: nothing of the run was started
            print(f"fedray: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        mistake = isinstance(e, ClientError) and e.mistake
        traceback_asked = getattr(args, "traceback", False) or os.environ.get("FEDRAY_TRACEBACK") == "1"
        if isinstance(e, ClientError) and e.remote_traceback and (traceback_asked or not mistake):
            print(e.remote_traceback.rstrip(), file=sys.stderr)
        if mistake:  # the plug-in's own mistake, said in one line that names it: no traceback
            print(f"fedray: run {run_id} failed: algorithm {cfg.algorithm}, {e}", file=sys.stderr)
        else:
            print(f"fedray: run {run_id} failed: {type(e).__name__}: {e}", file=sys.stderr)
        try:  # what its row says, as written: a row left "running" by a writer that could not end it is not
            recorded = run_status(cfg.output, run_id) == "failed"
        except Exception:  # noqa: BLE001 - unreadable: not recorded
            recorded = False
        if recorded:
            more = "; --traceback prints it here" if mistake and not traceback_asked else ""
            print(f"(status, error and its traceback recorded in {cfg.output}/runs/{more})", file=sys.stderr)
        else:
            notes = [n for n in getattr(e, "__notes__", []) if "could not be written" in n]
            print(
                notes[0] if notes else f"(the failure could not be recorded in {cfg.output}/runs/)",
                file=sys.stderr,
            )
        return EXIT_FAILED
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from fedray.api import open_sweep
    from fedray.config.coercion import ConfigError
    from fedray.data import DatasetMissing
    from fedray.sweeps.flow import SweepOptions

    try:  # every error before anything runs (max_concurrent_runs below 0 too: open_sweep checks it)
        options = SweepOptions(
            sets=tuple(config_sets(args)),
            output=args.output,
            only=tuple(args.only),
            plugins=tuple(args.plugins),
            force=args.force,
            restart=args.restart,
            dry_run=args.dry_run,
            max_concurrent_runs=args.max_concurrent_runs,
        )
        session = open_sweep(args.config, options, local=args.local, address=args.address, say=_say)
    except (ConfigError, DatasetMissing, OSError, ConnectionError) as e:
        print(f"fedray: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    with session:
        for line in progress.sweep_auto_lines(session):
            print(line)
        _print_plan(session, args.force)
        if args.dry_run or not session.todo:
            _print_dry_run(session)
            return 0
        return _execute_sweep(session, args)


def _print_plan(session, force: bool) -> None:
    sweep = session.sweep
    collapsed = f" ({sweep.collapsed} more identical to one of them, run once)" if sweep.collapsed else ""
    print(f"sweep {sweep.source}: {count(len(sweep.runs), 'run')}{collapsed}, results in {sweep.output}/")
    print(
        "  "
        + ", ".join(f"{n} {state}" for state, n in session.states().items())
        + f"; to run: {len(session.todo)}"
        + ("" if force else " (finished runs are skipped; --force runs them again)")
    )


def _print_dry_run(session) -> None:
    """Every run of the sweep, its state and what the sweep does with it, and its packs."""
    planned, todo = session.planned, session.todo
    width = max(len(p.run.run_id) for p in planned)
    print(f"  {'#':>3}  {'state':<11}  {'action':<6}  {'run id':<{width}}  settings")
    for p in planned:
        print(f"  {p.run.index:>3}  {p.state:<11}  {p.action:<6}  {p.run.run_id:<{width}}  {p.run.label}")
    # as the sweep would launch them: in-process, or where a launcher is connected already
    # (num_gpus_per_actor auto); else as they would pack on Ray where this node can hold a pack
    units, asked = session.units(ask=False)
    packs = [u for u in units if len(u) > 1]
    if packs:
        listed = "; ".join(" ".join(f"#{todo[i].index}" for i in u) for u in packs)
        where = "" if asked else " (on Ray: where this node can hold a pack)"
        print(f"  packed (pack_runs), each pack in one worker{where}: {listed}")
    for line in session.packs_declined(units) if asked else []:
        print(f"  {line}")


def _execute_sweep(session, args: argparse.Namespace) -> int:
    """The sweep's launch sequence (`fedray.api.SweepLaunch`, `fedray.sweep`'s too), printed."""
    from fedray.api import SweepLaunch

    launch = SweepLaunch(session, args.local, args.verbose)
    try:
        header = launch.header()
    except ConnectionError as e:
        print(f"fedray: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    for line in header:
        print(line, flush=True)
    try:
        for line in launch.run():
            if not args.quiet:
                print(line, flush=True)
    except KeyboardInterrupt:
        print(
            f"fedray: sweep interrupted; {launch.shown.in_flight} runs in flight were stopped, and go on from "
            "their latest checkpoints when the same sweep is submitted again",
            file=sys.stderr,
        )
        return 130
    try:  # runs another process is writing: waited for, so the count below is what was done
        launch.wait(lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print("fedray: stopped waiting for the runs another process is writing", file=sys.stderr)
        return 130
    for line in launch.summary():
        print(line)
    return 0 if launch.ok else EXIT_FAILED


def cmd_report(args: argparse.Namespace) -> int:
    import pandas as pd

    from analysis.plots import write_plots
    from analysis.report import (
        ReportError,
        better_for,
        describe_value,
        format_table,
        other_split,
        pivot,
        repeats_line,
        run_values,
        wide_tables,
    )

    if not os.path.isdir(args.dir):
        what = "is a file, not a folder" if os.path.exists(args.dir) else "does not exist"
        print(f"fedray: error: results folder {args.dir!r} {what}", file=sys.stderr)
        return EXIT_USAGE
    if (inside := _results_folder_above(args.dir)) is not None:
        print(
            f"fedray: error: {args.dir!r} is the {os.path.basename(os.path.normpath(args.dir))}/ folder of a results "
            f"folder: give the results folder, the one with runs/ and metrics/ in it (fedray report {inside})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.trials:
        from jobs.tune_cli import cmd_trials

        return cmd_trials(args)
    if args.tuned_by and not args.tuned:
        print("fedray: error: --tuned-by chooses the setting of a --tuned cell: add --tuned", file=sys.stderr)
        return EXIT_USAGE
    rows, cols = _fields(args.rows), _fields(args.cols)
    at = "final" if args.at is None else args.at
    try:
        # which way each reading that picks a best improves (a loss's best is its lowest), before
        # anything is read
        reading_best = at == "best" and args.round is None
        way = "higher"
        if reading_best or (args.tuned and not args.tuned_by):
            way = better_for(args.metric, args.better, "--at best" if reading_best else "--tuned")
        pick_way = way
        if args.tuned_by:
            pick_way = better_for(args.tuned_by, None, "--tuned-by")
        values = run_values(
            args.dir, args.metric, at, args.round, args.stage, include_unfinished=True, better=way
        )
        statuses = values["status"].value_counts()
        if not args.all:
            values = values[values["status"] == "finished"]
        picks, chose_on = None, "test"
        if args.tuned_by:
            picks = run_values(
                args.dir, args.tuned_by, at, args.round, args.stage, include_unfinished=True, better=pick_way
            )
            chose_on = "validation" if args.tuned_by.startswith("val_") else "test"
        elif args.tuned:  # where runs evaluated on validation at the same settings: chosen by theirs
            from jobs.tune_cli import validation_picks

            picks = validation_picks(args, values, at, pick_way)
            chose_on = "test" if picks is None else "validation"
        cells = pivot(values, rows, cols, tuned=args.tuned, tuned_by=picks, better=pick_way)
        tables = wide_tables(cells, rows, args.metric)
        if args.format == "csv" and len(tables) > 1:  # one parseable table, experiment as a column
            tables = {"": pd.concat([t.assign(experiment=e) for e, t in tables.items()])}
            tables[""] = tables[""][["experiment", *[c for c in tables[""].columns if c != "experiment"]]]
        texts = {exp: format_table(t, args.format) for exp, t in tables.items()}
    except ReportError as e:
        print(f"fedray: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if not texts:
        print(_nothing_to_report(args, statuses, values))
        from jobs.tune_cli import tuned_lines

        for line in tuned_lines(args.dir):  # a folder of a search alone: what it chose
            print(line)
        return 1  # nothing to report: a script reading the table can tell
    prose = args.format in ("text", "markdown")
    heading = {"text": "", "markdown": "# ", "latex": "% "}.get(args.format)
    for exp, text in texts.items():
        if heading is not None and (prose or len(texts) > 1):
            print(f"{heading}experiment: {exp}")
        print(text)
        if prose:
            print()
    from jobs.tune_cli import tuned_lines

    for line in tuned_lines(args.dir) if args.format != "csv" else []:  # the cells' chosen values
        print(line if prose else f"% {line}")
    if not prose and (said := repeats_line(cells.attrs.get("repeats", []))):  # beside a table to parse
        print(
            f"fedray: {said}" if args.format == "csv" else f"% {said}",
            file=sys.stderr if args.format == "csv" else sys.stdout,
        )
    if prose:
        print(describe_value(args.metric, at, args.round, args.stage, way))
        if args.stage is not None and not values["in_stage"].all():
            algs = sorted({c["algorithm"] for c in values.loc[~values["in_stage"], "config"]})
            print(f"(runs without stage {args.stage!r}, here {', '.join(algs)}: read at their final round)")
        chosen = cells[cells["setting"] != ""]
        if args.tuned:
            on = f" of {args.tuned_by}" if args.tuned_by else ""
            if chose_on == "validation" and not args.tuned_by:
                on = f" of val_{args.metric}, read on the runs of the same settings that evaluated on validation"
            mean = "highest" if pick_way == "higher" else "lowest"
            print(
                f"tuned: each cell is its column's best hp (and lr) setting ({mean} mean{on} over seeds, of the settings run with the most seeds), here:"
                if len(chosen)
                else "tuned: no cell had hp settings to choose from"
            )
            if len(chosen):
                print(
                    "  chosen on validation"
                    if chose_on == "validation"
                    else "  chosen on test: optimistic, as no run evaluated on validation here (docs/tuning.md: "
                    "validation_fraction, and evaluate_on: validation or fedray tune)"
                )
            for _, c in chosen.iterrows():
                where = " ".join(str(c[f]) for f in rows)
                print(f"  {c['experiment']}: {where} {c['col']}: {c['setting']}")
        if left := values.attrs.get("left_out", 0):
            _, other, reads = other_split(args.metric)
            trials = " (tuning's trials)" if other == "validation" else ""
            print(
                f"({count(left, 'run')} evaluated on {other}{trials} {'are' if left > 1 else 'is'} not in this "
                f"table{f': --metric {reads} reads them' if reads else ''})"
            )
        if said := repeats_line(cells.attrs.get("repeats", [])):
            print(said)
        missing = int(values["value"].isna().sum())
        if missing:
            print(
                f"({missing} run{'s have' if missing > 1 else ' has'} no value there: shown as fewer seeds or -)"
            )
        others = {str(k): int(n) for k, n in statuses.items() if k != "finished"}
        line = f"runs: {int(statuses.get('finished', 0))} finished"
        if others:
            line += ", " + ", ".join(f"{n} {k}" for k, n in sorted(others.items()))
            line += " (included)" if args.all else " (not in the table; --all includes them)"
        print(line)
        from fedray.storage.loggers import logger_places

        for place in logger_places(args.dir):  # where the live loggers wrote (docs/loggers.md)
            print(place)
    if not args.no_plots:
        plots = write_plots(args.dir, args.metric, rows, cols, args.stage, include_unfinished=args.all)
        if plots and prose:
            print("plots: " + ", ".join(str(p) for p in plots))
        elif not plots and prose:
            print("(no plots: install matplotlib, e.g. pip install 'fedray[plot]')")
    return 0


# The folders a results folder holds (docs/output.md): one of them given for the results folder is
# a slip `fedray report` names
_RESULTS_TABLES = (
    "runs",
    "metrics",
    "clients",
    "assignments",
    "partitions",
    "configs",
    "checkpoints",
    "plots",
)


def _results_folder_above(folder: str) -> str | None:
    """The results folder ``folder`` is one of the tables of (``DIR/metrics`` given for ``DIR``),
    where it is one: its name is a table's, it has no runs/ of its own, and the folder above has a
    runs/ (or it holds a table's Parquet files itself); else None."""
    from pathlib import Path

    here = Path(folder)
    if here.resolve().name not in _RESULTS_TABLES or (here / "runs").is_dir():
        return None
    above = here.resolve().parent
    if (above / "runs").is_dir() or any(here.glob("*.parquet")):
        return os.path.normpath(os.path.join(folder, os.pardir))
    return None


def _nothing_to_report(args: argparse.Namespace, statuses: Any, values: Any) -> str:
    """The line `fedray report` prints where it has no table: what the folder lacks, and what would
    show what it has (runs not finished, runs of the other split, or that it is no results folder)."""
    from pathlib import Path

    from analysis.report import other_split

    where = f"{args.dir.rstrip('/')}/"
    if not (Path(args.dir) / "runs").is_dir():
        return (
            f"no runs in {where}: a results folder holds runs/ (a row per run) and metrics/ (their values "
            "round by round), as fedray run --output DIR and fedray sweep write it; give that folder"
        )
    unfinished = int(len(statuses) and statuses.sum() - statuses.get("finished", 0))
    hints = [f"{unfinished} not finished: --all includes them"] if unfinished and not args.all else []
    split, other, reads = other_split(args.metric)
    left = values.attrs.get("left_out", 0) if args.all else values.attrs.get("left_out_finished", 0)
    if left:  # every run there evaluated on the other split: another metric reads them
        them = "it" if left == 1 else "them"
        trials = " (tuning's trials)" if other == "validation" else ""
        reading = f": --metric {reads} reads {them}" if reads else f", not read by a table of {args.metric}"
        hints.append(f"{count(left, 'run')} evaluated on {other}{trials}{reading}")
        if split == "validation":
            hints.append("val_* metrics are recorded by runs with evaluate_on: validation (docs/tuning.md)")
    kind = f" evaluated on {split}" if left else ""
    hint = f" ({'; '.join(hints)})" if hints else ""
    return f"no {'' if args.all else 'finished '}runs{kind} in {where}{hint}"


def cmd_fidelity(args: argparse.Namespace) -> int:
    from pathlib import Path

    import yaml

    from analysis.fidelity import FidelityError, render
    from analysis.load import archive

    try:
        spec = yaml.safe_load(Path(args.spec).read_text())
        out = Path(args.output or spec.get("output", "docs/fidelity.md"))
        for src in args.archive:
            dst = Path(args.root or spec.get("root", ".")) / Path(src).name
            print(f"archived {len(archive(src, dst))} finished or diverged runs of {src} in {dst}")
        previous = out.read_text() if args.keep_missing and out.exists() else None
        text = render(spec, args.root, out.parent, previous)
    except (OSError, yaml.YAMLError, FidelityError) as e:
        print(f"fedray: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    from pathlib import Path

    from jobs.docs import PAGE, DocsError, render_page

    path = Path(args.output) if args.output else PAGE
    try:
        current = path.read_text()
        text = render_page(current)
    except (OSError, DocsError) as e:
        print(f"fedray: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.check:
        if text != current:
            print(f"fedray: {path} is stale: run `fedray docs`", file=sys.stderr)
            return EXIT_FAILED
        print(f"{path} is up to date")
        return 0
    if text == current:
        print(f"{path} is up to date")
        return 0
    path.write_text(text)
    print(f"wrote {path}")
    return 0


def _fields(text: str) -> list[str]:
    return [f.strip() for f in text.split(",") if f.strip()]


def cmd_bench(args: argparse.Namespace) -> int:
    from jobs.bench.headline import main as bench_main

    return bench_main(args.bench_args)


def _launch_tune(plan: Any, **kwargs: Any) -> Any:
    """`fedray tune`'s launch sequence: `fedray.tune`'s (fedray.api.launch_tune)."""
    from fedray.api import launch_tune

    return launch_tune(plan, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedray",
        description="Federated learning under heterogeneous data, on Ray.",
        epilog="maintainers' commands (fedray's own pages and its runs beside the authors' code): "
        "fidelity (docs/fidelity.md), docs (docs/algorithms.md), reference (docs/reference.md); "
        "`fedray COMMAND --help` for each",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,sweep,tune,report,bench}")
    p_run = sub.add_parser("run", help="run one experiment")
    _add_run_args(p_run)
    p_run.set_defaults(func=cmd_run)
    p_sw = sub.add_parser(
        "sweep", help="run every run of a sweep file (grid x cases x seeds), several at once"
    )
    p_sw.add_argument("config", help="sweep YAML: an experiment config plus grid:, seeds:, cases:")
    add_config_args(
        p_sw,
        "override a config key in every run (e.g. --set rounds=5); repeatable",
        "a plug-in every run imports first (docs/extending.md); repeatable",
    )
    p_sw.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="run only the runs whose config has this value (e.g. --only algorithm=fedavg); repeatable",
    )
    p_sw.add_argument(
        "--dry-run", action="store_true", help="list the runs, their state and what would run; run nothing"
    )
    p_sw.add_argument("--force", action="store_true", help="run finished runs again too (from the start)")
    p_sw.add_argument(
        "--restart",
        action="store_true",
        help="start unfinished runs over instead of going on from their latest checkpoints",
    )
    p_sw.add_argument(
        "--max-concurrent-runs",
        type=int,
        metavar="N",
        help="runs at once (default: the file's max_concurrent_runs; 0 = as many as the resources allow)",
    )
    p_sw.add_argument("--local", action="store_true", help="run in-process without Ray, one run at a time")
    p_sw.add_argument(
        "--address", help="Ray address to attach to (default: RAY_ADDRESS, else start a local Ray)"
    )
    shown = p_sw.add_mutually_exclusive_group()
    shown.add_argument(
        "--verbose", action="store_true", help="print every round of every run, prefixed with #run"
    )
    shown.add_argument(
        "--quiet",
        action="store_true",
        help="print the plan and the summary, not a line as each run starts and ends",
    )
    p_sw.set_defaults(func=cmd_sweep)
    from jobs.tune_cli import add_parser as add_tune

    add_tune(sub, launch=_launch_tune)
    p_rep = sub.add_parser(
        "report", help="paper-style table (mean ± std over seeds) and plots from a results folder"
    )
    p_rep.add_argument("dir")
    p_rep.add_argument(
        "--metric",
        default="accuracy",
        help="global metric to report (default accuracy; e.g. local_accuracy, loss)",
    )
    p_rep.add_argument("--stage", help="read within this stage (e.g. classifier); --round counts its rounds")
    when = p_rep.add_mutually_exclusive_group()
    when.add_argument(
        "--round", type=int, metavar="R", help="the value at round R (within --stage S when given)"
    )
    when.add_argument(
        "--at",
        metavar="WHERE",
        help="final (default), best-train (the round of best train_accuracy: FedRC's protocol), best, "
        "or mean_last:K (the mean of the last K evaluations); a search's at: reads final, best and mean_last alike",
    )
    p_rep.add_argument(
        "--rows", default="dataset,partition", help="fields for rows (default dataset,partition)"
    )
    p_rep.add_argument("--cols", default="algorithm", help="fields for columns (default algorithm)")
    p_rep.add_argument("--format", choices=("text", "markdown", "csv", "latex"), default="text")
    p_rep.add_argument(
        "--tuned",
        action="store_true",
        help="runs that differ only in hp (or lr) share a cell, which shows the best setting of those run with "
        "the most seeds (listed below the table)",
    )
    p_rep.add_argument(
        "--tuned-by",
        metavar="METRIC",
        help="with --tuned: choose each cell's setting by this metric, read as --at/--round/--stage say (e.g. "
        "--metric purity --tuned --tuned-by accuracy: purity at the lr accuracy picks)",
    )
    p_rep.add_argument(
        "--better",
        choices=("higher", "lower"),
        help="which way --metric improves, for --at best and --tuned (default: from its name: accuracies "
        "and purity higher; losses, seconds, bytes lower; other metrics must say)",
    )
    p_rep.add_argument(
        "--trials",
        action="store_true",
        help="list every search's trials (fedray tune): their values, validation metric, rounds run; and plot "
        "their validation curves",
    )
    p_rep.add_argument("--all", action="store_true", help="include failed and unfinished runs")
    p_rep.add_argument("--no-plots", action="store_true", help="only print the table")
    p_rep.set_defaults(func=cmd_report)
    p_bench = sub.add_parser(
        "bench", help="time fedray against plain PyTorch loops (see jobs/bench/headline.py)"
    )
    p_bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    p_bench.set_defaults(func=cmd_bench)
    p_fid = sub.add_parser(
        "fidelity", description="write docs/fidelity.md: fedray next to the authors' code, from results"
    )
    p_fid.add_argument("spec", help="the page's spec (docs/fidelity.yaml)")
    p_fid.add_argument(
        "--root", help="folder the spec's relative results folders are in (default: its root:)"
    )
    p_fid.add_argument("-o", "--output", help="the page (default: the spec's output:, else docs/fidelity.md)")
    p_fid.add_argument(
        "--archive",
        action="append",
        default=[],
        metavar="DIR",
        help="first copy results folder DIR's finished and diverged runs (tables and configs, no checkpoints) "
        "into ROOT/NAME, NAME being DIR's name; repeatable",
    )
    p_fid.add_argument(
        "--keep-missing",
        action="store_true",
        help="a section whose results folder is not here is kept as the page has it (marked so), "
        "instead of an error",
    )
    p_fid.set_defaults(func=cmd_fidelity)
    p_docs = sub.add_parser(
        "docs", description="write docs/algorithms.md's tables from the algorithm registry (jobs/docs.py)"
    )
    p_docs.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page is stale")
    p_docs.add_argument("-o", "--output", help="the page (default: docs/algorithms.md)")
    p_docs.set_defaults(func=cmd_docs)
    from jobs.reference.cli import add_parser as add_reference

    add_reference(
        sub, run_sweep=lambda path, local=False: main(["sweep", str(path), *(["--local"] if local else [])])
    )
    return parser


def _stop_on_sigterm() -> None:
    """SIGTERM (``ray job stop``, a scheduler's kill) stops a run as Ctrl-C does: recorded as
    interrupted, its actors freed, its checkpoint kept."""

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread (main() called from a test's thread)
        pass


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # every option after it is the benchmark's own (jobs/bench/headline.py --help)
        from jobs.bench.headline import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    _stop_on_sigterm()
    try:
        return args.func(args)
    except (
        KeyboardInterrupt
    ) as e:  # Ctrl-C or SIGTERM where the command does not say more itself (its imports)
        how = "SIGTERM" if str(e) == f"signal {signal.SIGTERM}" else "Ctrl-C"
        print(f"fedray: stopped ({how}); the same command run again goes on where it was", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `fedray sweep --dry-run | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except OSError as e:
        from fedray.storage.files import DamagedResults

        if not isinstance(e, DamagedResults):
            raise
        print(f"fedray: error: {e}", file=sys.stderr)  # a results file that fails its checksums
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
