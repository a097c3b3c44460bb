"""Batched client training: one optimizer step trains many clients' models at once.

On a GPU the papers' small CNNs are kernel-launch bound: a client's step is a few dozen tiny
kernels, and one model at a time leaves the device idle. Here the clients a host runs in one call
(`ClientHost.run_groups`: a `map`'s clients, every group of a `map_groups`) train together: their parameters are stacked along a leading client axis
and one step runs the model over every client's own mini-batch through `torch.func.functional_call`
under `torch.func.vmap` (a convolution becomes one grouped convolution, a linear layer one batched
matrix product), with every client's SGD update applied to its own slice.

The numbers are the per-client path's (`fedray.train.local_train`) up to float round-off: each
client sees the same batches in the same order (`Client.host_batches`), the same augmentation draws
and the same SGD rule (`torch.optim.SGD`'s: weight decay added to the gradient, the momentum buffer
started at the first gradient, dampening 0), a fresh optimizer per call unless buffers are given,
and its loss is the mean over its own batch (a partial last batch is padded and masked). A client
that has taken all its steps leaves the stack, so unequal client sizes cost no idle steps.

Models whose training mutates buffers or draws randomness (BatchNorm's running statistics,
dropout) are refused by `refusal`: `batched_clients: on` names the layer, `auto` falls back to the
per-client path. A client function opts in by registering its batched version
(`register_batched`), built-in and plug-in functions alike; the config key `batched_clients`
(off | on | auto; auto: on where the clients run on a GPU) decides whether hosts use them.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedray.client import Client, num_steps
from fedray.params import Params
from fedray.train import TrainStats

MODES = ("off", "on", "auto")

# fn(clients, states, msgs) -> [(reply, new_state)] per client, in the order given; msgs[i] is the
# message client i received (one object for all the clients of a `map`, one per group of `map_groups`)
BatchedFn = Callable[[Sequence[Client], Sequence[Any], Sequence[Any]], list[tuple[Any, Any]]]
_BATCHED: dict[Callable, BatchedFn] = {}


def register_batched(fn: Callable) -> Callable[[BatchedFn], BatchedFn]:
    """Declare ``batched(clients, states, msgs)`` as client function ``fn``'s batched version: the
    same replies and states as ``fn(clients[i], states[i], msgs[i])`` for each i (up to float
    round-off)."""

    def deco(batched: BatchedFn) -> BatchedFn:
        _BATCHED[fn] = batched
        return batched

    return deco


def batched_version(fn: Callable) -> BatchedFn | None:
    """``fn``'s registered batched version; a `functools.partial` of a registered function gets
    the batched version with the same keyword arguments bound."""
    if isinstance(fn, functools.partial) and not fn.args:
        base = _BATCHED.get(fn.func)
        return functools.partial(base, **fn.keywords) if base is not None else None
    return _BATCHED.get(fn)


def covered() -> list[str]:
    """The client functions that have a batched version, as module.name."""
    return sorted(f"{f.__module__}.{f.__qualname__}" for f in _BATCHED)


def refusal(model: nn.Module) -> str | None:
    """Why ``model`` cannot train batched (a layer whose training step mutates buffers or draws
    random numbers), or None."""
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats:
            return f"layer {name!r} is {type(m).__name__}, whose running statistics each client updates"
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return f"layer {name!r} is {type(m).__name__}, whose random masks each client draws"
    return None


def enabled(mode: str, device: torch.device, model: nn.Module) -> bool:
    """Whether a host on ``device`` trains batched under ``batched_clients: mode``."""
    if mode == "off":
        return False
    if mode == "auto":
        return device.type == "cuda" and refusal(model) is None
    return True  # "on": validated before the run starts (validation refuses a model it cannot do)


def trains_batched(task: Any, device: torch.device) -> bool:
    """Whether a worker of ``task`` on ``device`` trains batched (config key batched_clients, with
    the task's model): what `ClientHost` decides once, and a client function that stacks its own
    models (FedEM's and FedRC's K models) asks."""
    return enabled(task.batched_clients, device, task.build_model())


@dataclass
class Trained:
    """One client's result of `train_stacked`."""

    params: Params  # the trained model, every state-dict entry, in the start's key order
    stats: TrainStats
    buffers: dict[str, np.ndarray] | None  # `fedray.train.optimizer_state`'s form, when asked to keep


def train_stacked(
    clients: Sequence[Client],
    starts: Sequence[Params],
    rnd: int,
    *,
    prox_mu: float = 0.0,
    corrections: Sequence[Mapping[str, np.ndarray]] | None = None,
    buffers: Sequence[Mapping[str, np.ndarray] | None] | None = None,
    keep: bool = False,
    drop_last: bool = False,
    weights: Sequence[np.ndarray | None] | None = None,
    adjust: Callable[[torch.Tensor, torch.Tensor, Mapping[str, torch.Tensor]], torch.Tensor] | None = None,
    per_client: Sequence[np.ndarray] | None = None,
    fixed: bool | None = None,
    epochs: Sequence[int | None] | None = None,
) -> list[Trained]:
    """`local_train` of ``starts[i]`` on ``clients[i]`` for the task's local epochs, every client at once.

    ``prox_mu``: FedProx's (mu/2)||w - start||^2 over the parameters. ``corrections``: per-client
    tensors subtracted, times lr, after every step (SCAFFOLD's c - c_i). ``buffers``: per-client
    momentum buffers to continue from (`optimizer_state`'s form; None = a fresh optimizer), and
    ``keep`` returns the final ones. ``weights``: per-sample loss weights aligned with each
    client's training split (the weighted objective's (1/|B|) sum w_b CE_b). ``drop_last`` as in
    `local_train`. ``adjust(logits, v, params)``: the logits the loss sees, from the model's and
    client i's vector ``per_client[i]`` (FedLC's offsets, FedRS's scales); the reported logits (train
    accuracy) stay the model's. ``epochs[i]``: client i's local epochs where not None (a
    straggler's), else the task's.

    ``fixed`` (default: on a CUDA device, for data without augmentation): the stack keeps every
    client to the end, a client that has taken all its steps going on with masked batches (its
    rows are taken when it leaves), so every step has the same shapes and, on CUDA, the steps after
    two warm-up steps replay as one captured CUDA graph: one launch a step instead of hundreds,
    which is what the papers' small models are bound by. Otherwise a leaving client's rows leave
    the stack (no work wasted on a CPU, which is bound by arithmetic). The numbers are the same.
    """
    if not clients:
        return []
    task, device = clients[0].task, clients[0].device
    template = clients[0].model(starts[0], slot="batched")
    names = [n for n, _ in template.named_parameters()]
    frozen = {n: b.detach() for n, b in template.named_buffers()}
    n_all, bs = len(clients), task.batch_size
    lr, mom, wd = task.lr, task.momentum, task.weight_decay

    def stack(rows: Sequence[Mapping[str, np.ndarray]], keys: Sequence[str]) -> dict[str, torch.Tensor]:
        return {
            k: torch.from_numpy(np.stack([np.asarray(r[k], np.float32) for r in rows])).to(device)
            for k in keys
        }

    p = stack(starts, names)
    anchor = {n: t.clone() for n, t in p.items()} if prox_mu else None
    corr = None
    if corrections is not None:
        corr = {n: t * lr for n, t in stack(corrections, names).items()}
    buf = None
    if mom:  # SGD's momentum buffers: the given ones (`optimizer_state`'s form), else zeros
        given = buffers or [None] * n_all
        buf = stack([{n: g[f"{n}/momentum_buffer"] for n in names} if g else {n: np.zeros_like(s[n]) for n in names}
                     for g, s in zip(given, starts, strict=True)], names)  # fmt: skip
    w_all = None
    if weights is not None and any(w is not None for w in weights):
        w_all = [
            torch.ones(c.num_examples) if w is None else torch.as_tensor(np.asarray(w), dtype=torch.float32)
            for c, w in zip(clients, weights, strict=True)
        ]

    vec = None
    if adjust is not None:
        vec = torch.from_numpy(np.stack([np.asarray(v, np.float32) for v in per_client])).to(device)

    def loss_one(params, x, y, mask, count, w, a, v):
        out = functional_call(template, (params, frozen), (x,))
        each = nn.functional.cross_entropy(out if v is None else adjust(out, v, params), y, reduction="none")
        ce = (each * mask).sum() / count
        loss = ce if w is None else (each * w * mask).sum() / count
        if a is not None:
            loss = loss + prox_mu / 2 * sum(((params[n] - a[n]) ** 2).sum() for n in params)
        return loss, (out.argmax(1), ce)

    in_dims = (0, 0, 0, 0, 0, 0 if w_all else None, 0 if anchor else None, 0 if vec is not None else None)
    grads = vmap(grad(loss_one, has_aux=True), in_dims=in_dims)

    epochs = [task.local_epochs if e is None else e for e in (epochs or [None] * n_all)]
    steps = [num_steps(c.num_examples, bs, drop_last) * e for c, e in zip(clients, epochs, strict=True)]
    resident = task.spec.augment == "none"
    feed = (Resident if resident else Streamed)(clients, rnd, epochs, bs, drop_last, w_all, device)
    if fixed is None:
        fixed = resident and device.type == "cuda"
    if fixed and not resident:
        raise ValueError("a fixed stack needs data without augmentation (the resident feeder)")
    rows = list(range(n_all))  # the clients still stacked, in stack order
    rows_dev = torch.arange(n_all, device=device)
    # each stacked client's summed cross-entropy and correct predictions (rows: as p's)
    acc = {"loss": torch.zeros(n_all, dtype=torch.float64, device=device),
           "correct": torch.zeros(n_all, dtype=torch.int64, device=device)}  # fmt: skip
    done: dict[int, dict[str, dict[str, torch.Tensor]]] = {}  # client -> its final rows

    def row(j: int, copy: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """Stack row j's parameters, sums and buffers: views where the stack is replaced, not changed,
        after (a shrinking stack), copies where it goes on changing in place (a fixed one)."""
        take = (lambda v: v[j].clone()) if copy else (lambda v: v[j])
        return {"p": {n: take(v) for n, v in p.items()}, "acc": {n: take(v) for n, v in acc.items()},
                "buf": {n: take(v) for n, v in buf.items()} if buf is not None else {}}  # fmt: skip

    def step(x, y, mask, count, w) -> None:
        """One SGD step of every stacked client, in place."""
        g, (pred, ce) = grads(p, x, y, mask, count, w, anchor, vec)
        with torch.no_grad():  # torch.optim.SGD's rule (foreach form), every client's slice at once
            ps, gs = [p[n] for n in names], [g[n] for n in names]
            if wd:
                torch._foreach_add_(gs, ps, alpha=wd)
            if buf is not None:
                bufs = [buf[n] for n in names]
                torch._foreach_mul_(bufs, mom)
                torch._foreach_add_(bufs, gs)
                gs = bufs
            torch._foreach_add_(ps, gs, alpha=-lr)
            if corr is not None:
                torch._foreach_sub_(ps, [corr[n] for n in names])
            acc["loss"].add_(ce.double() * count.double())
            acc["correct"].add_(((pred == y) & (mask > 0)).sum(1))

    if fixed:
        t_max = max(steps)
        for t in range(t_max):
            for i in range(n_all):
                if steps[i] == t:
                    done[i] = row(i, copy=True)
            feed.run_step(t, step)
        for i in range(n_all):
            done.setdefault(i, row(i))
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
            p = {n: v.index_select(0, idx) for n, v in p.items()}
            if vec is not None:
                vec = vec.index_select(0, idx)
            for d in (anchor, corr, buf, acc):
                if d is not None:
                    for n in d:
                        d[n] = d[n].index_select(0, idx)
            rows = [rows[j] for j in stay]
            rows_dev = rows_dev.index_select(0, idx)
        step(*feed.batch(t, rows, rows_dev))
        t += 1
    for j, i in enumerate(rows):  # the clients with the most steps, still stacked
        done.setdefault(i, row(j))
    out = []
    for i in range(n_all):
        trained = {n: v.detach().cpu().numpy().copy() for n, v in done[i]["p"].items()}
        params = {
            key: trained[key] if key in trained else np.array(val, copy=True)
            for key, val in starts[i].items()
        }
        got = done[i]["acc"]
        stats = TrainStats(
            samples=feed.samples[i], loss_sum=float(got["loss"]), correct=int(got["correct"]), steps=steps[i]
        )
        kept = None
        if keep and buf is not None:
            kept = {f"{n}/momentum_buffer": v.detach().cpu().numpy().copy() for n, v in done[i]["buf"].items()}
        elif keep:
            kept = {}
        out.append(Trained(params, stats, kept))
    return out


class Resident:
    """The clients' training splits on the device once per call (no augmentation to draw), and
    each step's batches gathered by index: one gather for every client's batch."""

    def __init__(self, clients, rnd, epochs, bs, drop_last, w_all, device) -> None:
        xs, ys, offsets, total = [], [], [], 0
        for c in clients:
            x, y = c.device_train_tensors()
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
        # the plan: step t of client i takes rows index[t, i, :count[t, i]] of the stacked splits
        plans = []
        for c, off, n_epochs in zip(clients, offsets, epochs, strict=True):
            chunks = []
            for e in range(n_epochs):
                order = c.train_order(rnd, e)
                stop = num_steps(len(order), bs, drop_last) * bs
                chunks += [order[s : s + bs] + off for s in range(0, stop, bs)]
            plans.append(chunks)
        t_max, n = max((len(pl) for pl in plans), default=0), len(clients)
        index = np.zeros((t_max, n, bs), np.int64)
        count = np.ones((t_max, n), np.float32)
        for i, pl in enumerate(plans):
            for t, chunk in enumerate(pl):
                index[t, i, : len(chunk)] = chunk
                count[t, i] = len(chunk)
        self.samples = [int(sum(len(ch) for ch in pl)) for pl in plans]
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
                    warnings.warn(f"batched training: CUDA graph capture failed ({e}); stepping eagerly", stacklevel=2)
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

    def __init__(self, clients, rnd, epochs, bs, drop_last, w_all, device) -> None:
        def batches(c: Client, n_epochs: int):
            for e in range(n_epochs):
                yield from c.host_batches(rnd, e, bs, drop_last)

        self.streams = [batches(c, e) for c, e in zip(clients, epochs, strict=True)]
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
