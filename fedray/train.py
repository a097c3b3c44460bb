"""Local training and evaluation loops (NIID-Bench semantics, docs/algorithms/common.md#the-fedavg-core)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedray.client import Client
from fedray.params import Params


@dataclass
class Step:
    """What an objective computes for one batch."""

    logits: torch.Tensor  # the model's predictions: train accuracy is counted on these
    ce: torch.Tensor  # the batch's mean cross-entropy, reported as sgd_loss
    loss: torch.Tensor  # what the optimizer minimises


# The local objective: (model, x, y) -> Step. FedProx adds a proximal term, MOON a contrastive
# term, FedRS and FedLC adjust the logits the loss sees; the default is plain cross-entropy.
Objective = Callable[[nn.Module, torch.Tensor, torch.Tensor], Step]
# Called after every optimizer step with the model (SCAFFOLD's control-variate correction).
AfterStep = Callable[[nn.Module], None]


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Step:
    out = model(x)
    ce = nn.functional.cross_entropy(out, y)
    return Step(out, ce, ce)


def proximal(mu: float, anchor: Mapping[str, torch.Tensor]) -> Objective:
    """Cross-entropy plus (mu/2) ||w - anchor||^2 over the parameters (FedProx; FedSoft with its
    importance-weighted anchor)."""

    def objective(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Step:
        step = cross_entropy(model, x, y)
        prox = sum(((p - anchor[name]) ** 2).sum() for name, p in model.named_parameters())
        return Step(step.logits, step.ce, step.loss + mu / 2 * prox)

    return objective


def weighted_cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> Step:
    """(1/|B|) sum_b w_b CE_b: per-sample weights, divided by the batch size and not by the weights'
    sum (FedEM/FedRC's gamma-weighted loss, docs/algorithms/mixture.md#fedems-round step 2d)."""
    out = model(x)
    each = nn.functional.cross_entropy(out, y, reduction="none")
    return Step(out, each.mean(), (w * each).sum() / len(y))


# The weighted objective: (model, x, y, per-sample weights of the batch) -> Step.
WeightedObjective = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], Step]


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


def sgd(params: Iterable[nn.Parameter], client: Client) -> torch.optim.SGD:
    t = client.task
    return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)


# Batches of one epoch: epoch -> (inputs, labels) pairs.
Batches = Callable[[int], Iterable[tuple[torch.Tensor, torch.Tensor]]]


def local_train(
    model: nn.Module,
    client: Client,
    rnd: int,
    epochs: int | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    objective: Objective = cross_entropy,
    after_step: AfterStep | None = None,
    batches: Batches | None = None,
    max_steps: int | None = None,
    weights: np.ndarray | None = None,
    weighted_objective: WeightedObjective = weighted_cross_entropy,
    drop_last: bool = False,
) -> TrainStats:
    """``epochs`` full passes of mini-batch SGD on the client's training split.

    A fresh optimizer per call unless one is given (NIID-Bench re-creates it every round); give one
    over some parameters only to train those (the others stay frozen). ``objective`` is the loss
    (cross-entropy unless an algorithm says otherwise); ``after_step`` runs after each optimizer
    step. ``batches(epoch)`` replaces the client's shuffled training batches (e.g. precomputed
    features, `feature_batches`). ``max_steps`` stops after that many optimizer steps (FedConcat's
    classifier rounds: 3). ``weights`` (one per training sample, aligned with the client's training
    split) weight each sample's loss through ``weighted_objective`` (FedEM/FedRC's gamma);
    ``drop_last`` drops each epoch's last partial batch (FedRC's loaders).
    """
    opt = optimizer or sgd(model.parameters(), client)
    model.train()
    stats = TrainStats()
    w_all = (
        None
        if weights is None
        else torch.as_tensor(np.asarray(weights), dtype=torch.float32, device=client.device)
    )
    for epoch in range(client.task.local_epochs if epochs is None else epochs):
        if batches is not None:
            epoch_batches = ((x, y, None) for x, y in batches(epoch))
        else:
            epoch_batches = client.train_batches_at(rnd, epoch, drop_last=drop_last)
        for x, y, pos in epoch_batches:
            if max_steps is not None and stats.steps >= max_steps:
                break
            opt.zero_grad(set_to_none=True)
            if w_all is None:
                step = objective(model, x, y)
            else:
                step = weighted_objective(model, x, y, w_all[torch.from_numpy(pos).to(client.device)])
            step.loss.backward()
            opt.step()
            if after_step is not None:
                after_step(model)
            n = len(y)
            stats.steps += 1
            stats.samples += n
            stats.loss_sum += float(step.ce.detach()) * n
            stats.correct += int((step.logits.detach().argmax(1) == y).sum())
    return stats


def optimizer_state(opt: torch.optim.Optimizer, model: nn.Module) -> dict[str, np.ndarray]:
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


def load_optimizer_state(opt: torch.optim.Optimizer, model: nn.Module, arrays: dict[str, np.ndarray]) -> None:
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

    def epoch_batches(epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = client.train_order(rnd, epoch)
        for start in range(0, len(order), bs):
            pos = order[start : start + bs]
            yield (
                torch.from_numpy(features[pos]).to(client.device),
                torch.from_numpy(labels[pos]).to(client.device),
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
    """Accuracy (argmax match) and summed cross-entropy per batch, in eval mode."""
    was_training = model.training
    model.eval()
    out = []
    for x, y in batches:
        logits = model(x)
        loss = float(nn.functional.cross_entropy(logits, y, reduction="sum"))
        out.append(EvalStats(len(y), loss, int((logits.argmax(1) == y).sum())))
    model.train(was_training)
    return out


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
def sample_losses(client: Client, models: list[Params], batches) -> np.ndarray:
    """K x n cross-entropies of each model on the given batches, in order (eval mode)."""
    out = []
    for params in models:
        model = client.model(params)
        model.eval()
        out.append(
            np.concatenate(
                [
                    torch.nn.functional.cross_entropy(model(x), y, reduction="none").cpu().numpy()
                    for x, y in batches()
                ]
            )
        )
    return np.stack(out).astype(np.float64)
