"""One description of a client's local update, run by two engines.

A client function that trains does not train: it says what to train and gets the result back. It
is a generator that yields a `LocalUpdate` (or a list of them: several models of one client, FedEM's
K components) and receives the `Trained` result (or a list), then returns ``(reply, new_cstate)``::

    def prox_update(client, cstate, msg, mu):
        trained = yield LocalUpdate(msg["params"], msg["round"], objective=proximal,
                                    context={"anchor": msg["params"], "mu": mu})
        return train_reply(client, trained), cstate

The host that runs it (`fedray.federation.host.ClientHost`) picks the engine: the per-client engine
(`fedray.engine.train.train_update`: one model, `torch.optim.SGD`'s rule, the client's batches one at a time) or
the stacked engine (`fedray.engine.batched.train_stacked`: every update the host's clients yielded in one
call, stacked along a leading axis and stepped together under `torch.func.vmap`). Both run the
same description, so an algorithm, built-in or plug-in, is written once and trains batched where
the config asks (``batched_clients``).

What a description can say (every field below): the start model and its architecture; the loss, an
`Objective` over a module-like model, the batch and a context of named values (tensors per client or
shared, frozen models, scalars); the parameters that train (the others stay fixed); the local
epochs or a cap on steps; per-sample loss weights; a correction subtracted after every step
(SCAFFOLD's); the optimizer's momentum buffers in and out; inputs that replace the training images
(precomputed features). The optimizer is the task's SGD (lr, momentum, weight decay).

An objective is written once for both engines: ``model`` is the real `nn.Module` in the per-client
engine and a functional view of it (`fedray.engine.stack.View`) in the stacked one, so it may call the
model and its submodules (``model.encoder(x)``), read its parameters (``model.head.weight``) and
walk ``model.named_parameters()``; reductions over the batch go through ``batch`` (`Batch`), which
knows which of a stacked batch's rows are padding.

Evaluation is described the same way: a client function yields an `Evaluation` (a model, the split,
and whether it wants the split's totals or each sample's loss or probabilities) and receives the
numbers. Run one client at a time, each is evaluated alone; run together, every evaluation the
clients yielded at one point is one call (`fedray.engine.evaluation.evaluate_requests`), each model loaded once
and the values read back from the device once. The numbers are the same either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fedray.engine.client import PluginMistake, code_name
from fedray.engine.stats import TrainStats
from fedray.models import TASK, Arch
from fedray.params import Params


@dataclass
class Step:
    """What an objective computes for one batch."""

    logits: torch.Tensor  # the model's predictions: train accuracy is counted on these
    ce: torch.Tensor  # the batch's mean cross-entropy, reported as sgd_loss
    loss: torch.Tensor  # what the optimizer minimises


class ObjectiveError(PluginMistake, ValueError):
    """An objective returned what no engine can step on."""


def checked_step(step: Any, objective: Any) -> Step:
    """``step`` as the objective returned it, once it is a `Step` whose ``loss`` and ``ce`` are
    scalars (under the stacked engine's vmap: one row's, which is one number too)."""
    if not isinstance(step, Step):
        raise ObjectiveError(
            f"objective {code_name(objective)} returned a {type(step).__name__}, not a fedray.Step(logits, "
            "ce, loss); docs/extending.md#a-local-objective"
        )
    for field_name in ("loss", "ce"):
        value = getattr(step, field_name)
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ObjectiveError(
                f"objective {code_name(objective)} returned Step.{field_name} of shape {shape}: Step.loss "
                "and Step.ce must be scalars, one number for the batch (reduce with batch.mean(...), "
                "batch.weighted(...) or batch.cross_entropy(...), which count only the batch's real "
                "samples; a loss with reduction='none' is per sample); docs/extending.md#a-local-objective"
            )
    return step


class Batch:
    """One client's mini-batch as an objective sees it: inputs ``x``, labels ``y``, per-sample loss
    weights ``w`` (None without weights), and the batch's reductions. In the per-client engine every
    row is a sample; in the stacked engine a client's last batch is padded to the stack's batch size
    and ``mask`` says which rows count."""

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        w: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        count: torch.Tensor | None = None,
    ) -> None:
        self.x, self.y, self.w = x, y, w
        self._mask, self._count = mask, count

    def cross_entropy(self, logits: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        """The mean cross-entropy of ``logits`` against ``target`` (the labels by default) over the
        batch's samples."""
        target = self.y if target is None else target
        if self._mask is None:
            return nn.functional.cross_entropy(logits, target)
        return self.mean(nn.functional.cross_entropy(logits, target, reduction="none"))

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """The mean of per-sample ``values`` over the batch's samples."""
        if self._mask is None:
            return values.mean()
        return (values * self._mask).sum() / self._count

    def weighted(self, values: torch.Tensor) -> torch.Tensor:
        """(1/|B|) sum_b w_b values_b: per-sample values weighted by the sample weights and divided
        by the batch size, not by the weights' sum (FedEM's and FedRC's gamma-weighted loss); the
        plain mean without weights."""
        if self.w is None:
            return self.mean(values)
        if self._mask is None:
            return (self.w * values).sum() / len(self.y)
        return (values * self.w * self._mask).sum() / self._count


# The local objective: (model, batch, context) -> Step. ``context`` maps the description's context
# names to their values on the device: tensors, scalars, frozen models (module-like, eval mode).
Objective = Callable[[Any, Batch, Mapping[str, Any]], Step]


def cross_entropy(model: Any, batch: Batch, context: Mapping[str, Any]) -> Step:
    """The plain objective: the batch's cross-entropy (with sample weights, the weighted mean)."""
    out = model(batch.x)
    if batch.w is None:
        ce = batch.cross_entropy(out)
        return Step(out, ce, ce)
    each = nn.functional.cross_entropy(out, batch.y, reduction="none")
    return Step(out, batch.mean(each), batch.weighted(each))


def proximal(model: Any, batch: Batch, context: Mapping[str, Any]) -> Step:
    """Cross-entropy plus (mu/2) ||w - anchor||^2 over the model's parameters (FedProx, with the
    model it received as the anchor; FedSoft, with its importance-weighted one). Context: ``anchor``
    (a parameter dict), ``mu``."""
    step = cross_entropy(model, batch, context)
    anchor = context["anchor"]
    prox = sum(((p - anchor[name]) ** 2).sum() for name, p in model.named_parameters())
    return Step(step.logits, step.ce, step.loss + context["mu"] / 2 * prox)


@dataclass(frozen=True, eq=False)
class Frozen:
    """A model in an update's context that does not train (MOON's global and previous models): the
    objective gets it as a module-like callable in eval mode, without gradients. The same Frozen
    object given to several clients is one model shared by the stack; different objects, one each."""

    params: Params
    arch: Arch = TASK


@dataclass
class LocalUpdate:
    """One client's local training, as data (see the module's docstring)."""

    params: Params  # the model to start from: every state-dict entry
    round: int  # the round: the client's batch order and augmentation are drawn from it
    objective: Objective = cross_entropy
    # named values the objective reads: numpy arrays (as tensors), parameter dicts (as dicts of
    # tensors), Python scalars, `Frozen` models, None
    context: Mapping[str, Any] = field(default_factory=dict)
    arch: Arch = TASK  # the network ``params`` belong to
    trainable: Sequence[str] | None = None  # the parameter names that train (the rest stay fixed); None: all
    epochs: int | None = None  # local epochs; None: the task's
    max_steps: int | None = None  # stop after this many optimizer steps
    drop_last: bool = (
        False  # drop each epoch's last partial batch (also where the run drops it: Task.drop_last)
    )
    weights: np.ndarray | None = None  # one loss weight per training sample, in the split's order
    correction: Params | None = None  # subtracted, times lr, from these entries after every step (SCAFFOLD)
    # momentum buffers to go on from (`fedray.engine.train.optimizer_state`'s form)
    buffers: Mapping[str, np.ndarray] | None = None
    keep_buffers: bool = False  # return the final momentum buffers
    # per-sample inputs aligned with the training split, replacing its images (precomputed features)
    inputs: np.ndarray | None = None


@dataclass
class Trained:
    """What a `LocalUpdate` gives back."""

    params: Params  # the trained model, every state-dict entry, in the start's key order
    stats: TrainStats  # samples, loss_sum, correct, steps (and the stacked engine's padded rows)
    buffers: dict[str, np.ndarray] | None = None  # the final momentum buffers, when asked to keep them


SPLITS = ("train", "test")
PER_SAMPLE = (None, "loss", "proba", "loss_proba")


@dataclass(frozen=True, eq=False)
class Evaluation:
    """A model on one of the client's own splits, as data: a client function yields it (alone, or in
    a list, updates beside it too) where it would evaluate, and receives the split's
    `fedray.engine.stats.EvalStats` (samples, summed cross-entropy, correct argmax predictions), in eval
    mode and without augmentation::

        def member_eval(client, cstate, msg):
            stats = yield Evaluation(msg["params"])
            return {"correct": stats.correct, "samples": stats.samples}, cstate

    With ``per_sample`` the answer is each sample's value instead, in the split's order: ``"loss"``,
    the cross-entropies (float64, n; the E-steps of FedEM, FedRC and FedSoft), ``"proba"``, the
    softmax probabilities (float32, n x classes; the mixtures' ensembles), ``"loss_proba"``, both
    from one pass, as a pair (the mixtures' ensembles on the training split, whose losses the next
    round's E-step reads instead of a second pass).

    The numbers are those of evaluating the client alone. Where the host runs its clients together
    (batched clients), every evaluation they yield at one point runs in one call: each model loaded
    once for all the clients that evaluate it (the same ``params`` object, as a group's message
    gives every member), and every batch's values read back from the device at once."""

    params: Params
    split: str = "train"  # "train": the training split in order; "test": the client's test split
    arch: Arch = TASK  # the network ``params`` belong to
    per_sample: str | None = None  # None: the split's EvalStats; "loss", "proba", "loss_proba": each sample's

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"Evaluation split must be one of {SPLITS}, got {self.split!r}")
        if self.per_sample not in PER_SAMPLE:
            raise ValueError(f"Evaluation per_sample must be one of {PER_SAMPLE}, got {self.per_sample!r}")
        if self.arch.head_only:
            raise ValueError(
                "Evaluation runs a model on the client's images: a head-only Arch takes features"
            )


Request = LocalUpdate | Evaluation


def requests(yielded: Any, drop_last: bool = False) -> list[Request]:
    """What a client function yielded, as a list of requests (one or several updates and
    evaluations); with ``drop_last`` (the run's, `Task.drop_last`: decided once a run by
    `fedray.experiment.local.drops_last`) every update drops each epoch's last partial batch, and
    an update a plug-in's client function asks to drop it (``LocalUpdate(drop_last=True)``) drops
    it whatever the run says."""
    if isinstance(yielded, (LocalUpdate, Evaluation)):
        asked = [yielded]
    elif isinstance(yielded, (list, tuple)) and all(
        isinstance(u, (LocalUpdate, Evaluation)) for u in yielded
    ):
        asked = list(yielded)
    else:
        raise TypeError(
            "a client function yields a fedray.LocalUpdate or a fedray.Evaluation, or a list of them, "
            f"got {type(yielded).__name__}"
        )
    return [
        dataclasses.replace(u, drop_last=True)
        if drop_last and isinstance(u, LocalUpdate) and not u.drop_last
        else u
        for u in asked
    ]
