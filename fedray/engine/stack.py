"""A stack: many updates' tensors with a leading row axis, built from the updates (`build_stack`,
with the objective's `Context`) and taken apart again into each update's `Trained` (`unstack`).
The stacked engine (`fedray.engine.batched.train_stacked`) steps it."""

from __future__ import annotations

import functools
import numbers
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call
from torch.utils._pytree import tree_map

from fedray.engine.client import Client
from fedray.engine.stats import TrainStats
from fedray.engine.update import Frozen, LocalUpdate, Trained


def stacked(
    rows: Sequence[Mapping[str, Any]], keys: Sequence[str], device: torch.device
) -> dict[str, torch.Tensor]:
    """``rows``' values of each of ``keys``, stacked rows first on ``device``."""
    return {k: torch.from_numpy(np.stack([np.asarray(r[k]) for r in rows])).to(device) for k in keys}


def tensors(params: Mapping[str, Any], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(np.asarray(v), device=device) for k, v in params.items()}


def per_row(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A value a stack row, shaped to scale ``like`` (a stacked tensor, rows first) row by row."""
    return values.view(-1, *([1] * (like.dim() - 1)))


@dataclass
class Stack:
    """The stacked updates' tensors, one row an update (in a fixed stack, a lane), rows first."""

    p: dict[str, torch.Tensor]  # the parameters that train
    held: dict[str, torch.Tensor]  # the parameters that do not
    rows_ctx: dict[str, Any]  # the context values that differ between rows (tensors, or dicts of them)
    corr: dict[str, torch.Tensor] | None  # subtracted after each step (times the learning rate already)
    buf: dict[str, torch.Tensor] | None  # SGD's momentum buffers
    lr_rows: dict[str, torch.Tensor] | None  # {"lr": each row's learning rate}, where rows differ
    acc: dict[str, torch.Tensor]  # each row's summed cross-entropy and correct predictions

    def parts(self) -> tuple[Any, ...]:
        """What each row starts from (the accumulators apart)."""
        return self.p, self.held, self.rows_ctx, self.corr, self.buf, self.lr_rows

    def take_rows(self, index: torch.Tensor) -> None:
        """Keep only the rows at ``index``, in that order (new tensors: views of the old stay as
        they were)."""
        take = functools.partial(torch.index_select, dim=0, index=index)
        self.p, self.held, self.rows_ctx = (tree_map(take, d) for d in (self.p, self.held, self.rows_ctx))
        for d in (self.corr, self.buf, self.acc, self.lr_rows):
            if d is not None:
                for n in d:
                    d[n] = d[n].index_select(0, index)

    def row(self, j: int, copy: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """Row j's parameters, sums and buffers: views where the stack is replaced, not changed,
        after (a shrinking stack), copies where it goes on changing in place (a fixed one)."""
        take = (lambda v: v[j].clone()) if copy else (lambda v: v[j])
        return {
            "p": {n: take(v) for n, v in self.p.items()},
            "acc": {n: take(v) for n, v in self.acc.items()},
            "buf": {n: take(v) for n, v in self.buf.items()} if self.buf is not None else {},
        }


class View:
    """A module called with given tensors for its parameters and buffers (`functional_call`): the
    stacked engine's stand-in for the module an objective gets, one row of the stack under vmap.
    ``view(x)`` runs the module, ``view.encoder`` is the view of a submodule, ``view.head.weight``
    the tensor given for that parameter, ``view.named_parameters()`` the module's parameters by
    name, as the module's own would be."""

    def __init__(self, module: nn.Module, tensors: Mapping[str, torch.Tensor], prefix: str = "") -> None:
        self._module, self._tensors, self._prefix = module, tensors, prefix

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        n = len(self._prefix)
        own = {k[n:]: v for k, v in self._tensors.items() if k.startswith(self._prefix)}
        return functional_call(self._module, own, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        key = self._prefix + name
        if key in self._tensors:
            return self._tensors[key]
        attr = getattr(self._module, name)
        if isinstance(attr, nn.Module):
            return View(attr, self._tensors, key + ".")
        return attr

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, _ in self._module.named_parameters():
            yield name, self._tensors[self._prefix + name]

    def parameters(self) -> Iterator[torch.Tensor]:
        for _, t in self.named_parameters():
            yield t


def build_stack(
    clients: Sequence[Client],
    updates: Sequence[LocalUpdate],
    names: Sequence[str],
    fixed_names: Sequence[str],
    device: torch.device,
) -> Stack:
    """Every update's start as one stack: the parameters that train (``names``) and those that do
    not, the corrections, the momentum buffers (the given ones, in `optimizer_state`'s form, else
    zeros) and each row's learning rate, its client's task's (the runs of a pack may differ,
    `fedray.sweeps.pack`) where they differ, else the one number (as SGD takes it). The context's
    rows are the `Context`'s."""
    first, task = updates[0], clients[0].task
    lr, mom = task.lr, task.momentum
    lrs = [c.task.lr for c in clients]
    lr_rows = (
        None if all(v == lr for v in lrs) else {"lr": torch.tensor(lrs, dtype=torch.float32, device=device)}
    )
    p = stacked([u.params for u in updates], names, device)
    held = stacked([u.params for u in updates], fixed_names, device)
    corr = None
    if first.correction is not None:
        keys = [k for k in first.correction if k in set(names)]
        corr = {
            n: t * (lr if lr_rows is None else per_row(lr_rows["lr"], t))
            for n, t in stacked([u.correction for u in updates], keys, device).items()
        }
    buf = None
    if mom:
        starts = [
            {n: u.buffers[f"{n}/momentum_buffer"] for n in names}
            if u.buffers
            else {n: np.zeros_like(np.asarray(u.params[n])) for n in names}
            for u in updates
        ]
        buf = stacked(starts, names, device)
    return Stack(p, held, {}, corr, buf, lr_rows, {})


def _same(values: Sequence[Any]) -> bool:
    first = values[0]
    if isinstance(first, Frozen):
        return all(isinstance(v, Frozen) and v.params is first.params for v in values)
    if isinstance(first, numbers.Number):
        return all(v == first for v in values)
    return all(v is first for v in values)


class Context:
    """An objective's context over a stack: a value that is the same object for every update (the
    global model MOON's clients compare with) is shared, captured once; the rest are stacked rows
    (`rows`, mapped over with the stack). A `Frozen` model is called through a `View`."""

    def __init__(
        self, clients: Sequence[Client], updates: Sequence[LocalUpdate], device: torch.device
    ) -> None:
        self.shared: dict[str, Any] = {}
        self.rows: dict[str, Any] = {}
        self.frozen: dict[str, nn.Module] = {}  # key -> the module a frozen model's rows are views of
        for key, value in updates[0].context.items():
            values = [u.context[key] for u in updates]
            if isinstance(value, Frozen):
                t = clients[0].model(value.params, slot=f"batched-frozen/{key}", arch=value.arch)
                t.eval()
                self.frozen[key] = t
                if _same(values):
                    own = {**{n: b.detach() for n, b in t.named_buffers()}, **tensors(value.params, device)}
                    self.shared[key] = View(t, own)
                else:
                    self.rows[key] = stacked([v.params for v in values], list(value.params), device)
            elif value is None or _same(values):
                self.shared[key] = self._shared(value, device)
            else:
                self.rows[key] = self._rows(key, value, values, device)

    @staticmethod
    def _shared(value: Any, device: torch.device) -> Any:
        if isinstance(value, np.ndarray):
            return torch.as_tensor(value, device=device)
        if isinstance(value, Mapping):
            return tensors(value, device)
        return value

    @staticmethod
    def _rows(key: str, value: Any, values: list[Any], device: torch.device) -> Any:
        if isinstance(value, np.ndarray):
            return torch.from_numpy(np.stack(values)).to(device)
        if isinstance(value, Mapping):
            return stacked(values, list(value), device)
        if isinstance(value, numbers.Number):
            return torch.tensor([float(v) for v in values], device=device)
        raise TypeError(
            f"context {key!r}: a {type(value).__name__} that differs between the stacked updates "
            "(give arrays, parameter dicts, numbers or Frozen models)"
        )

    def of(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """One row's context: the shared values and the row's own."""
        out = dict(self.shared)
        for key, value in row.items():
            if key in self.frozen:
                t = self.frozen[key]
                out[key] = View(t, {**{n: b.detach() for n, b in t.named_buffers()}, **value})
            else:
                out[key] = value
        return out


def unstack(
    done: Mapping[int, dict[str, dict[str, torch.Tensor]]],
    updates: Sequence[LocalUpdate],
    steps: Sequence[int],
    stacked_rows: Sequence[int],
    samples: Sequence[int],
) -> list[Trained]:
    """Each update's result from its final row (``done``): its parameters (those that did not train
    as they came), statistics and, where it keeps them, its momentum buffers. Every update's final
    values come to the host together: one copy a tensor name, not one a tensor of every update
    (under a shared GPU each copy waits its turn)."""
    parts = ("p", "acc", "buf") if any(u.keep_buffers for u in updates) else ("p", "acc")
    final = {
        part: {
            n: torch.stack([done[i][part][n] for i in range(len(updates))]).detach().cpu().numpy()
            for n in done[0][part]
        }
        for part in parts
    }
    out = []
    for i, u in enumerate(updates):
        trained = {n: v[i].copy() for n, v in final["p"].items()}
        params = {
            key: trained[key] if key in trained else np.array(val, copy=True) for key, val in u.params.items()
        }
        stats = TrainStats(
            samples=samples[i],
            loss_sum=float(final["acc"]["loss"][i]),
            correct=int(final["acc"]["correct"][i]),
            steps=steps[i],
            stacked=stacked_rows[i],
        )
        kept = None
        if u.keep_buffers:
            kept = {f"{n}/momentum_buffer": v[i].copy() for n, v in final["buf"].items()}
        out.append(Trained(params, stats, kept))
    return out
