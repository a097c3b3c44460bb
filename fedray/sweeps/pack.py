"""Packed runs (config key ``pack_runs``): several runs of a sweep in one worker process, their
clients' local updates trained together in one stack.

A pack's runs each go through `fedray.experiment.loop.execute` in a thread of their own, with their own
run id, results, checkpoints and resume, and their own in-process federation (`LocalFederation`).
They take turns (`Packer.turn`): one runs its own code (its algorithm, aggregation, evaluation of
the global test set, writing its rows) while the others wait. When a run calls its clients, its
host hands the call to the `Packer` and waits; once every run still going has a call waiting, the
last to arrive runs them all as one `fedray.engine.drive.run_stacked`: every client of every run advanced
to its next yield, their updates trained in stacks by shape (`fedray.engine.batched.signature` and
`fedray.engine.choice.stack_key`; each update at its own run's learning rate), their evaluations in one
call. A FedAvg sweep over seeds or a tuned
FedProx grid thus trains each round's updates of all its runs in one stack: on a GPU one step for
several runs' models where each run alone would take one step for its own.

The numbers are each run's own up to float round-off (the stacks' sums run in another order);
tests/sweeps/test_pack.py checks a packed sweep against the same runs trained alone.

Which runs pack together (`pack_groups`): those of one algorithm with pack_runs on (or auto, where
the runs share a GPU) and an equal `pack_key`: the data set and its options, the model, the local
training's batch, momentum, weight decay and epochs (not its learning rate: a tuned-lr grid packs),
and where and how the worker runs. At most ``pack_size`` runs a pack.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from fedray.config.keys import PACK_KEYS, Config
from fedray.engine import drive
from fedray.engine.step_options import StepOptions
from fedray.experiment.local import engine_for


def packs(cfg: Config) -> bool:
    """Whether ``cfg`` (its GPU share resolved) trains in a pack: pack_runs on (validated to train
    batched), or auto where its runs share a GPU (a fractional ``num_gpus_per_actor``: the GPU's
    other runs could as well be stacked with it) and train batched there (not batched_clients off,
    nor a model the stacked engine refuses: such runs would only take turns in one worker)."""
    if cfg.pack_runs == "on":
        return True
    share = cfg.num_gpus_per_actor
    if cfg.pack_runs != "auto" or not (isinstance(share, float) and 0 < share < 1):
        return False
    return engine_for(cfg, "cuda").stacked


def pack_key(cfg: Config) -> tuple:
    """Runs with equal keys may pack together: those the runs of one pack share (the config keys
    whose role is ``pack``, `fedray.config.keys.PACK_KEYS`): the data set (its files and options,
    its own settings under ``data:``, and so the augmentation a stack shares), the model, what every
    update of one stack shares (runs that differ there would train in stacks of their own, so
    packing them gains nothing) and how they train, and the worker (its CPUs, its GPU share, the
    process-wide CUDA settings)."""
    d = cfg.to_dict()
    return tuple((k, repr(d[k])) for k in PACK_KEYS)


def pack_groups(configs: Sequence[Config], holds: Callable[[Config], bool] | None = None) -> list[list[int]]:
    """The sweep's runs (by index into ``configs``) in launch units, in the order of their first
    run: a run that does not pack alone, the rest grouped by `pack_key` and algorithm (one
    algorithm's updates share a stack; two algorithms' mostly do not) in their order, at most
    ``pack_size`` (the first run's) a pack. ``holds(cfg)``: whether the launcher can hold a pack of
    such runs (on Ray: the driver's node); where it cannot, pack_runs auto runs them alone (on:
    packs them, and the launch says why they cannot start)."""
    units: list[list[int]] = []
    open_packs: dict[tuple, list[int]] = {}
    for i, cfg in enumerate(configs):
        if not packs(cfg) or (cfg.pack_runs == "auto" and holds is not None and not holds(cfg)):
            units.append([i])
            continue
        key = (pack_key(cfg), cfg.algorithm)
        unit = open_packs.get(key)
        if unit is None or len(unit) >= configs[unit[0]].pack_size:
            unit = open_packs[key] = []
            units.append(unit)
        unit.append(i)
    return units


class PackStopped(KeyboardInterrupt):
    """The pack was stopped from outside (Ctrl-C, a cancelled sweep): each of its runs records
    itself as interrupted, as a run stopped alone does."""


@dataclass
class _Call:
    fn: Callable
    clients: list
    cstates: list
    msgs: list
    required: bool  # batched_clients on (`fedray.engine.choice.Engine`)
    slot: int  # the run's place in its pack: calls run together in this order, whatever their arrival
    options: StepOptions | None = None  # how the stacked step runs (the runs' engine's)
    result: Any = None
    error: BaseException | None = None
    done: bool = False
    merged: bool = False  # ran in one run_stacked with another run's call


class Packer:
    """The meeting point of a pack's runs (see the module's docstring). ``size``: the runs that
    will call it; each calls `leave` when it ends, however it ends."""

    def __init__(self, size: int) -> None:
        self._cv = threading.Condition(threading.RLock())
        self.size = size  # the pack's runs
        self._live = size
        self._calls: list[_Call] = []
        self._stopped = False
        self._said = False
        self._slot = threading.local()  # the run this thread runs (its index in the pack)

    def enter(self, slot: int) -> None:
        """This thread runs the pack's run ``slot`` (its calls join the others' in slot order)."""
        self._slot.k = slot

    @contextmanager
    def turn(self) -> Iterator[None]:
        """A run's own code runs inside its turn: one run at a time (their numbers then cannot
        depend on each other's timing; torch's default generator, forked and seeded where a model
        is drawn, is the process's)."""
        with self._cv:
            if self._stopped:
                raise PackStopped("the pack was stopped")
            yield

    def run_stacked(
        self,
        fn: Callable,
        clients: Sequence,
        cstates: Sequence,
        msgs: Sequence,
        required: bool,
        options: StepOptions | None = None,
    ) -> tuple[list[tuple[Any, Any]], list[bool], bool]:
        """`fedray.engine.drive.run_stacked`, run together with the other runs' calls; called by a run's
        host in its turn, which it gives up while it waits. Its results, and whether they ran
        together with another run's."""
        call = _Call(
            fn, list(clients), list(cstates), list(msgs), required, getattr(self._slot, "k", 0), options
        )
        with self._cv:
            if self._stopped:
                raise PackStopped("the pack was stopped")
            self._calls.append(call)
            self._run_if_all_waiting()
            while not call.done:
                if self._stopped:  # its call is not run: the others' merged call would not be whole
                    self._calls = [c for c in self._calls if c is not call]
                    raise PackStopped("the pack was stopped")
                self._cv.wait()
        if call.error is not None:
            raise call.error
        return (*call.result, call.merged)

    def _said_failure(self, what: str) -> None:
        """Say (once a pack) that a merged call failed and its runs' calls run again alone."""
        if not self._said:
            self._said = True
            print(
                f"fedray: a call of several packed runs failed ({what}); each run's call runs again "
                "alone (where every run's call succeeds alone, a merged stack was too much: "
                "lower pack_size)",
                file=sys.stderr,
                flush=True,
            )

    def leave(self) -> None:
        """A run has ended: the others no longer wait for its calls."""
        with self._cv:
            self._live -= 1
            self._run_if_all_waiting()

    def stop(self) -> None:
        """Every run stops at its next turn or wait (`PackStopped`)."""
        with self._cv:
            self._stopped = True
            self._cv.notify_all()

    def _run_if_all_waiting(self) -> None:
        if self._stopped or not self._calls or len(self._calls) < self._live:
            return
        calls, self._calls = sorted(self._calls, key=lambda c: c.slot), []
        try:
            self._run(calls)
        finally:
            for c in calls:
                c.done = True
            self._cv.notify_all()

    def _run(self, calls: list[_Call]) -> None:
        """The calls as one `run_stacked`. Where it fails and several runs' calls were in it, each
        call runs again alone, so a failure reaches the run whose client raised it and the others go
        on (their updates then trained in their own stacks)."""
        fns = [c.fn for c in calls for _ in c.clients]
        clients = [x for c in calls for x in c.clients]
        cstates = [x for c in calls for x in c.cstates]
        msgs = [x for c in calls for x in c.msgs]
        failed = None
        try:
            results, stacked = drive.run_stacked(
                fns, clients, cstates, msgs, calls[0].required, calls[0].options
            )
        except Exception as e:  # noqa: BLE001 - handed to the run it belongs to
            if len(calls) == 1:
                calls[0].error = e
                return
            failed = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if failed is not None:
            # out of the except block: the failed call's frames (every run's stacked data, a
            # CUDA out-of-memory's tensors) are gone before the calls run again alone
            self._said_failure(failed)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            for c in calls:
                try:
                    c.result = drive.run_stacked(c.fn, c.clients, c.cstates, c.msgs, c.required, c.options)
                except Exception as alone:  # noqa: BLE001 - raised in the run's own thread
                    c.error = alone
            return
        at = 0
        for c in calls:
            n = len(c.clients)
            c.result, c.merged = (results[at : at + n], stacked[at : at + n]), len(calls) > 1
            at += n


@dataclass
class Ended:
    """A packed run has ended: ``error`` is what it raised (None: it finished)."""

    error: BaseException | None = None


def execute_pack(
    configs: Sequence[Config],
    make_federation: Callable[..., Any],
    restarts: Sequence[bool] | None = None,
    reason: str = "",
    stops: Sequence[tuple[int | None, str]] | None = None,
) -> Iterator[tuple[int, Any]]:
    """Run ``configs`` as one pack in this process; yields ``(k, event)`` for run ``k``: its
    `fedray.experiment.loop.execute` events, then `Ended`. ``make_federation(cfg, data, packer=)``
    builds each run's federation, its host handing calls to the packer. Leaving the generator
    early stops every run of the pack (recorded interrupted) and waits for their threads. ``reason``
    is noted with each run's resume (`fedray.experiment.loop.execute`); ``stops``: for each run, the
    round it stops at and why (``execute``'s ``stop_at`` and ``stopped_by``; None: its budget). A run
    that stops leaves the pack, and the others go on."""
    from fedray.experiment.loop import Finished, Stopped, execute

    restarts = list(restarts) if restarts is not None else [False] * len(configs)
    stops = list(stops) if stops is not None else [(None, "")] * len(configs)
    packer = Packer(len(configs))
    out: queue.Queue[tuple[int, Any]] = queue.Queue()

    def member(k: int) -> None:
        error: BaseException | None = None
        packer.enter(k)
        try:
            make = lambda cfg, data: make_federation(cfg, data, packer=packer)  # noqa: E731
            events = execute(
                configs[k], make, restarts[k], reason, stop_at=stops[k][0], stopped_by=stops[k][1]
            )
            try:
                while True:
                    with packer.turn():
                        try:
                            ev = next(events)
                        except StopIteration:
                            break
                        if isinstance(ev, (Finished, Stopped)):  # recorded: its generator ends now, in
                            for _ in events:  # this turn, so no stop can land at that yield
                                pass
                    out.put((k, ev))
            finally:
                if events.gi_frame is not None and not events.gi_running:
                    with packer._cv:  # stopped between turns: the run records itself interrupted
                        events.close()
        except BaseException as e:  # noqa: BLE001 - reported as the run's end
            error = e
        finally:
            packer.leave()
            out.put((k, Ended(error)))

    threads = [threading.Thread(target=member, args=(k,), daemon=True) for k in range(len(configs))]
    for t in threads:
        t.start()
    left = len(configs)
    try:
        while left:
            k, ev = out.get()
            if isinstance(ev, Ended):
                left -= 1
            yield k, ev
    finally:
        if left:
            packer.stop()
            for t in threads:
                t.join()
