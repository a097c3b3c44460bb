"""Clients and what an algorithm may do with them: the `Federation` protocol (`protocol`), the
hosts that keep clients' data and state and run client functions on them (`host`,
`client_states`), what every federation knows of its clients (`catalog`), the in-process
federation (`local`), bytes counted (`traffic`), values left with the clients (`batons`) and how
many workers hold which clients (`placement`). The Ray federation (`actors.federation`) is built
from the same parts.

May import: `fedray.engine` and every layer below it. The protocol's names are importable from
here (``from fedray.federation import Federation``), as plug-ins do.
"""

from fedray.federation.protocol import (
    TEST_SHARD,
    Baton,
    ClientError,
    ClientFn,
    Federation,
    FoldFn,
    Traffic,
    WorkerLost,
    participants,
    sample_clients,
    sample_sorted,
)

__all__ = [
    "TEST_SHARD",
    "Baton",
    "ClientError",
    "ClientFn",
    "Federation",
    "FoldFn",
    "Traffic",
    "WorkerLost",
    "participants",
    "sample_clients",
    "sample_sorted",
]
