"""Where a stack's batches come from: `Resident` (the clients' splits on the device once, each
step's batches gathered by index; a fixed stack's steps replayed as one CUDA graph) and `Streamed`
(each client's batches as it draws them, its augmentation included, padded and stacked on the
host)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch

from fedray.engine.client import Client, num_steps


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
