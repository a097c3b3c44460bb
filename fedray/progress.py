"""How the `fedray` command renders what a run or a sweep reports (`fedray.experiment.loop` events,
run summaries) as lines for the terminal."""

from __future__ import annotations

import os
import time
from typing import Any

from fedray.config.coercion import count


def round_line(ev: Any) -> str:
    """One line per round: its number, the global metrics it has, its wall time."""
    m = ev.metrics
    parts = [f"round {ev.round:>{len(str(ev.rounds))}}/{ev.rounds}" + (f" {ev.stage}" if ev.stage else "")]
    for key, label, fmt in (
        ("accuracy", "acc", "{:.4f}"),
        ("loss", "loss", "{:.4f}"),
        ("local_accuracy", "local_acc", "{:.4f}"),
        ("val_accuracy", "val_acc", "{:.4f}"),
        ("val_loss", "val_loss", "{:.4f}"),
        ("val_local_accuracy", "val_local_acc", "{:.4f}"),
        ("train_accuracy", "train_acc", "{:.4f}"),
        ("sgd_loss", "sgd_loss", "{:.4f}"),
    ):
        if key in m:
            parts.append(f"{label} {fmt.format(m[key])}")
    parts.append(f"{ev.seconds:.2f}s")
    return "  ".join(parts)


def resumed_line(ev: Any, cfg: Any) -> str:
    return (
        f"resuming from the checkpoint after round {ev.resumed_from} of {cfg.rounds} (--restart starts over)"
    )


def recovered_line(ev: Any) -> str:
    return (
        f"fedray: client actors lost ({ev.error.splitlines()[0] if ev.error else '?'}); going on from the "
        f"latest checkpoint on {ev.actors} new actor(s), recovery {ev.failures} of max_failures={ev.max_failures}"
    )


def auto_gpus_line(
    share: float, cpus_per_actor: float, local: bool = False, cluster_gpus: float = 0.0
) -> str:
    """What ``num_gpus_per_actor: auto`` resolved to, said once for a run (a sweep: per CPU count)."""
    if local:
        return "num_gpus_per_actor auto: 0 (in this process, --local: client training on the CPU)"
    if share == 0 and cluster_gpus == 0:
        return "num_gpus_per_actor auto: 0 (no GPU in the Ray cluster: client actors train on CPUs)"
    if share == 0:
        return (
            f"num_gpus_per_actor auto: 0 (no GPU node of the Ray cluster holds a client actor of "
            f"{cpus_per_actor:g} CPU(s): client actors train on CPUs)"
        )
    per_gpu = round(1 / share)
    return (
        f"num_gpus_per_actor auto: {share:g} (the Ray cluster has GPUs: {per_gpu} client actor(s) of "
        f"{cpus_per_actor:g} CPU(s) a GPU)"
    )


def sweep_auto_lines(session: Any) -> list[str]:
    """What ``num_gpus_per_actor: auto`` resolved to in a sweep (`fedray.sweeps.flow.SweepSession`):
    one line in this process, else one a CPU count; none where nothing was auto."""
    if not session.auto:
        return []
    if session.local:
        return [auto_gpus_line(0.0, 0.0, local=True)]
    gpus = session.launcher.cluster_gpus()
    return [auto_gpus_line(share, cpus, cluster_gpus=gpus) for cpus, share in session.auto.items()]


def duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def outcome(summary: dict, label: str = "acc") -> str:
    """The accuracy line of a run's summary: final value, and the best with its round."""
    s = summary
    if "final_accuracy" in s:
        return f"{label} {s['final_accuracy']:.4f} (best {s['best_accuracy']:.4f} at round {s['best_round']})"
    if "final_val_accuracy" in s:  # a run that evaluated on validation (evaluate_on)
        return (
            f"validation {label} {s['final_val_accuracy']:.4f} (best {s['best_val_accuracy']:.4f} at "
            f"round {s['best_val_round']})"
        )
    return "no accuracy recorded"


def placed(pl: dict) -> str:
    return f"{count(pl.get('actors'), 'actor')} on {count(pl.get('nodes'), 'node')} {pl.get('devices')}"


def process_age() -> float | None:
    """Seconds since this process started (Python's own start and every import included), from
    ``/proc/self/stat``'s start time against ``/proc/uptime`` (both since boot); None where the
    system does not tell (no /proc)."""
    try:
        with open("/proc/self/stat") as f:
            # the fields after the command's name in brackets (which may hold spaces): starttime is
            # the 22nd field, the 20th after the bracket, in clock ticks since boot
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, up - started)


# When the `fedray` command began, on time.perf_counter's clock: set as jobs.cli is imported
# (`command_started`), so a run's done line says what the command took "in all", Python's start and
# the imports included. None in a process that is not the command (fedray.run from Python): the
# done line counts from the caller's t0.
COMMAND_T0: float | None = None


def command_started() -> None:
    """Start the command's clock (`COMMAND_T0`) at this process's start (`process_age`; now where the
    system does not tell); once a process."""
    global COMMAND_T0
    if COMMAND_T0 is None:
        COMMAND_T0 = time.perf_counter() - (process_age() or 0.0)


def run_lines(ev: Any, cfg: Any, quiet: bool, t0: float) -> list[tuple[str, bool]]:
    """`fedray run`: the lines one event of a run prints, each with whether it goes to stderr. The
    done line's "in all" counts from the command's start (`COMMAND_T0`), else from ``t0``."""
    from fedray.data import partition_label
    from fedray.experiment.loop import Checkpointed, Finished, Recovered, RoundDone, Started

    if isinstance(ev, Started):
        where = "in-process" if ev.placement.get("mode") == "local" else placed(ev.placement)
        lines = [
            (
                f"run {ev.run_id}: {cfg.algorithm} on {cfg.dataset} ({partition_label(cfg.to_dict())}), {ev.num_clients} clients, {where}",
                False,
            )
        ]
        return lines + ([(resumed_line(ev, cfg), False)] if ev.resumed_from else [])
    if isinstance(ev, RoundDone) and not quiet:
        return [(round_line(ev), False)]
    if isinstance(ev, Checkpointed) and not quiet:
        return [(f"checkpoint after round {ev.round}: {ev.bytes / 1e6:.1f} MB in {ev.seconds:.2f} s", False)]
    if isinstance(ev, Recovered):
        return [(recovered_line(ev), True)]
    if isinstance(ev, Finished):
        s = ev.summary
        began = t0 if COMMAND_T0 is None else min(COMMAND_T0, t0)
        return [
            (
                f"done: {outcome(s, 'final accuracy')}; {count(s['rounds_done'], 'round')}, {s.get('steady_round_seconds', 0):.2f} s/round; "
                f"the run {s.get('total_seconds', 0):.1f} s (runs/ total_seconds), {time.perf_counter() - began:.1f} s in all for this command; "
                f"results in {cfg.output}/ (fedray report {cfg.output})",
                False,
            )
        ]
    return []


class SweepProgress:
    """`fedray sweep`: the lines the scheduler's events print, with the runs in flight, the ended
    runs and the ETA kept here."""

    def __init__(self, total: int, local: bool, verbose: bool) -> None:
        self.total, self.local, self.verbose = total, local, verbose
        self.t0 = time.perf_counter()
        self.in_flight = 0
        self.ended: list[Any] = []

    def lines(self, ev: Any) -> list[str]:
        from fedray.experiment.loop import Recovered, RoundDone, Started
        from fedray.sweeps.scheduler import RunEnded, RunLaunched, RunProgress, Waiting

        tag = f"#{ev.run.index}" if hasattr(ev, "run") else ""
        if isinstance(ev, RunLaunched):
            self.in_flight += 1
            actors = "in-process" if self.local else count(ev.actors, "actor")
            if ev.packed:
                actors = f"packed: {ev.packed} runs " + ("in-process" if self.local else "in one worker")
            return [f"{tag} start  {ev.run.label}  ({ev.run.run_id}, {actors}; {self.in_flight} running)"]
        if isinstance(ev, Waiting):
            return [
                f"waiting: {ev.free_cpus:g} CPUs and {ev.free_gpus:g} GPUs are free, too little for the next "
                "run; other jobs on the cluster hold the rest"
            ]
        if isinstance(ev, RunProgress):
            inner = ev.event
            if isinstance(inner, Recovered):
                return [f"{tag} {recovered_line(inner)}"]
            if isinstance(inner, Started) and inner.resumed_from:
                return [f"{tag} {resumed_line(inner, ev.run.config)}"]
            if self.verbose and isinstance(inner, RoundDone):
                return [f"{tag} {round_line(inner)}"]
            if self.verbose and isinstance(inner, Started) and not self.local:
                return [f"{tag} placed: {placed(inner.placement)}"]
            return []
        if isinstance(ev, RunEnded):
            self.in_flight -= 1
            self.ended.append(ev)
            done, elapsed = len(self.ended), time.perf_counter() - self.t0
            eta = f"; ETA {duration(elapsed / done * (self.total - done))}" if done < self.total else ""
            if ev.skipped:
                return [f"{tag} skipped [{done}/{self.total}]: {ev.skipped}{eta}"]
            if ev.ok:
                return [
                    f"{tag} done   [{done}/{self.total}] {outcome(ev.summary)}, {duration(ev.seconds)}{eta}"
                ]
            first = str(ev.error).splitlines()[0] if str(ev.error) else ""
            return [f"{tag} FAILED [{done}/{self.total}] {type(ev.error).__name__}: {first}{eta}"]
        return []
