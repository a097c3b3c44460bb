"""FedRS: Li, Zhan, "FedRS: Federated Learning with Restricted Softmax for Label Distribution
Non-IID Data", KDD 2021 (docs/algorithms/baselines.md#fedrs; FedRepo algorithms/fedrs.py).

FedAvg's round; in local training the logit of class c is scaled by
s_c = alpha + (1 - alpha) n_c / max_c' n_c' (n_c: the client's count of class c), so classes the
client lacks get alpha and its most frequent class 1. Evaluation uses the unscaled logits.
Choice (docs/algorithms/baselines.md#d5-fedrs-the-bias-and-gradient-clipping): our models' last layer has a bias; the scale applies to W h and the
bias stays unscaled, so alpha = 1 is FedAvg exactly. Not reproduced: FedRepo's gradient clipping
at norm 100 (its own experiments' setting, not FedRS's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch

from fedray.algorithms.baselines import fedavg
from fedray.algorithms.baselines.fedavg import State, evaluate, init, models  # noqa: F401 - FedAvg's, part of the record
from fedray.algorithms.rounds import class_count_update
from fedray.config.hparams import bound
from fedray.engine.client import Client
from fedray.engine.update import Batch, Step
from fedray.federation import Federation
from fedray.records import Record


@dataclass
class Hparams(fedavg.ServerHparams):
    # scale of the logits of classes the client lacks (FedConcat App. D.1: 0.5)
    alpha: float = field(default=0.5, metadata=bound(ge=0, le=1))


def class_scales(counts: np.ndarray, alpha: float) -> np.ndarray:
    """s_c = alpha + (1 - alpha) n_c / max n."""
    counts = np.asarray(counts, dtype=np.float64)
    return alpha + (1 - alpha) * counts / counts.max()


def restricted_softmax(model: Any, batch: Batch, context: dict) -> Step:
    """Cross-entropy on logits s_c <w_c, h> + b_c (context ``per_class``: the scales s); the
    reported logits are the unscaled ones."""
    h = model.encoder(batch.x)
    head = model.head
    scaled = torch.nn.functional.linear(h, head.weight * context["per_class"][:, None], head.bias)
    ce = batch.cross_entropy(scaled)
    return Step(head(h), ce, ce)


def fedrs_update(client: Client, cstate: Any, msg: dict, alpha: float):
    """FedAvg's client update with the restricted softmax of the client's own class scales."""
    return (
        yield from class_count_update(
            client, cstate, msg, partial(class_scales, alpha=alpha), restricted_softmax
        )
    )


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    return fedavg.fedavg_round(state, fed, hp, rnd, partial(fedrs_update, alpha=hp.alpha))
