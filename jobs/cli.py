"""The `fedray` command: run, report, bench (DESIGN §5).

Config errors and missing data sets are reported before Ray is imported or started.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

EXIT_USAGE = 2  # bad config, bad data path: the user's input
EXIT_FAILED = 1  # the run itself failed


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config", nargs="?", help="experiment YAML (default: the embedded default, digits + FedAvg)"
    )
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, dotted for hp (e.g. --set hp.server_lr=0.5); repeatable")  # fmt: skip
    p.add_argument("--output", help="results folder (config key output)")
    p.add_argument("--local", action="store_true", help="run in-process without Ray (debugging, tests)")
    p.add_argument(
        "--address", help="Ray address to attach to (default: RAY_ADDRESS, else start a local Ray)"
    )
    p.add_argument(
        "--force", action="store_true", help="re-run even if this run already finished in the output folder"
    )
    p.add_argument("--quiet", action="store_true", help="print only the summary")


def _fmt_round(ev) -> str:
    m = ev.metrics
    parts = [f"round {ev.round:>{len(str(ev.rounds))}}/{ev.rounds}"]
    for key, label, fmt in (("accuracy", "acc", "{:.4f}"), ("loss", "loss", "{:.4f}"), ("local_accuracy", "local_acc", "{:.4f}"),
                            ("train_accuracy", "train_acc", "{:.4f}"), ("train_loss", "train_loss", "{:.4f}")):  # fmt: skip
        if key in m:
            parts.append(f"{label} {fmt.format(m[key])}")
    parts.append(f"{ev.seconds:.2f}s")
    return "  ".join(parts)


def cmd_run(args: argparse.Namespace) -> int:
    from fedray.config import ConfigError, load_config
    from fedray.data import DatasetMissing, check_available
    from fedray.results import run_status

    try:
        cfg = load_config(args.config, args.sets, output=args.output)
        check_available(cfg)
    except (ConfigError, DatasetMissing) as e:
        print(f"fedray: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    run_id = cfg.run_id()
    if not args.force and run_status(cfg.output, run_id) == "finished":
        print(f"run {run_id} already finished in {cfg.output}/ (use --force to run it again)")
        return 0

    from fedray.experiment import Finished, RoundDone, Started

    t0 = time.perf_counter()
    if args.local:
        from fedray.experiment import execute
        from fedray.federation import make_local_federation

        events = execute(cfg, make_local_federation)
    else:
        from actors.driver import run_on_ray

        events = run_on_ray(cfg, args.address)
    try:
        for ev in events:
            if isinstance(ev, Started):
                pl = ev.placement
                where = (
                    "in-process"
                    if pl.get("mode") == "local"
                    else f"{pl.get('actors')} actors on {pl.get('nodes')} node(s) {pl.get('devices')}"
                )
                print(
                    f"run {ev.run_id}: {cfg.algorithm} on {cfg.dataset} ({cfg.partition}), {ev.num_clients} clients, {where}",
                    flush=True,
                )
            elif isinstance(ev, RoundDone) and not args.quiet:
                print(_fmt_round(ev), flush=True)
            elif isinstance(ev, Finished):
                s = ev.summary
                acc = (
                    f"final accuracy {s['final_accuracy']:.4f} (best {s['best_accuracy']:.4f} at round {s['best_round']})"
                    if "final_accuracy" in s
                    else "no accuracy recorded"
                )
                print(f"done: {acc}; {s['rounds_done']} rounds, {s.get('steady_round_seconds', 0):.2f} s/round, "
                      f"{time.perf_counter() - t0:.1f} s in all; results in {cfg.output}/", flush=True)  # fmt: skip
    except KeyboardInterrupt:
        print("fedray: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - reported to the user with the real cause
        from fedray.federation import ClientError

        if isinstance(e, ClientError) and e.remote_traceback:
            print(e.remote_traceback.rstrip(), file=sys.stderr)
        print(f"fedray: run {run_id} failed: {type(e).__name__}: {e}", file=sys.stderr)
        print(f"(status and error recorded in {cfg.output}/runs/)", file=sys.stderr)
        return EXIT_FAILED
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    import pandas as pd

    from analysis.plots import write_plots
    from analysis.report import report_table

    if not os.path.isdir(args.dir):
        print(f"fedray: error: results folder {args.dir!r} does not exist", file=sys.stderr)
        return EXIT_USAGE
    table = report_table(args.dir, metric=args.metric)
    if table.empty:
        print(f"no runs in {args.dir}/")
        return 0
    with pd.option_context("display.max_rows", None, "display.max_columns", None, "display.width", 200):
        print(table.to_string(index=False))
    if not args.no_plots:
        plots = write_plots(args.dir, metric=args.metric)
        if plots:
            print("plots: " + ", ".join(str(p) for p in plots))
        else:
            print("(no plots: install matplotlib, e.g. pip install 'fedray[plot]')")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from jobs.bench import main as bench_main

    return bench_main(args.bench_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedray", description="Federated learning under heterogeneous data, on Ray."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run one experiment")
    _add_run_args(p_run)
    p_run.set_defaults(func=cmd_run)
    p_rep = sub.add_parser(
        "report", help="print final accuracy per run (mean ± std over seeds) from a results folder"
    )
    p_rep.add_argument("dir")
    p_rep.add_argument("--metric", default="accuracy", help="global metric to report (default accuracy)")
    p_rep.add_argument("--no-plots", action="store_true", help="only print the table")
    p_rep.set_defaults(func=cmd_report)
    p_bench = sub.add_parser("bench", help="time fedray against plain PyTorch loops (see jobs/bench.py)")
    p_bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    p_bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
