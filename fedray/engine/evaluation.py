"""The evaluation loops both engines use: a model on batches (`evaluate`), and the `Evaluation`s
client functions yield, run together a call (`evaluate_requests`: one model loaded once, every
batch's values on the device until the last, several models of one arch stacked)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from traceback import format_exc
from typing import Any

import numpy as np
import torch
from torch import nn

from fedray.engine.client import Client, ClientError
from fedray.engine.stats import EvalStats, total
from fedray.engine.update import Evaluation
from fedray.models import Arch


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
