"""Derived random streams.

Every random stream in a run is a pure function of ``(seed, purpose, client, round)``, so the
numbers do not depend on which process draws them, in which order, or how many actors there are.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

GLOBAL = -1  # stands for "no client" / "no round" in a stream key


def _key(seed: int, purpose: str, client: int, rnd: int) -> list[int]:
    # crc32 is stable across processes and Python versions (unlike hash()).
    return [int(seed), zlib.crc32(purpose.encode()), int(client) + 1, int(rnd) + 1]


def rng(seed: int, purpose: str, client: int = GLOBAL, rnd: int = GLOBAL) -> np.random.Generator:
    """A numpy Generator for one purpose (e.g. "partition", "sample", "loader")."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(_key(seed, purpose, client, rnd))))


def torch_seed(seed: int, purpose: str, client: int = GLOBAL, rnd: int = GLOBAL) -> int:
    """A 63-bit integer seed for torch generators, derived like `rng`."""
    return int(np.random.SeedSequence(_key(seed, purpose, client, rnd)).generate_state(2, np.uint64)[0] >> 1)


def torch_generator(seed: int, purpose: str, client: int = GLOBAL, rnd: int = GLOBAL) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(torch_seed(seed, purpose, client, rnd))
    return g
