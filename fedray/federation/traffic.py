"""Bytes down, up and received, counted from the objects themselves (the same in-process and on Ray)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedray.federation import Traffic
from fedray.federation.host import CallMeta
from fedray.params import payload_nbytes


class TrafficMeter:
    """Bytes sent to clients (down) and by clients (up), from the sender's measurements, and the
    bytes of the objects the caller received (replies and metas it fetched; a relay's carries stay
    out until fetched). Every count is of the objects themselves, so it is the same in-process and
    under Ray with any number of actors."""

    def __init__(self) -> None:
        self.down = 0
        self.up = 0
        self.received = 0
        self.client_seconds = 0.0
        self.batched_calls = 0  # client calls whose training ran in the stacked engine

    def broadcast(self, msg: Any, receivers: int) -> None:
        self.down += payload_nbytes(msg) * receivers

    def replies(self, metas: Sequence[CallMeta]) -> None:
        self.up += sum(m.bytes_out for m in metas)
        self.received += sum(m.bytes_out + payload_nbytes(m) for m in metas)
        self.client_seconds += sum(m.seconds for m in metas)
        self.batched_calls += sum(m.stacked for m in metas)

    def relay_hops(
        self, carry_sizes: Sequence[int], common: Any, infos: Sequence[Any], metas: Sequence[CallMeta]
    ) -> None:
        """Each hop's client received its carry and the common message and sent carry + info; the
        caller received only the infos and metas."""
        self.down += sum(carry_sizes) + payload_nbytes(common) * len(carry_sizes)
        self.up += sum(m.bytes_out for m in metas)
        self.received += sum(payload_nbytes(i) + payload_nbytes(m) for i, m in zip(infos, metas, strict=True))
        self.client_seconds += sum(m.seconds for m in metas)
        self.batched_calls += sum(m.stacked for m in metas)

    def take_client_seconds(self) -> float:
        """Seconds the clients spent in their client functions since the last call, summed over
        the calls (a client's samples being made, queues and messages are not in it), then reset."""
        out, self.client_seconds = self.client_seconds, 0.0
        return out

    def take_batched_calls(self) -> int:
        """Client calls since the last call whose training ran stacked, then reset."""
        out, self.batched_calls = self.batched_calls, 0
        return out

    def fetched(self, sizes: Sequence[int]) -> None:
        self.received += sum(sizes)

    def take(self) -> Traffic:
        out = Traffic(self.down, self.up, self.received)
        self.down = self.up = self.received = 0
        return out
