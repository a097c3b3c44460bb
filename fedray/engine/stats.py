"""What training and evaluation count: a split's samples, summed cross-entropy and correct argmax
predictions (`EvalStats`), and what a local update adds (`TrainStats`: its steps, and the stacked
engine's padded rows). Both engines give these; `fedray.engine.update.Trained` carries one."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class EvalStats:
    samples: int = 0
    loss_sum: float = 0.0  # summed cross-entropy over the samples (extra loss terms excluded)
    correct: int = 0

    @property
    def loss(self) -> float:
        return self.loss_sum / max(1, self.samples)

    @property
    def accuracy(self) -> float:
        return self.correct / max(1, self.samples)


@dataclass
class TrainStats(EvalStats):
    steps: int = 0  # optimizer steps taken
    stacked: int = 0  # the stacked engine's sample rows stepped for it, padding included (0 per client)

    def add(self, other: TrainStats) -> None:
        self.samples += other.samples
        self.loss_sum += other.loss_sum
        self.correct += other.correct
        self.steps += other.steps
        self.stacked += other.stacked


def total(parts: Iterable[EvalStats]) -> EvalStats:
    """Sum per-batch stats in the given order (fixed order: the same float sums everywhere)."""
    acc = EvalStats()
    for p in parts:
        acc.samples += p.samples
        acc.loss_sum += p.loss_sum
        acc.correct += p.correct
    return acc
