"""The FedRC shift benchmark (docs/algorithms/mixture.md#the-fmnist-c-benchmark, docs/algorithms/mixture.md#paper-and-code-differences): clients that differ at once in
their labels (the partition), their features (FMNIST-C corruptions) and their concepts (label maps).

Any partition can be shifted. Each training client gets a role: a concept (0: y, 1: C-1-y,
2: (y+1) mod C) and, for corrupted clients, one corruption and one severity in 1..5 drawn uniformly
(`fedray.data.corruptions`, identity included, as the generator). Presets:

- ``fedrc_code`` (the released generator): shuffled clients; 20% corrupted with concept 0; 40%
  concept 1 / 2 alternating; 20% concept 1 / 2 alternating and corrupted; 20% unchanged
  (concepts 40 / 30 / 30, 40% corrupted).
- ``fedrc_paper`` (App. H.8): 30% unchanged, 20% corrupted, 25% concept 1 and 25% concept 2, a fifth
  of each corrupted (concepts 50 / 25 / 25, 30% corrupted).

Three non-participating test clients (ids N, N+1, N+2) hold the whole test set, uncorrupted, under
concepts 0, 1, 2; each splits it 90/10 at random (E-step on the 90%, accuracy on the 10%). The
shifted copies are built once per run (seconds for FMNIST) into a new training array: each client's
samples, then the test clients', so every client's data is one contiguous range.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedray.config import seeding
from fedray.data.corruptions import CORRUPTIONS, corrupt

SHIFTS = ("none", "fedrc_paper", "fedrc_code")
CONCEPTS = ("y", "C-1-y", "(y+1) mod C")
TEST_CLIENTS = len(CONCEPTS)


@dataclass(frozen=True)
class ClientShift:
    concept: int  # index into CONCEPTS
    corruption: str = ""  # a name from CORRUPTIONS, "" for a clean client
    severity: int = 0  # 1..5 for a corrupted client


def label_map(y: np.ndarray, concept: int, num_classes: int) -> np.ndarray:
    if concept == 0:
        return y
    if concept == 1:
        return num_classes - 1 - y
    if concept == 2:
        return (y + 1) % num_classes
    raise ValueError(f"unknown concept {concept}")


def roles(n: int, preset: str, rng: np.random.Generator) -> list[tuple[int, bool]]:
    """(concept, corrupted) for clients 0..n-1 under ``preset``."""
    order = rng.permutation(n)
    out: list[tuple[int, bool]] = [(0, False)] * n
    if preset == "fedrc_code":
        a, b, c = int(0.2 * n), int(0.4 * n), int(0.2 * n)
        for pos, cid in enumerate(order):
            if pos < a:
                out[cid] = (0, True)
            elif pos < a + b:
                out[cid] = (1 + (pos - a) % 2, False)
            elif pos < a + b + c:
                out[cid] = (1 + (pos - a - b) % 2, True)
        return out
    if preset == "fedrc_paper":
        clean, corrupted = int(0.3 * n), int(0.2 * n)
        rest = order[clean + corrupted :]
        for cid in order[clean : clean + corrupted]:
            out[cid] = (0, True)
        for concept, part in ((1, rest[: len(rest) // 2]), (2, rest[len(rest) // 2 :])):
            for pos, cid in enumerate(part):
                out[cid] = (concept, pos < round(0.2 * len(part)))
        return out
    raise ValueError(f"config key 'shift': unknown preset {preset!r}; one of {', '.join(SHIFTS)}")


def assign_shifts(n: int, preset: str, seed: int) -> list[ClientShift]:
    """Each client's concept and (for corrupted clients) corruption and severity, from (seed, "shift")."""
    rng = seeding.rng(seed, "shift")
    names = sorted(CORRUPTIONS)
    out = []
    for concept, corrupted in roles(n, preset, rng):
        if corrupted:
            out.append(ClientShift(concept, names[int(rng.integers(len(names)))], int(rng.integers(1, 6))))
        else:
            out.append(ClientShift(concept))
    return out


def shifted_arrays(
    x: np.ndarray,
    y: np.ndarray,
    parts: list[np.ndarray],
    shifts: list[ClientShift],
    num_classes: int,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Each client's samples copied with its label map and corruption (per-client generator), laid
    out client after client. Returns (x, y, each client's range of positions)."""
    xs, ys, ranges, start = [], [], [], 0
    for cid, (idx, s) in enumerate(zip(parts, shifts, strict=True)):
        xi = x[idx]
        if s.corruption:
            xi = corrupt(xi, s.corruption, s.severity, seeding.rng(seed, "shift/corrupt", cid))
        xs.append(xi)
        ys.append(label_map(y[idx], s.concept, num_classes))
        ranges.append(np.arange(start, start + len(idx), dtype=np.int64))
        start += len(idx)
    return np.concatenate(xs), np.concatenate(ys), ranges
