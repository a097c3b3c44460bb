"""What a federation keeps behind the Batons it hands out (`fedray.federation.Baton`)."""

from __future__ import annotations

from typing import Any

from fedray.federation import Baton


class BatonStore:
    """What a federation keeps behind its Batons: the value (or, under Ray, its ObjectRef) and its size."""

    def __init__(self) -> None:
        self._items: dict[int, tuple[Any, int]] = {}
        self._next = 0

    def park(self, value: Any, nbytes: int) -> Baton:
        self._next += 1
        self._items[self._next] = (value, nbytes)
        return Baton(self._next)

    def take(self, baton: Baton) -> tuple[Any, int]:
        try:
            return self._items.pop(baton.key)
        except KeyError:
            raise ValueError(
                f"{baton} was already used (a Baton is used once) or is not from this federation"
            ) from None

    def peek(self, baton: Baton) -> tuple[Any, int]:
        try:
            return self._items[baton.key]
        except KeyError:
            raise ValueError(f"{baton} was already used or is not from this federation") from None

    def restore(self, key: int, value: Any, nbytes: int) -> Baton:
        self._items[key] = (value, nbytes)
        self._next = max(self._next, key)
        return Baton(key)

    def __len__(self) -> int:
        return len(self._items)
