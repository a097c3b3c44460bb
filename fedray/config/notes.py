"""Notes a process says once, to stderr: what fell back and why (an engine that cannot stack a
model, a data folder that cannot keep what was read). Every layer may say one."""

from __future__ import annotations

import sys

_SAID: set[str] = set()


def say_once(line: str) -> None:
    """Print ``fedray: line`` to stderr, the first time this process is told it."""
    if line not in _SAID:
        _SAID.add(line)
        print(f"fedray: {line}", file=sys.stderr, flush=True)
