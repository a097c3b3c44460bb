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

Models whose training mutates buffers or draws randomness (BatchNorm's running statistics,
dropout) cannot be stacked: which engine a host uses (config key `batched_clients`) is decided in
`fedray.engine.choice`.
"""

from __future__ import annotations

import contextlib
import functools
import numbers
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_leaves, tree_map

from fedray.engine.client import Client, num_steps
from fedray.engine.train import TrainStats
from fedray.engine.update import Batch, Frozen, LocalUpdate, Trained

# How a stack computes a convolution: "grouped", vmap's own batching of the module's (one grouped
# convolution of the stack's models, which cuDNN runs a kernel a group), or "im2col", every model's
# batch unfolded at once and contracted with its weights in one batched matrix product (a few
# kernels a layer whatever the stack's width). Being measured on GPUs (`python -m
# jobs.bench_batched --stacked-conv im2col`, scripts/stacked_cnn.py); not a config key until it pays.
CONVS = ("grouped", "im2col")
STACKED_CONV = "grouped"

# Whether a stack's step (forward, backward and SGD update of every model) runs compiled by
# `torch.compile` (one graph, its elementwise operations fused: about 90 operations a step eager,
# each a kernel on a GPU, where a step's time is mostly those kernels' fixed cost; docs/benchmark.md).
# The numbers move by float round-off (3.6e-6 after an epoch of 8 simple CNNs on the CPU). The first
# step of each stack shape in a process compiles (about 40 s on a 2-core CPU, 6 s from inductor's
# cache). Being measured on GPUs (`python -m jobs.bench_batched --stacked-compile`); not a config
# key until it pays. On a CPU it does not (an epoch of 8 simple CNNs: 1.1 s compiled in a fixed stack,
# 0.9 s per client).
STACKED_COMPILE = False


def conv2d_im2col(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> torch.Tensor:
    """``F.conv2d`` as im2col and a matrix product: the same values up to float round-off."""

    def pair(v: Any) -> tuple[int, int]:
        return (v, v) if isinstance(v, int) else tuple(v)

    if groups != 1 or input.dim() != 4 or isinstance(padding, str):
        return nn.functional.conv2d(input, weight, bias, stride, padding, dilation, groups)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = weight.shape[-2:], pair(stride), pair(padding), pair(dilation)
    b, _, h, w = input.shape
    out_h = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = nn.functional.unfold(input, (kh, kw), (dh, dw), (ph, pw), (sh, sw))  # [B, C*kh*kw, L]
    out = torch.einsum("bkl,ok->bol", cols, weight.flatten(1))
    if bias is not None:
        out = out + bias[None, :, None]
    return out.reshape(b, weight.shape[0], out_h, out_w)


class _Im2col(torch.overrides.TorchFunctionMode):
    """Every ``F.conv2d`` called inside computed by `conv2d_im2col`. Inside, CUDA's matrix products
    may use TF32 where its convolutions may (``cuda_tf32``; fedray keeps matrix products float32
    otherwise), so the products that replace the convolutions run at the convolutions' precision
    (the linear layers of the step too)."""

    def __enter__(self):
        self._tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32
        return super().__enter__()

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self._tf32
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is nn.functional.conv2d:
            return conv2d_im2col(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def conv_mode() -> Any:
    """The context a stacked step's convolutions run in (`STACKED_CONV`)."""
    if STACKED_CONV not in CONVS:
        raise ValueError(f"fedray.engine.batched.STACKED_CONV must be one of {CONVS}, got {STACKED_CONV!r}")
    return _Im2col() if STACKED_CONV == "im2col" else contextlib.nullcontext()


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


def _same(values: Sequence[Any]) -> bool:
    first = values[0]
    if isinstance(first, Frozen):
        return all(isinstance(v, Frozen) and v.params is first.params for v in values)
    if isinstance(first, numbers.Number):
        return all(v == first for v in values)
    return all(v is first for v in values)


def _tensors(params: Mapping[str, Any], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(np.asarray(v), device=device) for k, v in params.items()}


def _stacked(
    rows: Sequence[Mapping[str, Any]], keys: Sequence[str], device: torch.device
) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.stack([np.asarray(r[k]) for r in rows])).to(device) for k in keys}


def _per_row(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A value a stack row, shaped to scale ``like`` (a stacked tensor, rows first) row by row."""
    return values.view(-1, *([1] * (like.dim() - 1)))


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


def train_stacked(
    clients: Sequence[Client], updates: Sequence[LocalUpdate], fixed: bool | None = None
) -> list[Trained]:
    """``updates[i]`` trained on ``clients[i]``, every update at once; the updates share a
    `signature` (a client may appear more than once: the K models of one client).

    ``fixed`` (default: on a CUDA device, for data without augmentation): the stack's rows are lanes
    (`lanes_of`), each running its updates one after another, the next copied into the lane in place
    when one has taken its steps (its rows taken first), and a lane whose updates are done going on
    with masked batches to the end. So every step has the same shapes and, on CUDA, the steps after
    two warm-up steps replay as one captured CUDA graph: one launch a step instead of hundreds. A
    step's time grows with the stack's width (docs/benchmark.md), so the lanes keep it as narrow as
    the real work allows on skewed partitions. Otherwise a leaving update's rows leave the stack (no
    work wasted on a CPU, which is bound by arithmetic). The numbers are the same.
    """
    if not clients:
        return []
    first = updates[0]
    task, device = clients[0].task, clients[0].device
    template = clients[0].model(first.params, slot="batched", arch=first.arch)
    all_names = [n for n, _ in template.named_parameters()]
    names = all_names if first.trainable is None else [n for n in all_names if n in set(first.trainable)]
    fixed_names = [n for n in all_names if n not in set(names)]
    module_buffers = {n: b.detach() for n, b in template.named_buffers()}
    n_all, bs = len(clients), task.batch_size
    lr, mom, wd = task.lr, task.momentum, task.weight_decay
    # each update's learning rate: its client's task's (the runs of a pack may differ, `fedray.sweeps.pack`);
    # a row of the stack each where they differ, else the one number (as SGD takes it)
    lrs = [c.task.lr for c in clients]
    lr_rows = (
        None if all(v == lr for v in lrs) else {"lr": torch.tensor(lrs, dtype=torch.float32, device=device)}
    )

    p = _stacked([u.params for u in updates], names, device)
    held = _stacked([u.params for u in updates], fixed_names, device)  # parameters that do not train
    corr = None
    if first.correction is not None:
        keys = [k for k in first.correction if k in set(names)]
        corr = {
            n: t * (lr if lr_rows is None else _per_row(lr_rows["lr"], t))
            for n, t in _stacked([u.correction for u in updates], keys, device).items()
        }
    buf = None
    if mom:  # SGD's momentum buffers: the given ones (`optimizer_state`'s form), else zeros
        buf = _stacked(
            [
                {n: u.buffers[f"{n}/momentum_buffer"] for n in names}
                if u.buffers
                else {n: np.zeros_like(np.asarray(u.params[n])) for n in names}
                for u in updates
            ],
            names,
            device,
        )

    # the context: a value the same for every update is shared (captured, not mapped over); the
    # rest are stacked rows
    shared: dict[str, Any] = {}
    rows_ctx: dict[str, Any] = {}
    frozen_templates: dict[str, nn.Module] = {}
    for key, value in first.context.items():
        values = [u.context[key] for u in updates]
        if isinstance(value, Frozen):
            t = clients[0].model(value.params, slot=f"batched-frozen/{key}", arch=value.arch)
            t.eval()
            frozen_templates[key] = t
            if _same(values):
                shared[key] = View(
                    t, {**{n: b.detach() for n, b in t.named_buffers()}, **_tensors(value.params, device)}
                )
            else:
                rows_ctx[key] = _stacked([v.params for v in values], list(value.params), device)
        elif value is None or _same(values):
            if isinstance(value, np.ndarray):
                shared[key] = torch.as_tensor(value, device=device)
            elif isinstance(value, Mapping):
                shared[key] = _tensors(value, device)
            else:
                shared[key] = value
        elif isinstance(value, np.ndarray):
            rows_ctx[key] = torch.from_numpy(np.stack(values)).to(device)
        elif isinstance(value, Mapping):
            rows_ctx[key] = _stacked(values, list(value), device)
        elif isinstance(value, numbers.Number):
            rows_ctx[key] = torch.tensor([float(v) for v in values], device=device)
        else:
            raise TypeError(
                f"context {key!r}: a {type(value).__name__} that differs between the stacked updates "
                "(give arrays, parameter dicts, numbers or Frozen models)"
            )

    def context_of(row: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(shared)
        for key, value in row.items():
            if key in frozen_templates:
                t = frozen_templates[key]
                out[key] = View(t, {**{n: b.detach() for n, b in t.named_buffers()}, **value})
            else:
                out[key] = value
        return out

    objective = first.objective

    def loss_one(params, held_row, x, y, mask, count, w, ctx_row):
        model = View(template, {**module_buffers, **held_row, **params})
        step = objective(model, Batch(x, y, w, mask, count), context_of(ctx_row))
        return step.loss, (step.logits.argmax(1), step.ce)

    with_w = first.weights is not None
    in_dims = (0, 0, 0, 0, 0, 0, 0 if with_w else None, 0)
    grads = vmap(grad(loss_one, has_aux=True), in_dims=in_dims)

    epochs = [task.local_epochs if u.epochs is None else u.epochs for u in updates]
    steps = [
        min(
            num_steps(c.num_examples, bs, first.drop_last) * e,
            u.max_steps if u.max_steps is not None else 1 << 62,
        )
        for c, u, e in zip(clients, updates, epochs, strict=True)
    ]
    w_all = None
    if with_w:
        w_all = [torch.as_tensor(np.asarray(u.weights), dtype=torch.float32) for u in updates]
    inputs = None if first.inputs is None else [u.inputs for u in updates]
    resident = task.spec.augment == "none" or inputs is not None
    if fixed is None:
        fixed = resident and device.type == "cuda"
    if fixed and not resident:
        raise ValueError("a fixed stack needs data without augmentation (the resident feeder)")
    # a fixed stack's rows are lanes that run their updates one after another; a shrinking stack
    # has one row an update
    lanes = lanes_of(steps) if fixed else [[i] for i in range(n_all)]
    rounds = [u.round for u in updates]
    if resident:
        feed = Resident(clients, rounds, epochs, steps, bs, first.drop_last, w_all, device, inputs, lanes)
    else:
        feed = Streamed(clients, rounds, epochs, steps, bs, first.drop_last, w_all, device)
    rows = list(range(n_all))  # the updates still stacked, in stack order
    rows_dev = torch.arange(n_all, device=device)
    # each stacked update's summed cross-entropy and correct predictions (rows: as p's)
    acc = {
        "loss": torch.zeros(n_all, dtype=torch.float64, device=device),
        "correct": torch.zeros(n_all, dtype=torch.int64, device=device),
    }
    done: dict[int, dict[str, dict[str, torch.Tensor]]] = {}  # update -> its final rows

    def row(j: int, copy: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """Stack row j's parameters, sums and buffers: views where the stack is replaced, not changed,
        after (a shrinking stack), copies where it goes on changing in place (a fixed one)."""
        take = (lambda v: v[j].clone()) if copy else (lambda v: v[j])
        return {
            "p": {n: take(v) for n, v in p.items()},
            "acc": {n: take(v) for n, v in acc.items()},
            "buf": {n: take(v) for n, v in buf.items()} if buf is not None else {},
        }

    def step(x, y, mask, count, w) -> None:
        """One SGD step of every stacked update, in place."""
        with conv_mode():
            g, (pred, ce) = grads(p, held, x, y, mask, count, w, rows_ctx)
        with torch.no_grad():  # torch.optim.SGD's rule (foreach form), every update's slice at once
            ps, gs = [p[n] for n in names], [g[n] for n in names]
            if wd:
                torch._foreach_add_(gs, ps, alpha=wd)
            if buf is not None:
                bufs = [buf[n] for n in names]
                torch._foreach_mul_(bufs, mom)
                torch._foreach_add_(bufs, gs)
                gs = bufs
            if lr_rows is None:
                torch._foreach_add_(ps, gs, alpha=-lr)
            else:
                torch._foreach_sub_(ps, [g * _per_row(lr_rows["lr"], g) for g in gs])
            if corr is not None:
                torch._foreach_sub_([p[n] for n in corr], list(corr.values()))
            acc["loss"].add_(ce.double() * count.double())
            acc["correct"].add_(((pred == y) & (mask > 0)).sum(1))

    if STACKED_COMPILE:  # one graph (fullgraph): a break would split the fusion and the CUDA graph's step
        step = torch.compile(step, fullgraph=True)

    stacked = [bs * k for k in steps]  # the sample rows each update's share of the stack steps
    if fixed:
        # one row a lane, holding its current update; the next is copied in, in place (the CUDA
        # graph's tensors stay the same), when one has taken its steps
        firsts = torch.tensor([lane[0] for lane in lanes], device=device)
        sources = (p, held, rows_ctx, corr, buf, lr_rows)  # every update's start
        take = functools.partial(torch.index_select, dim=0, index=firsts)
        p, held, rows_ctx, corr, buf, lr_rows = (None if d is None else tree_map(take, d) for d in sources)
        acc = {k: v.index_select(0, firsts) for k, v in acc.items()}
        lanes_now = (p, held, rows_ctx, corr, buf, lr_rows)
        pairs = [
            pair
            for d, source in zip(lanes_now, sources, strict=True)
            if d is not None
            for pair in zip(tree_leaves(d), tree_leaves(source), strict=True)
        ]
        length = max(steps, default=0)
        at, start = [0] * len(lanes), [0] * len(lanes)  # each lane's current update and its first step
        for t in range(length + 1):
            for j, lane in enumerate(lanes):
                while at[j] < len(lane) and start[j] + steps[lane[at[j]]] == t:
                    done[lane[at[j]]] = row(j, copy=True)
                    at[j], start[j] = at[j] + 1, t
                    if at[j] < len(lane):
                        for into, source in pairs:
                            into[j].copy_(source[lane[at[j]]])
                        for v in acc.values():
                            v[j].zero_()
                    else:  # the lane steps masked to the end: counted as the last update's work
                        stacked[lane[-1]] += bs * (length - t)
            if t < length:
                feed.run_step(t, step)
        rows = []
    t = 0
    while rows:
        leaving = [j for j, i in enumerate(rows) if steps[i] <= t]
        if leaving:
            for j in leaving:
                done[rows[j]] = row(j)
            gone = set(leaving)
            stay = [j for j in range(len(rows)) if j not in gone]
            if not stay:
                break
            idx = torch.tensor(stay, device=device)
            keep_rows = functools.partial(torch.index_select, dim=0, index=idx)
            p, held, rows_ctx = (tree_map(keep_rows, d) for d in (p, held, rows_ctx))
            for d in (corr, buf, acc, lr_rows):
                if d is not None:
                    for n in d:
                        d[n] = d[n].index_select(0, idx)
            rows = [rows[j] for j in stay]
            rows_dev = rows_dev.index_select(0, idx)
        step(*feed.batch(t, rows, rows_dev))
        t += 1
    for j, i in enumerate(rows):  # the updates with the most steps, still stacked
        done.setdefault(i, row(j))
    # every update's final values to the host together: one copy a tensor name, not one a tensor
    # of every update (under a shared GPU each copy waits its turn)
    parts = ("p", "acc", "buf") if any(u.keep_buffers for u in updates) else ("p", "acc")
    final = {
        part: {
            n: torch.stack([done[i][part][n] for i in range(n_all)]).detach().cpu().numpy()
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
            samples=feed.samples[i],
            loss_sum=float(final["acc"]["loss"][i]),
            correct=int(final["acc"]["correct"][i]),
            steps=steps[i],
            stacked=stacked[i],
        )
        kept = None
        if u.keep_buffers:
            kept = {f"{n}/momentum_buffer": v[i].copy() for n, v in final["buf"].items()}
        out.append(Trained(params, stats, kept))
    return out


class Resident:
    """The clients' training splits on the device once per call (no augmentation to draw), and
    each step's batches gathered by index: one gather for every client's batch."""

    def __init__(self, clients, rounds, epochs, steps, bs, drop_last, w_all, device, inputs, lanes) -> None:
        xs, ys, offsets, total = [], [], [], 0
        for i, c in enumerate(clients):
            if inputs is None:
                x, y = c.device_train_tensors()
            else:  # precomputed inputs in place of the images
                x = torch.from_numpy(np.asarray(inputs[i])).to(device)
                y = torch.from_numpy(c.train_labels()).to(device)
            xs.append(x)
            ys.append(y)
            offsets.append(total)
            total += len(y)
        self.x = torch.cat(xs) if xs else torch.zeros(0, device=device)
        self.y = torch.cat(ys) if ys else torch.zeros(0, dtype=torch.int64, device=device)
        self.device = device
        self._t = torch.zeros(1, dtype=torch.int64, device=device)  # a fixed stack's step, on the device
        self._side = self._graph = None
        self.w = torch.cat(w_all).to(device) if w_all else None
        # the plan: step t of update i takes rows index[t, i, :count[t, i]] of the stacked splits
        plans = []
        for c, rnd, off, n_epochs, n_steps in zip(clients, rounds, offsets, epochs, steps, strict=True):
            chunks = []
            for e in range(n_epochs):
                order = c.train_order(rnd, e)
                stop = num_steps(len(order), bs, drop_last) * bs
                chunks += [order[s : s + bs] + off for s in range(0, stop, bs)]
            plans.append(chunks[:n_steps])
        self.samples = [int(sum(len(ch) for ch in pl)) for pl in plans]
        # a row's plan: its lane's updates' plans one after another
        plans = [sum((plans[i] for i in lane), []) for lane in lanes]
        t_max, n = max((len(pl) for pl in plans), default=0), len(plans)
        index = np.zeros((t_max, n, bs), np.int64)
        count = np.ones((t_max, n), np.float32)
        for i, pl in enumerate(plans):
            for t, chunk in enumerate(pl):
                index[t, i, : len(chunk)] = chunk
                count[t, i] = len(chunk)
        self.index = torch.from_numpy(index).to(device)
        self.count = torch.from_numpy(count).to(device)
        self.mask = (torch.arange(bs, device=device) < self.count[..., None]).float()

    WARMUP = 2  # eager steps before a fixed stack's capture (the CUDA graph notes' warm-up)

    def run_step(self, t: int, step: Callable[..., None]) -> None:
        """Step t of a fixed stack (every client in it): `step` on the step's batches, eagerly for
        the first steps, then on CUDA as one captured graph replayed (the batches are gathered
        inside it, from the step number held on the device)."""
        self._t.fill_(t)
        if self.device.type != "cuda" or self._graph is False:
            step(*self._fixed_batch())
        elif t < self.WARMUP:  # on a side stream, as graph capture asks
            if self._side is None:
                self._side = torch.cuda.Stream(self.device)
            self._side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._side):
                step(*self._fixed_batch())
            torch.cuda.current_stream(self.device).wait_stream(self._side)
        else:
            if self._graph is None:
                graph = torch.cuda.CUDAGraph()
                try:
                    with torch.cuda.graph(graph):
                        step(*self._fixed_batch())
                except RuntimeError as e:  # nothing ran: capture records only
                    warnings.warn(
                        f"batched training: CUDA graph capture failed ({e}); stepping eagerly", stacklevel=2
                    )
                    self._graph = False
                    step(*self._fixed_batch())
                    return
                self._graph = graph
            self._graph.replay()

    def _fixed_batch(self):
        at = self.index.index_select(0, self._t)[0]
        return (
            self.x[at],
            self.y[at],
            self.mask.index_select(0, self._t)[0],
            self.count.index_select(0, self._t)[0],
            self.w[at] if self.w is not None else None,
        )

    def batch(self, t: int, rows: list[int], rows_dev: torch.Tensor):
        at = self.index[t].index_select(0, rows_dev)
        w = self.w[at] if self.w is not None else None
        return (
            self.x[at],
            self.y[at],
            self.mask[t].index_select(0, rows_dev),
            self.count[t].index_select(0, rows_dev),
            w,
        )


class Streamed:
    """Each client's batches as `Client.host_batches` draws them (its augmentation included),
    padded and stacked on the host, then moved to the device."""

    def __init__(self, clients, rounds, epochs, steps, bs, drop_last, w_all, device) -> None:
        def batches(c: Client, rnd: int, n_epochs: int):
            for e in range(n_epochs):
                yield from c.host_batches(rnd, e, bs, drop_last)

        self.streams = [batches(c, r, e) for c, r, e in zip(clients, rounds, epochs, strict=True)]
        self.shape = tuple(clients[0].task.spec.input_shape)
        self.bs, self.w_all, self.device = bs, w_all, device
        self.samples = [0] * len(clients)

    def batch(self, t: int, rows: list[int], rows_dev: torch.Tensor):
        k, bs = len(rows), self.bs
        x = torch.zeros((k, bs, *self.shape))
        y = torch.zeros((k, bs), dtype=torch.int64)
        mask = torch.zeros((k, bs))
        count = torch.empty(k)
        w = torch.zeros((k, bs)) if self.w_all else None
        for j, i in enumerate(rows):
            xb, yb, pos = next(self.streams[i])
            m = len(yb)
            x[j, :m], y[j, :m], mask[j, :m], count[j] = xb, yb, 1.0, m
            if w is not None:
                w[j, :m] = self.w_all[i][torch.from_numpy(pos)]
            self.samples[i] += m
        to = [v.to(self.device, non_blocking=True) for v in (x, y, mask, count)]
        return (*to, None if w is None else w.to(self.device, non_blocking=True))
