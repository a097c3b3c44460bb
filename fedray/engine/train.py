"""The per-client engine of a `fedray.engine.update.LocalUpdate` (NIID-Bench's local SGD,
docs/algorithms/common.md#the-fedavg-core); the evaluation loops are `fedray.engine.evaluation`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.sgd import sgd as sgd_rule

from fedray.config import seeding
from fedray.engine.client import Client
from fedray.engine.stats import TrainStats
from fedray.engine.update import Batch, Frozen, LocalUpdate, Trained, checked_step
from fedray.params import get_params


class SGD:
    """`torch.optim.SGD` (dampening 0, no Nesterov) as the per-client engine runs it: each step is
    torch's own functional form of that optimizer's rule (`torch.optim.sgd.sgd`) given what
    `torch.optim.SGD.step` gives it, so the numbers are the optimizer's bit for bit
    (tests/engine/test_train.py), and the momentum buffers sit where the optimizer keeps them
    (``state[p]["momentum_buffer"]``, the parameters in ``param_groups``).

    Why not the optimizer itself: `torch.optim.Optimizer`'s methods are wrapped for TorchDynamo, and
    the first call imports ``torch._dynamo`` (about 1.1 s of CPU), in every process that trains:
    each client actor, each pack worker, each command. The functional form imports nothing."""

    def __init__(
        self, params: Iterable[nn.Parameter], lr: float, momentum: float, weight_decay: float
    ) -> None:
        self.param_groups = [{"params": list(params)}]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = defaultdict(dict)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay

    def zero_grad(self) -> None:
        """The gradients dropped (`torch.optim.Optimizer.zero_grad`'s default, ``set_to_none``)."""
        for p in self.param_groups[0]["params"]:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        params = [p for p in self.param_groups[0]["params"] if p.grad is not None]
        buffers = [self.state[p].get("momentum_buffer") for p in params] if self.momentum else []
        sgd_rule(
            params,
            [p.grad for p in params],
            buffers,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            lr=self.lr,
            dampening=0.0,
            nesterov=False,
            maximize=False,
        )
        if self.momentum:  # without momentum the optimizer keeps no buffer
            for p, buf in zip(params, buffers, strict=True):
                self.state[p]["momentum_buffer"] = buf


def sgd(params: Iterable[nn.Parameter], client: Client) -> SGD:
    """The task's SGD (lr, momentum, weight decay) over ``params``."""
    t = client.task
    return SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)


# Batches of one epoch: epoch -> (inputs, labels, positions in the training split) triples.
Batches = Callable[[int], Iterable[tuple[torch.Tensor, torch.Tensor, np.ndarray | None]]]


def train_update(client: Client, update: LocalUpdate, draw: int = 0) -> Trained:
    """The per-client engine: ``update`` run on one model with `torch.optim.SGD`'s rule (`SGD`: the
    task's lr, momentum and weight decay; fresh unless the update gives buffers), one batch at a time.

    The model is the client's module for the update's architecture, loaded with its start; its
    parameters outside ``trainable`` are fixed (no gradient, not in the optimizer). Each epoch walks
    the client's shuffled training batches (or ``inputs`` in the same order and sizes), stopping
    after ``max_steps``; after every step the ``correction`` times lr is subtracted from its
    state-dict entries. Frozen models of the context are the client's modules in eval mode.
    What the model draws (dropout) comes from `own_draws`' stream for ``draw``: the updates the
    client trained before this one in the same call (a FedEM client's K components: 0 to K-1).
    """
    model = client.model(update.params, arch=update.arch)
    trainable = None if update.trainable is None else set(update.trainable)
    for name, p in model.named_parameters():
        p.requires_grad_(trainable is None or name in trainable)
    opt = sgd([p for _, p in model.named_parameters() if p.requires_grad], client)
    if update.buffers:
        load_optimizer_state(opt, model, update.buffers)
    after_step = None
    if update.correction is not None:
        entries = model.state_dict()  # tensors that share the model's storage
        lr = client.task.lr
        correction = [
            (entries[k], torch.from_numpy(np.asarray(v)).to(client.device) * lr)
            for k, v in update.correction.items()
        ]

        def after_step() -> None:
            with torch.no_grad():
                for entry, step in correction:
                    entry.sub_(step)

    batches = None if update.inputs is None else feature_batches(client, update.inputs, update.round)
    with own_draws(client, update.round, draw):
        stats = _local_steps(
            model,
            client,
            update,
            opt,
            device_context(client, update.context),
            after_step,
            batches,
        )
    buffers = optimizer_state(opt, model) if update.keep_buffers else None
    return Trained(get_params(model), stats, buffers)


@contextmanager
def own_draws(client: Client, rnd: int, draw: int = 0) -> Iterator[None]:
    """Torch's generators for the client's device (dropout's masks, a plug-in objective's own
    noise) seeded from the client's stream for the round and the update, (seed, "local_steps/<draw>",
    client, round), and put back as they were after. What a client's training draws then does not
    depend on what this process drew before it: the clients an actor ran before, the runs a
    sweep's actors served, a resume from a checkpoint; so a dropout model's numbers do not depend
    on the actor count either. ``draw`` tells apart the updates of one client in one call (a
    FedEM client's K components), whose masks are drawn independently, as the reference codes'
    are. Only the generators that are forked are seeded: the CPU's, and the client's CUDA device's."""
    seed = seeding.torch_seed(client.task.seed, f"local_steps/{draw}", client.cid, rnd)
    cuda = client.device.type == "cuda"
    with torch.random.fork_rng(devices=[client.device] if cuda else []):
        torch.default_generator.manual_seed(seed)
        if cuda:
            with torch.cuda.device(client.device):
                torch.cuda.manual_seed(seed)
        yield


def device_context(client: Client, context: Mapping[str, Any]) -> dict[str, Any]:
    """An update's context as its objective sees it in the per-client engine: arrays as tensors on
    the client's device (their dtype kept), parameter dicts as dicts of them, frozen models as the
    client's modules (one slot per name) in eval mode without gradients; scalars and None as given."""

    def one(name: str, value: Any) -> Any:
        if isinstance(value, Frozen):
            model = client.model(value.params, slot=f"frozen/{name}", arch=value.arch)
            model.eval()
            model.requires_grad_(False)
            return model
        if isinstance(value, np.ndarray):
            return torch.as_tensor(value, device=client.device)
        if isinstance(value, Mapping):
            return {k: torch.as_tensor(np.asarray(v), device=client.device) for k, v in value.items()}
        return value

    return {name: one(name, value) for name, value in context.items()}


def _local_steps(
    model: nn.Module,
    client: Client,
    update: LocalUpdate,
    opt: SGD,
    context: Mapping[str, Any],
    after_step: Callable[[], None] | None,
    batches: Batches | None,
) -> TrainStats:
    """The update's epochs of mini-batch SGD on ``model`` (NIID-Bench's loop)."""
    model.train()
    stats = TrainStats()
    w_all = (
        None
        if update.weights is None
        else torch.as_tensor(np.asarray(update.weights), dtype=torch.float32, device=client.device)
    )
    epochs = client.task.local_epochs if update.epochs is None else update.epochs
    # each step's loss and hits stay on the device, read once at the end: no wait for a GPU a step
    ces, hits, sizes = [], [], []
    for epoch in range(epochs):
        if batches is not None:
            epoch_batches = batches(epoch)
        else:
            epoch_batches = client.train_batches_at(update.round, epoch, drop_last=update.drop_last)
        for x, y, pos in epoch_batches:
            if update.max_steps is not None and stats.steps >= update.max_steps:
                break
            opt.zero_grad()
            w = None if w_all is None else w_all[torch.from_numpy(pos).to(client.device)]
            step = checked_step(update.objective(model, Batch(x, y, w), context), update.objective)
            step.loss.backward()
            opt.step()
            if after_step is not None:
                after_step()
            stats.steps += 1
            sizes.append(len(y))
            ces.append(step.ce.detach().reshape(()))
            hits.append((step.logits.detach().argmax(1) == y).sum())
    if sizes:
        for n, ce, hit in zip(sizes, torch.stack(ces).tolist(), torch.stack(hits).tolist(), strict=True):
            stats.samples += n
            stats.loss_sum += ce * n
            stats.correct += hit
    return stats


def optimizer_state(opt: SGD | torch.optim.Optimizer, model: nn.Module) -> dict[str, np.ndarray]:
    """The optimizer's per-parameter buffers (SGD's momentum) as plain arrays keyed by parameter
    name and buffer (``"encoder.fc1.weight/momentum_buffer"``): client state that survives between
    a client's rounds (FedRC/FedEM and CFL keep their optimizer, docs/algorithms/common.md#optimizer-state)."""
    names = {id(p): n for n, p in model.named_parameters()}
    out: dict[str, np.ndarray] = {}
    for group in opt.param_groups:
        for p in group["params"]:
            for key, value in opt.state.get(p, {}).items():
                if torch.is_tensor(value) and value.ndim > 0:
                    out[f"{names[id(p)]}/{key}"] = value.detach().cpu().numpy().copy()
    return out


def load_optimizer_state(
    opt: SGD | torch.optim.Optimizer, model: nn.Module, arrays: dict[str, np.ndarray]
) -> None:
    """Put buffers saved by `optimizer_state` back (a fresh optimizer for the same parameters)."""
    params = dict(model.named_parameters())
    for name, value in arrays.items():
        pname, key = name.rsplit("/", 1)
        p = params[pname]
        opt.state[p][key] = torch.as_tensor(np.array(value), device=p.device, dtype=p.dtype)


def feature_batches(client: Client, features: np.ndarray, rnd: int) -> Batches:
    """Batches of a client's precomputed features (aligned with its training split) and labels, in
    the very order and sizes `Client.train_batches` would give its images."""
    labels = client.train_labels()
    bs = client.task.batch_size

    def epoch_batches(epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, np.ndarray]]:
        order = client.train_order(rnd, epoch)
        for start in range(0, len(order), bs):
            pos = order[start : start + bs]
            yield (
                torch.from_numpy(features[pos]).to(client.device),
                torch.from_numpy(labels[pos]).to(client.device),
                pos,
            )

    return epoch_batches
