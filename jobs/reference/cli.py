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
reference's trained weights bit for bit as they were.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

EXIT_USAGE, EXIT_FAILED = 2, 1


def add_parser(sub: argparse._SubParsersAction, run_sweep: Callable[[Path, bool], int]) -> None:
    """The ``reference`` command; ``run_sweep(path, local)`` runs a sweep file as `fedray sweep` does
    (with ``--local`` where ``local``; the CLI hands its own, so this module does not import the CLI
    back)."""
    p = sub.add_parser(
        "reference", help="run a sweep on the authors' code and in fedray, on the same clients"
    )
    p.add_argument(
        "name",
        help="the reference: fedconcat (sjtudyq/FedConcat), niid-bench (Xtra-Computing/NIID-Bench), fedrepo "
        "(lxcnju/FedRepo's FedRS, on the partitions a NIID-Bench-family reference drew into --output), fl-bench "
        "(KarhouTam/FL-bench's FedLC, on such partitions too), or fedrc "
        "(LINs-lab/FedRC: its FMNIST-C clients as client_files)",
    )
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
    p.add_argument(
        "--partitions-only", action="store_true", help="draw the reference's partitions, run nothing"
    )
    p.add_argument("--reference-only", action="store_true", help="run the reference side only")
    p.add_argument(
        "--fedray-only", action="store_true", help="run the fedray side only (partitions must exist)"
    )
    p.add_argument("--local", action="store_true",
                   help="run the fedray side in this process, one run at a time (as `fedray sweep --local`): "
                        "Ray's workers run niced, so on a machine busy with other work they wait")  # fmt: skip
    p.add_argument("--force", action="store_true", help="run reference runs that were imported already again")
    p.add_argument("--keep-logging-evals", action="store_true",
                   help="run the script's logging-only evaluations instead of replaying their random draws")  # fmt: skip
    p.add_argument("--state-dict", choices=("copies", "views"), default="copies",
                   help="copies: GPU semantics for the script's initial cluster models (default); views: the CPU's")  # fmt: skip
    p.add_argument(
        "--seed", type=int, default=0, help="fedrc: the seed of the generator's draw and of the 90/10 splits"
    )
    p.add_argument("--python", help="fedrc: the Python of an environment with the reference's dependencies")
    p.add_argument("--clients", type=int, default=300, metavar="N",
                   help="fedrc: keep N of the generator's 300 clients, each role in proportion (default 300)")  # fmt: skip
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="fedrc: the reference's device (cuda: GPU 0; default cpu)")  # fmt: skip
    p.add_argument("--check", action="store_true",
                   help="show on a tiny run that the wrapper's shortcuts change no weight; then exit")  # fmt: skip
    p.set_defaults(func=cmd_reference, run_sweep=run_sweep)


def _wrapper_flags(args: argparse.Namespace, options: tuple[str, ...]) -> list[str]:
    """The options the reference's wrapper takes, as asked."""
    flags = ["--state-dict", args.state_dict] if "state_dict" in options else []
    if args.keep_logging_evals and "keep_logging_evals" in options:
        flags.append("--keep-logging-evals")
    return flags


def references() -> dict:
    from jobs.reference.fedrepo import FEDREPO
    from jobs.reference.flbench import FLBENCH
    from jobs.reference.niid_bench import REFERENCES

    return {**REFERENCES, FEDREPO.name: FEDREPO, FLBENCH.name: FLBENCH}


def cmd_reference(args: argparse.Namespace) -> int:
    from fedray.config import ConfigError
    from fedray.data import DatasetMissing
    from fedray.sweep import load_sweep
    from jobs.reference.harness import ReferenceError, check_checkout, run_reference, write_fedray_side

    known = references()
    if args.name == "fedrc":  # clients from the reference's own generator (client_files)
        return cmd_fedrc_data(args)
    if args.name not in known:
        print(
            f"fedray: error: unknown reference {args.name!r} (known: {', '.join([*known, 'fedrc'])})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    ref = known[args.name]
    out = Path(args.output).resolve()
    unsupported = [flag for flag, asked, ok in (
        ("--check", args.check, "keep_logging_evals" in ref.options),
        ("--keep-logging-evals", args.keep_logging_evals, "keep_logging_evals" in ref.options),
        ("--partitions-only", args.partitions_only, ref.draws_partitions),
    ) if asked and not ok]  # fmt: skip
    if unsupported:
        why = (
            "it draws no partitions and skips no computation"
            if not ref.draws_partitions
            else "its wrapper has none"
        )
        print(f"fedray: error: {args.name}: {unsupported[0]} does not apply ({why})", file=sys.stderr)
        return EXIT_USAGE
    if args.check:
        try:
            return check_wrapper(ref, args.checkout.resolve(), out)
        except ReferenceError as e:
            print(f"fedray: error: {e}", file=sys.stderr)
            return EXIT_USAGE
    if not args.config:
        print("fedray: error: give a sweep or run config (or --check)", file=sys.stderr)
        return EXIT_USAGE
    try:
        sweep = load_sweep(args.config, args.sets, output=str(out), only=args.only)
        runs = [r.config for r in sweep.runs]
        if not args.fedray_only:
            check_checkout(ref, args.checkout.resolve())
    except (ConfigError, DatasetMissing) as e:
        print(f"fedray: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    failed = 0
    if not args.fedray_only:
        extra = _wrapper_flags(args, ref.options)
        if args.partitions_only:
            extra.append("--partition-only")
        try:
            _, failed = run_reference(ref, runs, args.checkout.resolve(), out, args.jobs, args.threads, extra,
                                      force=args.force or args.partitions_only, partitions_only=args.partitions_only)  # fmt: skip
        except ReferenceError as e:
            print(f"fedray: error: {e}", file=sys.stderr)
            return EXIT_USAGE
    side = write_fedray_side(args.name, runs, out, ref.repo)
    print(f"fedray side: {side}", flush=True)
    if args.reference_only or args.partitions_only:
        print(f"run it with: fedray sweep {side}{' --local' if args.local else ''}")
        return EXIT_FAILED if failed else 0
    rc = args.run_sweep(side, args.local)
    print(f"side by side: fedray report {out} --cols source,algorithm")
    return rc or (EXIT_FAILED if failed else 0)


def cmd_fedrc_data(args: argparse.Namespace) -> int:
    """`fedray reference fedrc [CONFIG]`: LINs-lab/FedRC's FMNIST-C clients, from its own generator,
    as a client_files folder (DIR/clients); with a sweep CONFIG, its runs on the reference's
    run_experiment.py and in fedray, both on those clients, into DIR."""
    from fedray.config import ConfigError
    from fedray.sweep import load_sweep
    from jobs.reference import fedrc
    from jobs.reference.harness import write_fedray_side

    out = Path(args.output).resolve()
    python = args.python or sys.executable
    try:
        if args.config and not args.fedray_only:
            fedrc.check_checkout(args.checkout.resolve())
        clients = fedrc.main(args.checkout.resolve(), out, args.seed, python, args.clients)
        print(f"clients: {clients} (dataset: client_files, data_root: {clients})", flush=True)
        if not args.config:
            return 0
        sets = [*args.sets, f"data_root={clients}", f"num_clients={args.clients}"]
        runs = [r.config for r in load_sweep(args.config, sets, output=str(out), only=args.only).runs]
        for cfg in runs:
            fedrc.script_args(cfg, "")
    except ConfigError as e:  # ReferenceError is one
        print(f"fedray: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    failed = 0
    if not args.fedray_only:
        failed = fedrc.run_reference(runs, args.checkout.resolve(), out, python, args.threads, jobs=args.jobs,
                                     device=args.device)  # fmt: skip
    side = write_fedray_side("fedrc", runs, out, fedrc.REPO, place=lambda cfg, _: cfg,
                             where=f"each on the clients in {clients}")  # fmt: skip
    if args.reference_only:
        print(f"fedray side: fedray sweep {side}{' --local' if args.local else ''}")
        return EXIT_FAILED if failed else 0
    rc = args.run_sweep(side, args.local)
    print(f"side by side: fedray report {out} --cols source,algorithm --metric accuracy --at best-train")
    return rc or (EXIT_FAILED if failed else 0)


# The tiny runs `--check` compares (FMNIST, #C=2, 10 clients, one round of one epoch; FedConcat
# one encoder and one classifier round).
CHECK_ARGS = {
    "fedavg": ["--alg", "fedavg", "--comm_round", "2"],
    "fedconcat": [
        "--alg",
        "fedconcat",
        "--n_clusters",
        "3",
        "--encoder_round",
        "1",
        "--classifier_round",
        "1",
    ],
}
CHECK_COMMON = ["--dataset", "fmnist", "--model", "simple-cnn", "--partition", "noniid-#label2", "--n_parties", "10",
                "--epochs", "1", "--batch-size", "64", "--lr", "0.01", "--rho", "0.9", "--reg", "1e-5",
                "--sample", "1", "--init_seed", "0", "--device", "cpu", "--log_file_name", "log"]  # fmt: skip


def check_wrapper(ref, checkout: Path, out: Path) -> int:
    """Run tiny configs with and without the wrapper's shortcuts and compare the per-round model
    hashes: the shortcuts (skipped logging-only evaluations with their draws replayed, samples
    loaded without PIL) must leave them equal. Also shows what the state-dict copies change."""
    import subprocess

    from jobs.reference.harness import check_checkout

    check_checkout(ref, checkout)
    datadir = ref.prepare_data(out)
    root = Path(__file__).resolve().parents[2]

    def run(name: str, alg: str, flags: list[str]) -> dict:
        result = out / "reference" / "check" / f"{name}.json"
        logdir = result.parent / name
        cmd = [sys.executable, "-m", ref.wrapper, "--checkout", str(checkout), "--result", str(result),
               "--workdir", str(logdir), "--threads", "1", *flags, "--", ref.script, *CHECK_COMMON,
               "--datadir", str(datadir), "--logdir", str(logdir), *CHECK_ARGS[alg]]  # fmt: skip
        subprocess.run(cmd, check=True, cwd=str(root), capture_output=True)
        return json.loads(result.read_text())

    ok = True
    for alg in (a for a in CHECK_ARGS if a in ref.algorithms):
        plain = run(f"{alg}-as-is", alg, ["--keep-logging-evals", "--slow-data"])
        fast = run(f"{alg}-shortcuts", alg, [])
        same = [
            a["model_sha256"] == b["model_sha256"] for a, b in zip(plain["evals"], fast["evals"], strict=True)
        ]
        print(f"{alg}: as the script runs ({plain['total_seconds']:.0f} s) vs with the shortcuts "
              f"({fast['total_seconds']:.0f} s, {fast['skipped_logging_evals']} evaluations skipped): "
              f"weights after each evaluated round {'identical' if all(same) else 'DIFFERENT'} "
              f"({sum(same)}/{len(same)}); accuracies {[e['accuracy'] for e in plain['evals']]} vs "
              f"{[e['accuracy'] for e in fast['evals']]}")  # fmt: skip
        ok &= all(same)
        if alg == "fedconcat":
            views = run(f"{alg}-views", alg, ["--state-dict", "views"])
            differ = views["evals"][-1]["model_sha256"] != fast["evals"][-1]["model_sha256"]
            print(f"{alg}: cluster models initialised from views of client 0's weights (the script on a CPU) "
                  f"{'differ from' if differ else 'equal'} copies (the script on a GPU): accuracy "
                  f"{views['evals'][-1]['accuracy']} vs {fast['evals'][-1]['accuracy']}")  # fmt: skip
    return 0 if ok else EXIT_FAILED
