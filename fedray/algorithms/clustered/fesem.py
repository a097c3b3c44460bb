"""FeSEM: Long, Xie, Tian, Jiang, Zhang, "Multi-Center Federated Learning: Clients Clustering for
Better Personalization", World Wide Web 2023 (docs/algorithms/clustered.md#fesem, docs/algorithms/clustered.md#d1-an-empty-clusters-model), as the FedRC
codebase runs it.

K global models (the centres). Each round every participant trains the model it is assigned to,
then reassigns itself to the centre nearest its trained model, d_k = sum over state-dict tensors of
||theta_local[t] - theta_k[t]||_2 (the code's sum of per-tensor L2 norms). A client without an
assignment yet (its first round) trains a copy of every model and takes the one whose trained copy
has the lowest mean training loss. The server sets centre k to the n_i-weighted average of the
trained models of the participants now assigned to k.

Deviations from the FedRC code, said openly, each with the code's behaviour as an option for
side-by-side runs:
- an empty centre keeps its weights and records an ``empty_cluster`` row; the code zeroes it
  (docs/algorithms/clustered.md#d1-an-empty-clusters-model; ``empty_cluster: zero``, as IFCA's);
- a client that switches to k' contributes its trained model to k' (the paper's M-step); the code
  contributes its untrained copy of k', the centre it received (docs/algorithms/clustered.md#d3-fesem-what-a-client-that-moves-contributes's quirk; ``switch: untrained``);
- a first participation trains each centre's copy on the plain loss; the code starts every client
  with uniform sample weights 1/K, so each copy's loss there is (1/K)(1/|B|) sum_b CE_b
  (``first_round: split``).
``persistent_optimizer`` and ``drop_last`` as IFCA's. Evaluation as IFCA's, with the latest
assignments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedray.algorithms.clustered import ifca
from fedray.algorithms.rounds import kept_optimizer_update, train_reply
from fedray.config.hparams import one_of
from fedray.engine.client import Client
from fedray.engine.update import Evaluation, LocalUpdate
from fedray.federation import Federation
from fedray.params import Params
from fedray.records import Record


@dataclass
class Hparams(ifca.Hparams):
    # what a client moving to centre k' gives k': trained, its trained model (paper), or untrained, the copy it got (FedRC code)
    switch: str = field(default="trained", metadata=one_of("trained", "untrained"))
    # a first participation's loss on each centre's copy: full, plain (paper), or split, weighed 1/K (FedRC code)
    first_round: str = field(default="full", metadata=one_of("full", "split"))


State = ifca.State
init = ifca.init
evaluate = ifca.evaluate
models = ifca.models
assignment = ifca.assignment


def center_distance(local: Params, center: Params) -> float:
    """sum_t ||local[t] - center[t]||_2 over the floating-point state-dict tensors."""
    return float(
        sum(
            np.linalg.norm(np.asarray(local[k], np.float64) - np.asarray(center[k], np.float64))
            for k in local
            if np.issubdtype(np.asarray(local[k]).dtype, np.floating)
        )
    )


def fesem_update(client: Client, cstate: Any, msg: dict):
    """Client function: train the assigned centre (every centre, first time) and reassign."""
    models, k, buffers = msg["models"], msg["assigned"], dict(cstate or {})
    keep, rnd = msg["persistent_optimizer"], msg["round"]
    # first participation: a trained copy of every centre (all at once), keep the lowest-loss one
    if k is None:
        split = np.full(client.num_examples, 1.0 / len(models)) if msg["first_round"] == "split" else None
        trained = yield [
            LocalUpdate(
                m,
                rnd,
                weights=split,
                buffers=buffers.get(j) if keep else None,
                keep_buffers=keep,
            )
            for j, m in enumerate(models)
        ]
        tried = [(train_reply(client, t.params, t.stats), t.buffers if keep else None) for t in trained]
        losses = [s.loss for s in (yield [Evaluation(r["params"]) for r, _ in tried])]
        new = int(np.argmin(losses))
        for j, (_, kept) in enumerate(tried):
            if kept is not None:
                buffers[j] = kept
        reply = tried[new][0]
    else:
        reply, kept = yield from kept_optimizer_update(client, models[k], rnd, buffers.get(k), keep=keep)
        if kept is not None:
            buffers[k] = kept
        new = int(np.argmin([center_distance(reply["params"], m) for m in models]))
        if new != k and msg["switch"] == "untrained":
            reply = {**reply, "params": models[new]}
    return {**reply, "cluster": new}, (buffers or None)


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    cids = fed.sample(fed.task.participation, fed.task.rng("sample", rnd=rnd))
    common = {
        "models": state.models,
        "round": rnd,
        "persistent_optimizer": hp.persistent_optimizer,
        "switch": hp.switch,
        "first_round": hp.first_round,
    }
    by_center: dict[Any, list[int]] = {}
    for c in cids:
        by_center.setdefault(state.assigned.get(c), []).append(c)
    replies = fed.map_groups(fesem_update, [(m, {**common, "assigned": k}) for k, m in by_center.items()])
    return ifca.close_round(state, fed, replies, hp.empty_cluster)
