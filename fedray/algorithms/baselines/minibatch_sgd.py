"""Minibatch SGD: Caldas, Duddu, Wu, Li, Konečný, McMahan, Smith, Talwalkar, "LEAF: A Benchmark for
Federated Settings", arXiv 1812.01097, 2018: LEAF's baseline beside FedAvg (docs/algorithms/baselines.md#minibatch-sgd;
TalwalkarLab/leaf models/client.py, models/server.py, paper_experiments/femnist.sh).

Each round the sampled clients (FedAvg's sampling) each draw k_i = max(1, int(fraction * n_i)) of
their n_i training samples without replacement and take one SGD step (the run's lr, a fresh
optimizer) from the global model on the mean cross-entropy of that draw, all of it one batch. The
server averages the stepped models weighted by k_i, the samples each trained on this round (not
n_i), and takes the average as the new model: no server step size, so a round is one SGD step of
the global model on the union of the draws, w - lr sum_i (k_i / sum_j k_j) g_i.

How it runs in fedray (docs/algorithms/baselines.md#d8-minibatch-sgd-the-draw-as-sample-weights): the draw is
one batch holding the client's whole training split (``batch_size`` must be at least the largest
client's, checked at init), with per-sample loss weights n_i / k_i on the drawn samples and 0 on
the rest, one step (epochs 1, a cap of 1 step): the same gradient, through the one local-update
description, on both engines. fraction 1 needs no weights: FedAvg's one full-batch step exactly.
Deviations from LEAF's code: the draw comes from the stream (seed, "minibatch", client, round),
not Python's global ``random``; ``hp.fraction`` outside (0, 1] is refused (LEAF clamps it to 1
above and takes one sample at 0); ``local_epochs`` must be 1 and ``drop_last`` false (LEAF's
--minibatch excludes --num-epochs); ``sgd_loss`` and ``sgd_accuracy`` are over the clients' whole
splits at the model they received (the batch the step ran forward), not over the draws alone; a
model with BatchNorm would normalise over the whole split (LEAF's models have none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from fedray.algorithms.baselines import fedavg
from fedray.algorithms.baselines.fedavg import State, evaluate, models  # noqa: F401 - FedAvg's, part of the record
from fedray.algorithms.plan import RunPlan
from fedray.algorithms.rounds import local_sgd_reply
from fedray.config.hparams import bound
from fedray.engine.client import Client
from fedray.federation import Federation
from fedray.records import Record

# LEAF's server averages the locally stepped models as they are (models/server.py update_model):
# FedAvg's server step at eta_g = 1. A server step size would only rescale lr.
PLAIN_AVERAGE = fedavg.ServerHparams(server_lr=1.0)


@dataclass
class Hparams:
    """lr is LEAF's -lr (0.06 on FEMNIST); local_epochs must be 1 and batch_size at least the
    largest client's training samples."""

    # LEAF's --minibatch: the share of its training samples each client draws a round, one batch
    # (LEAF's FEMNIST runs 0.1 and 1.0)
    fraction: float = field(default=0.1, metadata=bound(gt=0, le=1))


def check_run(run: RunPlan, hp: Hparams) -> None:
    """One step a round on one batch: LEAF's --minibatch takes no epochs, and a dropped last
    batch would be the client's whole draw."""
    if run.local_epochs != 1:
        raise ValueError(
            f"config key 'local_epochs': minibatch_sgd takes one step a round on each client's draw "
            f"(hp.fraction; LEAF's --minibatch excludes --num-epochs): set local_epochs: 1, got {run.local_epochs}"
        )
    if run.drop_last:
        raise ValueError(
            "config key 'drop_last': minibatch_sgd's one batch is the client's whole training split, "
            "which drop_last would drop: set drop_last: false"
        )


def draw_size(n: int, fraction: float) -> int:
    """k = max(1, int(fraction * n)) samples of a client's n (LEAF's models/client.py), at most n."""
    return min(n, max(1, int(fraction * n)))


def draw(n: int, fraction: float, rng: np.random.Generator) -> np.ndarray | None:
    """The positions in the training split a client steps on (`draw_size` of them, drawn without
    replacement from ``rng``), or None for all of them."""
    k = draw_size(n, fraction)
    return None if k == n else np.sort(rng.choice(n, size=k, replace=False))


def draw_weights(n: int, drawn: np.ndarray | None) -> np.ndarray | None:
    """Per-sample loss weights over the whole split that make its weighted mean cross-entropy,
    (1/n) sum_b w_b ce_b, the draw's mean: n / k on the drawn samples, 0 elsewhere."""
    if drawn is None:
        return None
    w = np.zeros(n, dtype=np.float32)
    w[drawn] = n / len(drawn)
    return w


def init(fed: Federation, hp: Hparams) -> State:
    """FedAvg's initial model, once every client's split fits one batch (the draw's batch)."""
    sizes = fed.num_examples()
    largest = max(sizes, key=lambda c: (sizes[c], -c))
    if sizes[largest] > fed.task.batch_size:
        raise ValueError(
            f"config key 'batch_size': minibatch_sgd steps once on a batch holding the client's whole "
            f"training split (its draw weighted in), and client {largest} has {sizes[largest]} samples: "
            f"set batch_size >= {sizes[largest]}, got {fed.task.batch_size}"
        )
    return fedavg.init(fed, hp)


def minibatch_update(client: Client, cstate: Any, msg: dict, fraction: float):
    """Client function: one SGD step on the mean cross-entropy of this round's draw; the reply
    weighs the client by its draw's size."""
    n, rnd = client.num_examples, msg["round"]
    drawn = draw(n, fraction, client.task.rng("minibatch", client=client.cid, rnd=rnd))
    reply = yield from local_sgd_reply(
        client, msg["params"], rnd, epochs=1, max_steps=1, weights=draw_weights(n, drawn)
    )
    return {**reply, "num_examples": draw_size(n, fraction)}, cstate


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    return fedavg.fedavg_round(
        state, fed, PLAIN_AVERAGE, rnd, partial(minibatch_update, fraction=hp.fraction)
    )
