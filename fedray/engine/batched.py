"""The stacked engine: many clients' `fedray.engine.update.LocalUpdate`s trained as one model.

On a GPU the papers' small CNNs are kernel-launch bound: a client's step is a few dozen tiny
kernels, and one model at a time leaves the device idle. Here the updates a host's clients yield in
one call (`ClientHost.run_groups`: a `map`'s clients, every group of a `map_groups`, a relay's hops,
the K models of a FedEM client) train together: their parameters are stacked along a leading axis
and one step runs every update's objective on its own mini-batch through
`torch.func.functional_call` under `torch.func.vmap` (a convolution becomes one grouped
convolution, a linear layer one batched matrix product), with every update's SGD step applied to its
own slice.

The numbers are the per-client engine's (`fedray.engine.train.train_update`) up to float round-off: each
update sees the same batches in the same order (`Client.host_batches`), the same augmentation draws
and the same SGD rule (`torch.optim.SGD`'s: weight decay added to the gradient, the momentum buffer
started at the first gradient, dampening 0), a fresh optimizer unless buffers are given, and its
loss reduced over its own batch (a partial last batch is padded and masked: `Batch`). The objective
is the description's own, called with a `View` of the stacked model in place of the module.

A stack holds updates of one shape (`signature`: architecture, objective, trainable parameters, the
kinds of their context, weights, correction, inputs); the host stacks each such set. A context
value that is the same object for every update of a stack (the global model MOON's clients compare
with) is shared, not copied per row.

`train_stacked` ties the parts: the stack built (`fedray.engine.stack.build_stack`, with the
objective's `Context`), its batches (`fedray.engine.feeds`), the step (`sgd_step`), the steps run
in lanes (`run_in_lanes`, a fixed stack) or with finished rows leaving (`run_shrinking`), and the
stack taken apart again (`fedray.engine.stack.unstack`). Two ways to run the step that are being
measured on GPUs are off by default (`fedray.engine.step_options`).

Models whose training mutates buffers or draws randomness (BatchNorm's running statistics,
dropout) cannot be stacked: which engine a host uses (config key `batched_clients`) is decided in
`fedray.engine.choice`.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.func import grad, vmap
from torch.utils._pytree import tree_leaves, tree_map

from fedray.engine import step_options
from fedray.engine.client import Client, num_steps
from fedray.engine.feeds import Resident, Streamed
from fedray.engine.stack import Context, Stack, View, build_stack, per_row, unstack
from fedray.engine.update import Batch, Frozen, LocalUpdate, Trained, checked_step

__all__ = ["View", "lanes_of", "signature", "train_stacked"]


def _callable_key(fn: Any) -> Any:
    """A hashable identity of an objective: a `functools.partial` by its function and arguments."""
    if isinstance(fn, functools.partial):
        try:
            return (_callable_key(fn.func), fn.args, tuple(sorted(fn.keywords.items())))
        except TypeError:  # unhashable arguments: the object itself
            return id(fn)
    return fn


def _kind(value: Any) -> Any:
    """What a context value is, for `signature` (values of one kind stack together)."""
    if value is None:
        return None
    if isinstance(value, Frozen):
        return ("frozen", value.arch)
    if isinstance(value, np.ndarray):
        return ("array", value.shape, value.dtype.str)
    if isinstance(value, Mapping):
        return ("params", tuple(value))
    if isinstance(value, numbers.Number):
        return "scalar"
    return ("object", type(value).__qualname__)


def signature(update: LocalUpdate) -> Any:
    """Updates with equal signatures can share a stack."""
    return (
        update.arch,
        _callable_key(update.objective),
        None if update.trainable is None else tuple(update.trainable),
        tuple((k, _kind(v)) for k, v in update.context.items()),
        update.weights is not None,
        None if update.correction is None else tuple(update.correction),
        None if update.inputs is None else update.inputs.shape[1:],
        update.drop_last,
    )


def lanes_of(steps: Sequence[int]) -> list[list[int]]:
    """The lanes of a fixed stack: which updates (by index into ``steps``, their step counts) each
    row runs, one after another. No lane is longer than the longest update, and lanes are few:
    first-fit decreasing bin packing, so on skewed partitions the stack is as wide as the real work
    needs (Dir(0.1)'s 40 clients: a third as many rows) instead of one row an update, every row
    stepping as long as the longest."""
    capacity = max(steps, default=0)
    lanes: list[list[int]] = []
    used: list[int] = []
    for i in sorted(range(len(steps)), key=lambda i: -steps[i]):
        for j in range(len(lanes)):
            if used[j] + steps[i] <= capacity:
                lanes[j].append(i)
                used[j] += steps[i]
                break
        else:
            lanes.append([i])
            used.append(steps[i])
    return lanes


def gradients(
    template: torch.nn.Module, objective: Callable, context: Context, with_weights: bool
) -> Callable:
    """Every row's gradient of its own objective on its own batch, and its predictions and
    cross-entropy: ``grad`` of one row's loss through a `View` of ``template``, mapped over the
    stack's rows by ``vmap``."""
    module_buffers = {n: b.detach() for n, b in template.named_buffers()}

    def loss_one(params, held_row, x, y, mask, count, w, ctx_row):
        model = View(template, {**module_buffers, **held_row, **params})
        step = checked_step(objective(model, Batch(x, y, w, mask, count), context.of(ctx_row)), objective)
        return step.loss, (step.logits.argmax(1), step.ce)

    in_dims = (0, 0, 0, 0, 0, 0, 0 if with_weights else None, 0)
    return vmap(grad(loss_one, has_aux=True), in_dims=in_dims)


def sgd_step(
    stack: Stack,
    grads: Callable,
    names: Sequence[str],
    lr: float,
    mom: float,
    wd: float,
    options: step_options.StepOptions | None = None,
) -> Callable:
    """One SGD step of every stacked update, in place: `torch.optim.SGD`'s rule (foreach form) on
    every update's slice at once, each row at its own learning rate where rows differ, then the
    corrections; and each row's sums. Compiled, and its convolutions computed, as ``options`` ask
    (the engine's `fedray.engine.step_options`; None: this process's)."""

    def step(x, y, mask, count, w) -> None:
        with step_options.conv_mode(options):
            g, (pred, ce) = grads(stack.p, stack.held, x, y, mask, count, w, stack.rows_ctx)
        with torch.no_grad():
            ps, gs = [stack.p[n] for n in names], [g[n] for n in names]
            if wd:
                torch._foreach_add_(gs, ps, alpha=wd)
            if stack.buf is not None:
                bufs = [stack.buf[n] for n in names]
                torch._foreach_mul_(bufs, mom)
                torch._foreach_add_(bufs, gs)
                gs = bufs
            if stack.lr_rows is None:
                torch._foreach_add_(ps, gs, alpha=-lr)
            else:
                torch._foreach_sub_(ps, [g * per_row(stack.lr_rows["lr"], g) for g in gs])
            if stack.corr is not None:
                torch._foreach_sub_([stack.p[n] for n in stack.corr], list(stack.corr.values()))
            stack.acc["loss"].add_(ce.double() * count.double())
            stack.acc["correct"].add_(((pred == y) & (mask > 0)).sum(1))

    return step_options.compiled(step, options)


def run_in_lanes(
    stack: Stack,
    lanes: list[list[int]],
    steps: Sequence[int],
    feed: Resident,
    step: Callable,
    stacked_rows: list[int],
    bs: int,
) -> dict[int, dict[str, dict[str, torch.Tensor]]]:
    """A fixed stack's steps: one row a lane, holding its current update; the next is copied in,
    in place (the CUDA graph's tensors stay the same), when one has taken its steps, and a lane
    whose updates are done steps masked to the end (counted as its last update's work, in
    ``stacked_rows``). Returns each update's final row."""
    device = feed.device
    done: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
    firsts = torch.tensor([lane[0] for lane in lanes], device=device)
    sources = stack.parts()  # every update's start
    take = functools.partial(torch.index_select, dim=0, index=firsts)
    stack.p, stack.held, stack.rows_ctx, stack.corr, stack.buf, stack.lr_rows = (
        None if d is None else tree_map(take, d) for d in sources
    )
    stack.acc = {k: v.index_select(0, firsts) for k, v in stack.acc.items()}
    pairs = [
        pair
        for d, source in zip(stack.parts(), sources, strict=True)
        if d is not None
        for pair in zip(tree_leaves(d), tree_leaves(source), strict=True)
    ]
    length = max(steps, default=0)
    at, start = [0] * len(lanes), [0] * len(lanes)  # each lane's current update and its first step
    for t in range(length + 1):
        for j, lane in enumerate(lanes):
            while at[j] < len(lane) and start[j] + steps[lane[at[j]]] == t:
                done[lane[at[j]]] = stack.row(j, copy=True)
                at[j], start[j] = at[j] + 1, t
                if at[j] < len(lane):
                    for into, source in pairs:
                        into[j].copy_(source[lane[at[j]]])
                    for v in stack.acc.values():
                        v[j].zero_()
                else:
                    stacked_rows[lane[-1]] += bs * (length - t)
        if t < length:
            feed.run_step(t, step)
    return done


def run_shrinking(
    stack: Stack, steps: Sequence[int], feed: Resident | Streamed, step: Callable, device: torch.device
) -> dict[int, dict[str, dict[str, torch.Tensor]]]:
    """A stack whose rows leave as their updates have taken their steps (no work wasted on a CPU,
    which is bound by arithmetic). Returns each update's final row."""
    done: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
    rows = list(range(len(steps)))  # the updates still stacked, in stack order
    rows_dev = torch.arange(len(steps), device=device)
    t = 0
    while rows:
        leaving = [j for j, i in enumerate(rows) if steps[i] <= t]
        if leaving:
            for j in leaving:
                done[rows[j]] = stack.row(j)
            gone = set(leaving)
            stay = [j for j in range(len(rows)) if j not in gone]
            if not stay:
                break
            idx = torch.tensor(stay, device=device)
            stack.take_rows(idx)
            rows = [rows[j] for j in stay]
            rows_dev = rows_dev.index_select(0, idx)
        step(*feed.batch(t, rows, rows_dev))
        t += 1
    for j, i in enumerate(rows):  # the updates with the most steps, still stacked
        done.setdefault(i, stack.row(j))
    return done


def train_stacked(
    clients: Sequence[Client],
    updates: Sequence[LocalUpdate],
    fixed: bool | None = None,
    options: step_options.StepOptions | None = None,
) -> list[Trained]:
    """``updates[i]`` trained on ``clients[i]``, every update at once; the updates share a
    `signature` (a client may appear more than once: the K models of one client).

    ``fixed`` (default: on a CUDA device, for data without augmentation): the stack's rows are lanes
    (`lanes_of`), each running its updates one after another (`run_in_lanes`). So every step has
    the same shapes and, on CUDA, the steps after two warm-up steps replay as one captured CUDA
    graph: one launch a step instead of hundreds. A step's time grows with the stack's width
    (docs/benchmark.md), so the lanes keep it as narrow as the real work allows on skewed
    partitions. Otherwise a leaving update's rows leave the stack (`run_shrinking`). The numbers
    are the same. ``options``: the step's (its engine's, `fedray.engine.step_options`; None: this
    process's).
    """
    if not clients:
        return []
    first = updates[0]
    task, device = clients[0].task, clients[0].device
    template = clients[0].model(first.params, slot="batched", arch=first.arch)
    all_names = [n for n, _ in template.named_parameters()]
    names = all_names if first.trainable is None else [n for n in all_names if n in set(first.trainable)]
    fixed_names = [n for n in all_names if n not in set(names)]
    stack = build_stack(clients, updates, names, fixed_names, device)
    context = Context(clients, updates, device)
    stack.rows_ctx = context.rows
    grads = gradients(template, first.objective, context, first.weights is not None)

    bs = task.batch_size
    epochs = [task.local_epochs if u.epochs is None else u.epochs for u in updates]
    steps = [
        min(
            num_steps(c.num_examples, bs, first.drop_last) * e,
            u.max_steps if u.max_steps is not None else 1 << 62,
        )
        for c, u, e in zip(clients, updates, epochs, strict=True)
    ]
    w_all = None
    if first.weights is not None:
        w_all = [torch.as_tensor(np.asarray(u.weights), dtype=torch.float32) for u in updates]
    inputs = None if first.inputs is None else [u.inputs for u in updates]
    resident = task.spec.augment == "none" or inputs is not None
    if fixed is None:
        fixed = resident and device.type == "cuda"
    if fixed and not resident:
        raise ValueError("a fixed stack needs data without augmentation (the resident feeder)")
    lanes = lanes_of(steps) if fixed else [[i] for i in range(len(updates))]
    rounds = [u.round for u in updates]
    if resident:
        feed = Resident(clients, rounds, epochs, steps, bs, first.drop_last, w_all, device, inputs, lanes)
    else:
        feed = Streamed(clients, rounds, epochs, steps, bs, first.drop_last, w_all, device)
    stack.acc = {
        "loss": torch.zeros(len(updates), dtype=torch.float64, device=device),
        "correct": torch.zeros(len(updates), dtype=torch.int64, device=device),
    }
    step = sgd_step(stack, grads, names, task.lr, task.momentum, task.weight_decay, options)
    stacked_rows = [bs * k for k in steps]  # the sample rows each update's share of the stack steps
    if fixed:
        done = run_in_lanes(stack, lanes, steps, feed, step, stacked_rows, bs)
    else:
        done = run_shrinking(stack, steps, feed, step, device)
    return unstack(done, updates, steps, stacked_rows, feed.samples)
