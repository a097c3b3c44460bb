"""Running client functions: the generators that yield `fedray.engine.update.LocalUpdate`s and
`fedray.engine.update.Evaluation`s, and the rest.

A client function is ``fn(client, cstate, msg) -> (reply, new_cstate)``. One that trains or
evaluates is a generator: it yields a `LocalUpdate` or an `Evaluation` (or a list of them) where
it would train or evaluate, receives the result (`Trained`, `EvalStats` or per-sample values; a
list for a list), and returns its reply and state (fedray/engine/update.py). `run_one` runs one client to
its end with the per-client engine (a yield's evaluations in one call); `run_stacked` runs many at
once, advancing every client to its next yield, training everything they yielded together in the
stacked engine and evaluating everything they yielded in one call (a client's several models
stacked where `fedray.engine.step_options.stacks_evaluations` says).

A client function that trains by itself (an optimizer step inside it, not a yielded update) cannot
be stacked: under ``batched_clients: on`` its first step fails, naming the function; under
``auto`` it runs one client at a time and says so once.
"""

from __future__ import annotations

import inspect
import itertools
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np
from torch.optim.optimizer import register_optimizer_step_pre_hook

from fedray.engine import batched, step_options
from fedray.engine.choice import stack_key
from fedray.engine.client import Client, ClientError, PluginMistake
from fedray.engine.evaluation import evaluate_requests
from fedray.engine.stats import EvalStats
from fedray.engine.train import train_update
from fedray.engine.update import Evaluation, LocalUpdate, Request, Trained, requests


def fn_name(fn: Callable) -> str:
    """A client function's name as module.qualname (a partial's function)."""
    while isinstance(fn, partial):
        fn = fn.func
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _failed(cid: int, e: Exception) -> ClientError:
    if isinstance(e, ClientError):
        return e
    return ClientError(cid, f"{type(e).__name__}: {e}", traceback.format_exc(), isinstance(e, PluginMistake))


def _failed_together(cids: list[int], what: str, e: Exception) -> ClientError:
    """A failure of work done for several clients at once, naming them (under the first's id)."""
    message = f"{what} of clients {cids}: {type(e).__name__}: {e}"
    return ClientError(cids[0], message, traceback.format_exc(), isinstance(e, PluginMistake))


Answer = Trained | EvalStats | np.ndarray | tuple[np.ndarray, np.ndarray]


def _answer(yielded: Any, answers: list[Answer]) -> Answer | list[Answer]:
    """The result sent back into a client function: one `Trained` (or `EvalStats`) for one update
    (or evaluation), else a list in the order asked."""
    return answers[0] if isinstance(yielded, (LocalUpdate, Evaluation)) else answers


def _answered_alone(
    client: Client, asked: list[Request], draws: Iterator[int], stack_models: bool = False
) -> list[Answer]:
    """One client's requests: its updates by the per-client engine, in order, its evaluations in
    one call (`fedray.engine.evaluation.evaluate_requests`, its models stacked where ``stack_models``).
    ``draws`` numbers the client's updates through the call (each update's own draws,
    `fedray.engine.train.own_draws`)."""
    evals = [r for r in asked if isinstance(r, Evaluation)]
    stats = iter(evaluate_requests([client] * len(evals), evals, stack_models))
    return [next(stats) if isinstance(r, Evaluation) else train_update(client, r, next(draws)) for r in asked]


def run_one(
    fn: Callable, client: Client, cstate: Any, msg: Any, stack_models: bool = False
) -> tuple[Any, Any]:
    """``fn`` on one client to its end; every update it yields trained by the per-client engine, in
    order, and a yield's evaluations answered in one call (several models stacked where
    ``stack_models``). A failure names the client."""
    try:
        out = fn(client, cstate, msg)
        if not inspect.isgenerator(out):
            return out
        answer, draws = None, itertools.count()
        while True:
            try:
                yielded = out.send(answer)
            except StopIteration as stop:
                return stop.value
            asked = requests(yielded, client.task.drop_last)
            answer = _answer(yielded, _answered_alone(client, asked, draws, stack_models))
    except Exception as e:  # noqa: BLE001 - re-raised with the client id attached
        raise _failed(client.cid, e) from e


class Unstackable(RuntimeError):
    """A client function trained by itself where the stacked engine was asked for."""


class _Watched(threading.local):
    """(function name, stacking required) of the plain client functions running in this thread, innermost last
    (a thread's own: the runs of a pack each run in a thread, `fedray.sweeps.pack`)."""

    def __init__(self) -> None:
        self.stack: list[tuple[str, bool | None]] = []  # None: said already


_watched = _Watched()
_said: set[str] = set()  # functions already reported (auto) in this process
_hooked = False


def _step_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    if not _watched.stack:
        return
    name, required = _watched.stack[-1]
    if required is None:
        return
    if required:
        raise Unstackable(
            f"client function {name} trains a model itself (an optimizer step inside it), so "
            "batched_clients: on cannot stack its clients; yield a fedray.LocalUpdate where it trains "
            "(docs/extending.md#a-local-objective), or set batched_clients: auto or off"
        )
    if name not in _said:
        _said.add(name)
        print(
            f"fedray: client function {name} trains a model itself (not a yielded LocalUpdate): "
            "its clients train one at a time",
            file=sys.stderr,
            flush=True,
        )
    _watched.stack[-1] = (name, None)


@contextmanager
def _watching(fn: Callable, required: bool) -> Iterator[None]:
    """Notice an optimizer step taken while ``fn`` (a plain client function) runs: an error where
    stacking is ``required`` (batched_clients on), else said once a function."""
    global _hooked
    if not _hooked:
        register_optimizer_step_pre_hook(_step_hook)
        _hooked = True
    _watched.stack.append((fn_name(fn), required))
    try:
        yield
    finally:
        _watched.stack.pop()


def run_stacked(
    fn: Callable | Sequence[Callable],
    clients: Sequence[Client],
    cstates: Sequence[Any],
    msgs: Sequence[Any],
    required: bool = True,
    options: step_options.StepOptions | None = None,
) -> tuple[list[tuple[Any, Any]], list[bool]]:
    """``fn`` on every client at once: each is advanced to its next yield, then everything yielded
    trains, updates of one `fedray.engine.batched.signature` and one `fedray.engine.choice.stack_key` in one
    stack (an update alone in its shape by the per-client engine), every evaluation in one call
    (`fedray.engine.evaluation.evaluate_requests`), and the results go back; until every client has returned.
    ``fn`` may be one function a client (the calls of several runs packed together,
    `fedray.sweeps.pack`). ``required`` (batched_clients on, `fedray.engine.choice.Engine`): a client
    function that trains by itself is an error; else it is said once and its clients train one at a
    time. ``options``: how the stacked step runs (the engine's, `fedray.engine.step_options`; None:
    this process's). Returns the ``(reply, new_cstate)`` of each client and whether its training ran
    stacked."""
    n = len(clients)
    fns = list(fn) if isinstance(fn, Sequence) else [fn] * n
    results: list[Any] = [None] * n
    stacked = [False] * n
    gens: dict[int, Any] = {}
    for i, (client, cstate, msg) in enumerate(zip(clients, cstates, msgs, strict=True)):
        try:
            with _watching(fns[i], required):
                out = fns[i](client, cstate, msg)
        except Exception as e:  # noqa: BLE001 - re-raised with the client id attached
            raise _failed(client.cid, e) from e
        if inspect.isgenerator(out):
            gens[i] = out
        else:
            results[i] = out
    answers: dict[int, Any] = dict.fromkeys(gens)
    draws = {
        i: itertools.count() for i in gens
    }  # numbers each client's updates (`fedray.engine.train.own_draws`)
    while gens:
        asked: dict[int, tuple[Any, list[Request]]] = {}
        for i, gen in list(gens.items()):
            try:
                with _watching(fns[i], required):
                    yielded = gen.send(answers[i])
                asked[i] = (yielded, requests(yielded, clients[i].task.drop_last))
            except StopIteration as stop:
                results[i] = stop.value
                del gens[i]
            except Exception as e:  # noqa: BLE001 - re-raised with the client id attached
                raise _failed(clients[i].cid, e) from e
        if not asked:
            break
        # every update yielded, as (client index, position in its request), by shape; every
        # evaluation, the same way, all in one call
        shapes: dict[Any, list[tuple[int, int]]] = {}
        evals: list[tuple[int, int]] = []
        draw: dict[tuple[int, int], int] = {}
        for i, (_, updates) in asked.items():
            for j, u in enumerate(updates):
                if isinstance(u, Evaluation):
                    evals.append((i, j))
                else:
                    key = (batched.signature(u), stack_key(clients[i].task))
                    shapes.setdefault(key, []).append((i, j))
                    draw[(i, j)] = next(draws[i])
        trained: dict[tuple[int, int], Answer] = {}
        if evals:
            try:
                got = evaluate_requests(
                    [clients[i] for i, _ in evals],
                    [asked[i][1][j] for i, j in evals],
                    step_options.stacks_evaluations(clients[evals[0][0]].device, options),
                )
            except ClientError:
                raise  # one client's split, named
            except Exception as e:  # noqa: BLE001 - re-raised with the clients named
                raise _failed_together(sorted({clients[i].cid for i, _ in evals}), "evaluation", e) from e
            trained.update(zip(evals, got, strict=True))
        for members in shapes.values():
            us = [asked[i][1][j] for i, j in members]
            cs = [clients[i] for i, _ in members]
            if len(members) == 1:
                i = members[0][0]
                try:
                    trained[members[0]] = train_update(cs[0], us[0], draw[members[0]])
                except Exception as e:  # noqa: BLE001
                    raise _failed(clients[i].cid, e) from e
                continue
            try:
                got = batched.train_stacked(cs, us, options=options)
            except Exception as e:  # noqa: BLE001 - re-raised with the clients named
                raise _failed_together(sorted({c.cid for c in cs}), "batched training", e) from e
            for m, t in zip(members, got, strict=True):
                trained[m] = t
                stacked[m[0]] = True
        answers = {
            i: _answer(yielded, [trained[(i, j)] for j in range(len(updates))])
            for i, (yielded, updates) in asked.items()
        }
    return results, stacked
