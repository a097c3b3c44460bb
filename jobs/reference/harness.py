"""The generic half of a reference harness: plan a sweep's runs on a reference, run them (a
subprocess each, several at once), keep the reference's partitions, import its numbers into a fedray
results folder, and write the fedray side of the comparison as a sweep on those partitions.

Layout under the results folder DIR::

    DIR/reference/partitions/DATASET-PARTITION-nN-sSEED.json   the reference's clients (partition: file)
    DIR/reference/results/RUN_ID.json                          what the wrapper recorded, per reference run
    DIR/reference/logs/RUN_ID/                                 the reference script's own logs
    DIR/reference/NAME-fedray.yaml                             the fedray side: the sweep on those partitions
    DIR/metrics, runs, ...                                     both sides, the reference's with source = its repository
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import yaml

from fedray.config.keys import NOT_IN_RUN_ID, Config, partition_file_for
from fedray.data import partition_file
from fedray.records import rec
from fedray.storage.files import write_text_atomic
from fedray.storage.results import run_status
from fedray.storage.writer import ResultsWriter
from jobs.reference.record import Reference, ReferenceError

T = TypeVar("T")


def partition_label(cfg: Config) -> str:
    """The partition as papers write it (#C=2, Dir(0.1)), for reports of file partitions."""
    if cfg.partition == "labels":
        return f"#C={cfg.partition_k}"
    if cfg.partition == "dirichlet":
        return f"Dir({cfg.partition_beta:g})"
    if cfg.partition == "quantity":
        return f"quantity({cfg.partition_beta:g})"
    return cfg.partition


def partition_template(out: Path, cfg: Config) -> str:
    """Where the reference's partition of this run's setting lies, with {seed} for the seed."""
    slug = partition_label(cfg).replace("#C=", "labels").replace("(", "").replace(")", "").replace("=", "")
    return str(out / "reference" / "partitions" / f"{cfg.dataset}-{slug}-n{cfg.num_clients}-s{{seed}}.json")


def on_reference_partition(cfg: Config, out: Path) -> Config:
    """The fedray side of a comparison: the run on the reference's partition (same seed)."""
    return replace(
        cfg,
        partition="file",
        partition_file=partition_template(out, cfg),
        partition_name=partition_label(cfg),
    )


def reference_config(cfg: Config, ref: Reference, out: Path) -> dict[str, Any]:
    """The imported run's config: the fedray side's, with the reference as its source (so the
    report puts both in one row and tells them apart by `source`)."""
    side = on_reference_partition(cfg, out).to_dict()
    side["source"] = ref.repo
    return side


def reference_run_id(cfg: Config, ref: Reference) -> str:
    """Stable id of the reference's run of ``cfg``: its setting (the original, not the file path,
    which names the output folder) and the reference."""
    d = cfg.to_dict()
    # What cannot change a number (fedray's NOT_IN_RUN_ID, the setting's name kept) and how often and
    # where fedray evaluates, which the script does its own way.
    ignored = [k for k in NOT_IN_RUN_ID if k != "partition_name"]
    for key in (*ignored, "eval_every", "eval_batch_size", "num_cpus_per_actor", "num_gpus_per_actor"):
        d.pop(key, None)
    digest = hashlib.sha256(json.dumps([ref.repo, d], sort_keys=True).encode()).hexdigest()[:10]
    return f"{cfg.algorithm}-{cfg.dataset}-s{cfg.seed}-ref-{digest}"


def check_checkout(ref: Reference, checkout: Path) -> str:
    """The checkout's commit; a checkout without the script, or of another commit, is an error
    (``FEDRAY_REFERENCE_ANY_COMMIT=1`` accepts another commit, recorded with the runs)."""
    if not (checkout / ref.script).is_file():
        raise ReferenceError(
            f"--checkout {str(checkout)!r}: no {ref.script} there; expected a checkout of {ref.repo}"
        )
    try:
        head = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = "unknown"
    if not head.startswith(ref.commit) and os.environ.get("FEDRAY_REFERENCE_ANY_COMMIT") != "1":
        raise ReferenceError(
            f"--checkout {str(checkout)!r} is at commit {head[:12]}, not {ref.commit} (the commit this harness was "
            f"checked against: git -C {checkout} checkout {ref.commit}); FEDRAY_REFERENCE_ANY_COMMIT=1 runs it anyway"
        )
    return head


@dataclass
class Job:
    cfg: Config  # the run as the sweep gives it (fedray's partition keys, which the reference draws)
    run_id: str
    argv: list[str]
    result: Path


def plan_jobs(ref: Reference, runs: Iterable[Config], out: Path, datadir: Path) -> list[Job]:
    """One reference job per distinct run; every run the reference cannot run is reported at once."""
    jobs, problems, seen = [], [], set()
    for cfg in runs:
        if cfg.algorithm not in ref.algorithms:
            problems.append(
                f"{cfg.algorithm}: {ref.repo} has no such algorithm (it has {', '.join(sorted(ref.algorithms))})"
            )
            continue
        run_id = reference_run_id(cfg, ref)
        if run_id in seen:
            continue
        seen.add(run_id)
        logdir = out / "reference" / "logs" / run_id
        try:
            argv = ref.args(cfg, datadir, logdir)
        except ReferenceError as e:
            problems.append(f"{cfg.algorithm} seed {cfg.seed}: {e}")
            continue
        jobs.append(Job(cfg, run_id, argv, out / "reference" / "results" / f"{run_id}.json"))
    if problems:
        raise ReferenceError("\n  ".join(["cannot run these on the reference:", *sorted(set(problems))]))
    return jobs


def wrapper_command(
    ref: Reference, checkout: Path, job: Job, threads: int, extra: Iterable[str] = ()
) -> list[str]:
    return [
        sys.executable,
        "-m",
        ref.wrapper,
        "--checkout",
        str(checkout),
        "--result",
        str(job.result),
        "--workdir",
        str(job.result.parent.parent / "logs" / job.run_id),
        "--threads",
        str(threads),
        *extra,
        "--",
        ref.script,
        *job.argv,
    ]


def run_job(
    ref: Reference, checkout: Path, job: Job, threads: int, extra: Iterable[str] = ()
) -> dict[str, Any]:
    """Run the reference once (a subprocess); returns the wrapper's record. Its output goes to
    DIR/reference/logs/RUN_ID/stdout.txt; a failure raises with the end of it."""
    job.result.parent.mkdir(parents=True, exist_ok=True)
    logs = job.result.parent.parent / "logs" / job.run_id
    logs.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    with open(logs / "stdout.txt", "w") as f:
        p = subprocess.run(
            wrapper_command(ref, checkout, job, threads, extra),
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(root),
        )
    if p.returncode != 0:
        tail = (logs / "stdout.txt").read_text().splitlines()[-15:]
        raise RuntimeError(f"{ref.repo} run {job.run_id} failed (exit {p.returncode}):\n" + "\n".join(tail))
    return json.loads(job.result.read_text())


def save_partition(cfg: Config, out: Path, record: dict[str, Any]) -> Path:
    """The reference's partition as a partition file (JSON); the same setting and seed must give
    the same clients every time (else the reference is not reproducible and the comparison void)."""
    path = Path(partition_file_for(partition_template(out, cfg), cfg.seed))
    clients = record["partition"]
    train = [clients[str(c)] for c in range(len(clients))]
    if path.is_file():
        held = partition_file.read(path)
        if [list(map(int, t)) for t in held.train] != [list(map(int, t)) for t in train]:
            raise ReferenceError(
                f"{path}: the reference drew other clients for the same setting and seed this time"
            )
        return path
    import numpy as np

    partition_file.write_json(path, [np.asarray(t) for t in train], record["train_size"], dataset=cfg.dataset)
    return path


def import_run(ref: Reference, cfg: Config, job: Job, record: dict[str, Any], commit: str, out: Path) -> str:
    """Write the reference's run into ``out`` as a fedray run: one accuracy row per evaluated round
    (with the wall time since the previous one), and a runs row with its total wall time. The script
    trains on through NaN weights (fedray stops such a run: diverged); the first evaluated round whose
    weights were not all finite is the summary's ``diverged_round``."""
    config = reference_config(cfg, ref, out)
    writer = ResultsWriter(out, job.run_id, config)
    writer.start()
    evals = record["evals"]
    history = []
    for k, e in enumerate(evals):
        rnd, stage = ref.eval_round(cfg, k)
        writer.add(
            rnd, [rec("accuracy", e["accuracy"], stage=stage), rec("seconds", e["seconds"], stage=stage)]
        )
        history.append((rnd, e["accuracy"]))
    rows = {"client": [], "split": [], "index": [], "source": []}
    for cid, idx in sorted(record["partition"].items(), key=lambda kv: int(kv[0])):
        rows["client"] += [int(cid)] * len(idx)
        rows["split"] += ["train"] * len(idx)
        rows["index"] += list(idx)
        rows["source"] += ["train"] * len(idx)
    writer.write_partition(rows, record["train_size"], cfg.dataset)
    # what the wrapper changed or kept, as it recorded it (each wrapper records its own)
    settings = {
        k: record[k]
        for k in ("skipped_logging_evals", "state_dict", "kmeans_n_init", "max_grad_norm", "local_test")
        if k in record
    }
    summary: dict[str, Any] = {
        "rounds_done": cfg.rounds,
        "total_seconds": record["total_seconds"],
        "reference": {
            "repo": ref.repo,
            "commit": commit,
            "script": ref.script,
            "args": record["args"],
            **settings,
            "fast_data": record.get("fast_data", False),
            "threads": record.get("threads", 0),
            "model_sha256": [e["model_sha256"] for e in evals],
        },
    }
    diverged = [ref.eval_round(cfg, k)[0] for k, e in enumerate(evals) if e.get("finite") is False]
    if diverged:
        summary["diverged_round"] = diverged[0]
    if history:
        summary["final_accuracy"] = history[-1][1]
        best = max(history, key=lambda h: h[1])
        summary["best_accuracy"], summary["best_round"] = best[1], best[0]
        summary["mean_round_seconds"] = record["total_seconds"] / cfg.rounds
    writer.finish(summary)
    return job.run_id


def write_fedray_side(
    name: str,
    runs: Iterable[Config],
    out: Path,
    source: str,
    place: Callable[[Config, Path], Config] | None = None,
    where: str = "each on the reference's own\n# partition of its setting and seed",
) -> Path:
    """The fedray side as a sweep file: every run as ``place`` puts it (default: on the reference's
    partition), so `fedray sweep FILE` runs, skips and resumes it. The runs an earlier invocation
    wrote there stay (a reference run in pieces with ``--only`` adds each piece). The keys every run
    shares are written once; runs that form a full grid of cases and seeds are written as one,
    others each as a case with its seed."""
    place = place or on_reference_partition
    path = out / "reference" / f"{name}-fedray.yaml"
    sides = [place(cfg, out).to_dict() for cfg in runs]
    path.parent.mkdir(parents=True, exist_ok=True)
    # Several invocations into one folder (one per --only piece, at once) merge into the same file:
    # the read-merge-write holds a lock beside it, and the file is replaced whole, so none loses
    # another's runs and no reader meets a half-written file.
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _merge_fedray_side(path, sides, source, name, where)
    return path


def _merge_fedray_side(path: Path, sides: list[dict], source: str, name: str, where: str) -> None:
    out = path.parent.parent
    earlier = []
    if path.is_file():
        from fedray.sweeps.sweep_file import load_sweep

        earlier = [r.config.to_dict() for r in load_sweep(path).runs]
    # One entry per run: a run written again (a setting outside the run id changed since, such as
    # keep_finished_checkpoints) keeps its place and takes this invocation's settings.
    by_id: dict[str, dict] = {}
    for side in earlier + sides:  # the keys of the run id, as written (nothing read or validated here)
        by_id[json.dumps({k: v for k, v in side.items() if k not in NOT_IN_RUN_ID}, sort_keys=True)] = side
    unique = list(by_id.values())
    for side in unique:
        side.pop("output")
    cases, seeds = [], []
    for side in unique:
        case = {k: v for k, v in side.items() if k != "seed"}
        seeds.append(side["seed"])
        if case not in cases:
            cases.append(case)
    if len(unique) == len(cases) * len(set(seeds)):  # a full grid: the cases times the seeds
        doc_cases, doc_seeds = cases, sorted(set(seeds))
    else:
        doc_cases, doc_seeds = unique, None
    shared = (
        {k: v for k, v in doc_cases[0].items() if all(c.get(k) == v for c in doc_cases)} if doc_cases else {}
    )
    doc = {
        **shared,
        "output": str(out),
        "cases": [{k: v for k, v in c.items() if k not in shared} for c in doc_cases],
    }
    if doc_seeds is not None:
        doc["seeds"] = doc_seeds
    if not any(doc["cases"]):
        del doc["cases"]
    header = (
        f"# fedray's side of the comparison with {source}: the runs, {where}\n"
        f"# (written by `fedray reference {name}`).\n"
        f"#   fedray sweep {path}\n"
    )
    write_text_atomic(header + yaml.safe_dump(doc, sort_keys=False), path)


def run_reference(
    ref: Reference,
    runs: list[Config],
    checkout: Path,
    out: Path,
    jobs: int = 1,
    threads: int = 0,
    extra: Iterable[str] = (),
    force: bool = False,
    partitions_only: bool = False,
    log: Callable[[str], None] = print,
) -> tuple[int, int]:
    """Run every not-yet-imported run on the reference (``jobs`` at once) and import it. Returns
    (imported now, failed); a failure is reported and the others go on. ``partitions_only``:
    draw each setting's partition once (those not drawn yet), import nothing."""
    commit = check_checkout(ref, checkout)
    datadir = ref.prepare_data(out)
    planned = plan_jobs(ref, runs, out, datadir)
    if partitions_only:
        by_file: dict[str, Job] = {}
        for j in planned:
            path = partition_file_for(partition_template(out, j.cfg), j.cfg.seed)
            if not Path(path).is_file():
                by_file.setdefault(path, replace(j, result=j.result.with_name(f"{j.run_id}-partition.json")))
        todo = list(by_file.values())
        log(f"{ref.repo} @ {commit[:7]}: {len(todo)} partitions to draw")
    else:
        todo = [j for j in planned if force or run_status(out, j.run_id) != "finished"]
        log(
            f"{ref.repo} @ {commit[:7]}: {len(planned)} runs, {len(planned) - len(todo)} already imported, "
            f"{len(todo)} to run ({jobs} at once)"
        )
    t0 = time.perf_counter()

    def one(job: Job) -> str:
        record = run_job(ref, checkout, job, threads, extra)
        path = save_partition(job.cfg, out, record)
        if partitions_only:
            return f"partition in {path}"
        import_run(ref, job.cfg, job, record, commit, out)
        return (
            f"{record['evals'][-1]['accuracy']:.4f} final accuracy, {record['total_seconds']:.0f} s"
            if record["evals"]
            else "no evaluation"
        )

    return run_pool(
        todo,
        one,
        lambda j: f"{j.cfg.algorithm} {partition_label(j.cfg)} seed {j.cfg.seed}",
        jobs,
        log,
        after=lambda j: f" ({j.run_id}; {time.perf_counter() - t0:.0f} s so far)",
    )


def run_wrapped(
    ref: Reference,
    runs: list[Config],
    checkout: Path,
    out: Path,
    jobs: int,
    threads: int,
    options: Mapping[str, Any],
) -> int:
    """The generic reference side (a record's ``run`` left None): `run_reference` with the wrapper
    options the record takes (``options``: each as given or its default). Returns the runs that failed."""
    extra = ["--state-dict", options["state_dict"]] if "state_dict" in options else []
    if options.get("keep_logging_evals"):
        extra.append("--keep-logging-evals")
    partitions_only = bool(options.get("partitions_only"))
    if partitions_only:
        extra.append("--partition-only")
    force = bool(options.get("force")) or partitions_only
    return run_reference(
        ref, runs, checkout, out, jobs, threads, extra, force=force, partitions_only=partitions_only
    )[1]


def run_pool(
    todo: list[T],
    one: Callable[[T], str],
    label: Callable[[T], str],
    jobs: int,
    log: Callable[[str], None],
    after: Callable[[T], str] = lambda _: "",
) -> tuple[int, int]:
    """``one`` on every item of ``todo``, ``jobs`` at a time; each outcome logged as it comes
    (``[k/n] LABEL: what one returned`` and ``after``, or FAILED with the exception: the others go
    on). Returns (done, failed)."""
    done = failed = 0
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(one, item): item for item in todo}
        for fut in as_completed(futures):
            item = futures[fut]
            try:
                what = fut.result()
                done += 1
                log(f"[{done + failed}/{len(todo)}] {label(item)}: {what}{after(item)}")
            except Exception as e:  # noqa: BLE001 - reported, the other runs go on
                failed += 1
                log(f"[{done + failed}/{len(todo)}] {label(item)}: FAILED {type(e).__name__}: {e}")
    return done, failed
