"""The per-client engine of a `fedray.engine.update.LocalUpdate` (NIID-Bench's local SGD,
docs/algorithms/common.md#the-fedavg-core), and the evaluation loops."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from traceback import format_exc
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.sgd import sgd as sgd_rule

from fedray.config import seeding
from fedray.engine.client import Client, ClientError
from fedray.engine.update import Batch, Evaluation, Frozen, LocalUpdate, Trained, checked_step
from fedray.models import Arch
from fedray.params import get_params


@dataclass
class EvalStats:
    samples: int = 0
    loss_sum: float = 0.0  # summed cross-entropy over the samples (extra loss terms excluded)
    correct: int = 0

    @property
    def loss(self) -> float:
        return self.loss_sum / max(1, self.samples)

    @property
    def accuracy(self) -> float:
        return self.correct / max(1, self.samples)


@dataclass
class TrainStats(EvalStats):
    steps: int = 0  # optimizer steps taken
    stacked: int = 0  # the stacked engine's sample rows stepped for it, padding included (0 per client)

    def add(self, other: TrainStats) -> None:
        self.samples += other.samples
        self.loss_sum += other.loss_sum
        self.correct += other.correct
        self.steps += other.steps
        self.stacked += other.stacked


class SGD:
    """`torch.optim.SGD` (dampening 0, no Nesterov) as the per-client engine runs it: each step is
    torch's own functional form of that optimizer's rule (`torch.optim.sgd.sgd`) given what
    `torch.optim.SGD.step` gives it, so the numbers are the optimizer's bit for bit
    (tests/test_train.py), and the momentum buffers sit where the optimizer keeps them
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


def eval_feature_batches(
    client: Client, features: np.ndarray, labels: np.ndarray
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Precomputed features of a split and its labels in the batches `Client.eval_train_batches` and
    `Client.test_batches` give its images (in order, ``eval_batch_size`` at a time)."""
    bs = client.task.eval_batch_size
    for start in range(0, len(labels), bs):
        yield (
            torch.from_numpy(features[start : start + bs]).to(client.device),
            torch.from_numpy(labels[start : start + bs]).to(client.device),
        )


@torch.no_grad()
def evaluate_batches(
    model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]
) -> list[EvalStats]:
    """Accuracy (argmax match) and summed cross-entropy per batch, in eval mode. The per-batch sums
    stay on the device until every batch is queued: one wait for a GPU, not two a batch."""
    was_training = model.training
    model.eval()
    sizes, queued = [], []
    for x, y in batches:
        sizes.append(len(y))
        queued.append(_batch_values(model(x), y, None))
    model.train(was_training)
    if not sizes:
        return []
    values = torch.stack(queued).tolist()
    return [EvalStats(n, loss, int(hits)) for n, (loss, hits) in zip(sizes, values, strict=True)]


def total(parts: Iterable[EvalStats]) -> EvalStats:
    """Sum per-batch stats in the given order (fixed order: the same float sums everywhere)."""
    acc = EvalStats()
    for p in parts:
        acc.samples += p.samples
        acc.loss_sum += p.loss_sum
        acc.correct += p.correct
    return acc


def evaluate(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> EvalStats:
    return total(evaluate_batches(model, batches))


@torch.no_grad()
def evaluate_requests(
    clients: Sequence[Client], evals: Sequence[Evaluation], stack_models: bool = False
) -> list[EvalStats | np.ndarray | tuple[np.ndarray, np.ndarray]]:
    """Each `Evaluation` on its client's split (``clients[i]`` evaluates ``evals[i]``): the numbers of
    evaluating each alone (`evaluate`'s, batch by batch, summed in order; or each sample's values).
    Evaluations of one model (the same ``params`` object and arch) load it once, and every batch's
    values stay on the device until the last batch of the last client is queued, then come back in
    one copy: one wait for a GPU a call, not one a client. ``stack_models``: a client's evaluations
    of several models of one arch on one split, asking for one kind of values (a mixture's K models),
    run as one forward of the models stacked (`torch.func.vmap`), each batch read once: the same
    numbers up to float round-off (`fedray.engine.step_options.stacks_evaluations` decides)."""
    if not evals:
        return []
    values: list[list[torch.Tensor]] = [[] for _ in evals]  # each evaluation's batches' values, flat
    shapes: list[list[tuple[int, ...]]] = [[] for _ in evals]  # each evaluation's batches' shapes
    alone = list(range(len(evals)))
    if stack_models:
        together: dict[tuple[int, str, str | None, Arch], list[int]] = {}
        for i, e in enumerate(evals):
            together.setdefault((id(clients[i]), e.split, e.per_sample, e.arch), []).append(i)
        stacks = [m for m in together.values() if len({id(evals[i].params) for i in m}) > 1]
        for members in stacks:
            _queue_stacked(clients[members[0]], [evals[i] for i in members], members, values, shapes)
        stacked = {i for members in stacks for i in members}
        alone = [i for i in alone if i not in stacked]
    by_model: dict[tuple[int, Arch], list[int]] = {}
    for i in alone:
        by_model.setdefault((id(evals[i].params), evals[i].arch), []).append(i)
    for members in by_model.values():
        first = evals[members[0]]
        model = clients[members[0]].model(first.params, arch=first.arch)
        model.eval()
        for i in members:
            with _naming(clients[i], evals[i]):
                for x, y in _split_batches(clients[i], evals[i]):
                    _queue(model(x), y, evals[i].per_sample, values[i], shapes[i])
        model.train()
    queued = [v for vs in values for v in vs]
    flat = torch.cat(queued).cpu().numpy() if queued else np.zeros(0)  # the call's one copy
    out: list[Any] = []
    at = 0
    for i, e in enumerate(evals):
        size = 2 * len(shapes[i]) if e.per_sample is None else sum(int(np.prod(sh)) for sh in shapes[i])
        out.append(
            _read_values(flat[at : at + size], shapes[i], e.per_sample, clients[i].task.spec.num_classes)
        )
        at += size
    return out


def _split_batches(client: Client, e: Evaluation) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    return client.eval_train_batches() if e.split == "train" else client.test_batches()


@contextmanager
def _naming(client: Client, e: Evaluation) -> Iterator[None]:
    """A failure while evaluating on ``client``'s split, re-raised naming the client and split."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 - re-raised with the client id attached
        raise ClientError(
            client.cid, f"evaluating on its {e.split} split: {type(err).__name__}: {err}", format_exc()
        ) from err


def _queue(logits: torch.Tensor, y: torch.Tensor, kind: str | None, values: list, shapes: list) -> None:
    """One batch's values (`_batch_values`) queued, flat in float64 (exact for these values)."""
    got = _batch_values(logits, y, kind)
    shapes.append((len(y),) if kind is None else tuple(got.shape))
    values.append(got.double().reshape(-1))


def _queue_stacked(
    client: Client, evals: Sequence[Evaluation], members: Sequence[int], values: list, shapes: list
) -> None:
    """``evals`` (several models, one client, split, arch and kind) as one stacked forward a batch."""
    first = evals[0]
    model = client.model(first.params, arch=first.arch)  # the module each row calls with its tensors
    model.eval()
    rows = {
        k: torch.stack([torch.as_tensor(np.asarray(e.params[k])) for e in evals]).to(client.device)
        for k in first.params
    }
    forward = torch.func.vmap(lambda row, x: torch.func.functional_call(model, row, (x,)), in_dims=(0, None))
    with _naming(client, first):
        for x, y in _split_batches(client, first):
            logits = forward(rows, x)
            for r, i in enumerate(members):
                _queue(logits[r], y, first.per_sample, values[i], shapes[i])
    model.train()


def _read_values(flat: np.ndarray, shapes: list[tuple[int, ...]], kind: str | None, classes: int) -> Any:
    """One evaluation's values from the call's copy: its summed `EvalStats`, or each sample's values."""
    if kind is None:
        pairs = flat.reshape(-1, 2)
        return total(
            EvalStats(n, float(loss), int(hits)) for (n,), (loss, hits) in zip(shapes, pairs, strict=True)
        )
    width = {"loss": (), "proba": (classes,), "loss_proba": (1 + classes,)}[kind]
    values = flat.reshape(-1, *width) if shapes else np.zeros((0, *width))
    if kind == "loss_proba":  # each value as its own kind gives it (float32 -> float64 is exact)
        return (values[:, 0].copy(), values[:, 1:].astype(np.float32))
    return values if kind == "loss" else values.astype(np.float32)


def _batch_values(logits: torch.Tensor, y: torch.Tensor, kind: str | None) -> torch.Tensor:
    """One batch's values on the device: its summed cross-entropy and correct predictions, or each
    sample's cross-entropy, softmax probabilities, or both (a column of the one, then the other)."""
    if kind == "loss":
        return nn.functional.cross_entropy(logits, y, reduction="none")
    if kind == "proba":
        return torch.softmax(logits, 1)
    if kind == "loss_proba":
        return torch.cat([_batch_values(logits, y, "loss")[:, None], _batch_values(logits, y, "proba")], 1)
    loss = nn.functional.cross_entropy(logits, y, reduction="sum")
    return torch.stack([loss.double(), (logits.argmax(1) == y).sum().double()])
