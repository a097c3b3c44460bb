"""How the `fedray` command renders what a run or a sweep reports (`fedray.experiment` events,
run summaries) as lines for the terminal."""

from __future__ import annotations

from typing import Any


def round_line(ev: Any) -> str:
    """One line per round: its number, the global metrics it has, its wall time."""
    m = ev.metrics
    parts = [f"round {ev.round:>{len(str(ev.rounds))}}/{ev.rounds}" + (f" {ev.stage}" if ev.stage else "")]
    for key, label, fmt in (("accuracy", "acc", "{:.4f}"), ("loss", "loss", "{:.4f}"), ("local_accuracy", "local_acc", "{:.4f}"),
                            ("train_accuracy", "train_acc", "{:.4f}"), ("sgd_loss", "sgd_loss", "{:.4f}")):  # fmt: skip
        if key in m:
            parts.append(f"{label} {fmt.format(m[key])}")
    parts.append(f"{ev.seconds:.2f}s")
    return "  ".join(parts)


def resumed_line(ev: Any, cfg: Any) -> str:
    return (f"resuming from the checkpoint after round {ev.resumed_from} of {cfg.rounds} "
            f"(--restart starts over)")  # fmt: skip


def recovered_line(ev: Any) -> str:
    return (f"fedray: client actors lost ({ev.error.splitlines()[0] if ev.error else '?'}); going on from the "
            f"latest checkpoint on {ev.actors} new actor(s), recovery {ev.failures} of max_failures={ev.max_failures}")  # fmt: skip


def duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def outcome(summary: dict, label: str = "acc") -> str:
    """The accuracy line of a run's summary: final value, and the best with its round."""
    if "final_accuracy" not in summary:
        return "no accuracy recorded"
    s = summary
    return f"{label} {s['final_accuracy']:.4f} (best {s['best_accuracy']:.4f} at round {s['best_round']})"
