"""FedEM: Marfoq, Neglia, Bellet, Kameni, Vidal, "Federated Multi-Task Learning under a Mixture of
Distributions", NeurIPS 2021 (docs/algorithms/mixture.md#fedems-round), as the FedRC codebase runs it.

K global models. Each participant, per round (client state: gamma K x n, omega K, and with
``persistent_optimizer`` one SGD buffer set per model; `fedray.algorithms.mixture.client`):

1. E-step with the received models: per-sample losses l_kj on its training split (eval mode),
   gamma_kj = softmax_k(log omega_k - l_kj); omega_k = mean_j gamma_kj;
2. trains each model with omega_k > 0 for the local epochs on (1/|B|) sum_b gamma_bk CE_b, from
   the received weights (drop_last batches, as the code's loaders).

The server averages each model over every sampled client, weights n_i (the paper's Algorithm 1 and
the FedRC code; FedEM's own code weighs over all clients, the same at full participation): a
participant that skipped model k (omega_k = 0) counts with the model it received, so a model few
clients train moves little. Replies are folded into the per-model sums one at a time
(`Federation.map_fold`), so the coordinator never holds every client's K models. Model k starts
from its own init (seed + k, as the code). Per round, every participant's omega goes to
``assignments/`` (one row per model, weight omega_k).

Prediction is the omega-weighted softmax ensemble (``hard_predict``: the argmax model's;
`fedray.algorithms.mixture.ensemble`): ``accuracy`` on the global test set with the population's omega, or
the shift preset's test clients' mean, each after one E-step per round on its 90% (never with a
label prior) read on its 10%; ``local_accuracy`` and ``train_accuracy`` each client's ensemble on
its test and training split. FedRC (`fedrc.py`) is this round with a label prior in the E-step.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

import numpy as np

from fedray.algorithms.mixture import ensemble
from fedray.algorithms.mixture.client import (
    ClientMixture,  # noqa: F401 - the name checkpoints of format 1 give it
    mixture_update,
    test_client_e_step,
)
from fedray.algorithms.rounds import reply_bytes
from fedray.config.hparams import bound
from fedray.federation import Federation
from fedray.params import Params, WeightedSum
from fedray.records import Record, assignment_rec, rec
from fedray.storage.blobs import checkpoint_tag
from fedray.storage.export import SavedModel, cluster_models

__all__ = ["Hparams", "State", "init", "models", "round", "evaluate"]


@dataclass
class MixtureHparams:
    num_clusters: int = field(default=3, metadata=bound(ge=1))  # K: mixture components (global models)
    # predict with the client's argmax-omega model instead of the omega-weighted ensemble
    hard_predict: bool = False
    # each client keeps its SGD buffers per model across rounds (the code does)
    persistent_optimizer: bool = True
    drop_last: bool = True  # drop each epoch's last partial batch (the code's loaders)


@checkpoint_tag(
    "mixture.MixtureState", "fedray.algorithms.fedem:MixtureState", "fedray.mixture.server:MixtureState"
)
@dataclass
class MixtureState:
    """The K models, and FedRC's label prior with what it is computed from (unused by FedEM: None
    and empty). One class for both, so a checkpoint of either reads back whatever wrote it."""

    models: dict[int, Params]  # model id -> theta_k (ids stay fixed when FedRC removes a model)
    prior: np.ndarray | None = None  # FedRC: C_{y,k}, K x C over the live models (None: FedEM)
    stats: dict[int, np.ndarray] = field(default_factory=dict)  # FedRC: each client's last reported S, K x C
    shares: np.ndarray | None = None  # FedRC: each live model's share of all responsibilities, last round


def init(fed: Federation, hp: MixtureHparams) -> MixtureState:
    return MixtureState(fed.task.init_models(hp.num_clusters))


def models(state: MixtureState, hp: MixtureHparams) -> list[SavedModel]:
    """The K component models (ids fixed: a model FedRC removed is missing)."""
    return cluster_models(state.models)


class MixtureAverage:
    """Per-model FedAvg over every sampled client (FedEM's Algorithm 1, line 11, and the FedRC code's
    aggregator): theta_k = sum_i n_i theta_ik / sum_i n_i, where a client that skipped model k
    (omega_ik = 0) brings the model it received. Fed one reply at a time."""

    def __init__(self, received: dict[int, Params]) -> None:
        self.received = received
        self.sums = {mid: WeightedSum() for mid in received}
        self.trained = dict.fromkeys(received, 0)  # clients that trained each model

    def add(self, trained: list[Params | None], n: float) -> None:
        for mid, params in zip(self.sums, trained, strict=True):
            if params is not None:
                self.trained[mid] += 1
            self.sums[mid].add(self.received[mid] if params is None else params, n)

    def result(self) -> dict[int, Params]:
        return {mid: s.result() for mid, s in self.sums.items() if s.count}


def mixture_round(
    state: MixtureState, fed: Federation, hp: MixtureHparams, rnd: int, extra: dict
) -> tuple[MixtureState, list, dict]:
    """The sampled clients' update and the per-model FedAvg; ``extra`` goes into the message (FedRC:
    prior, Adam constants, noise). Returns the new state (models), the records and the replies."""
    ids = sorted(state.models)
    cids = fed.sample(fed.task.participation, fed.task.rng("sample", rnd=rnd))
    msg = {
        "ids": ids,
        "models": [state.models[i] for i in ids],
        "round": rnd,
        "persistent_optimizer": hp.persistent_optimizer,
        **extra,
    }
    # Each reply is folded into the per-model sums as it arrives (3 models x 300 clients would be
    # gigabytes held at once); what is left of it (omega, statistics, counts) is small. A worker
    # takes as many clients a call as its replies at a time hold (64 MB on the CPU, a share of the
    # device on a GPU): where it trains batched, their K models each train in one stack (one client
    # a call stacked only its own K).
    agg = MixtureAverage({mid: state.models[mid] for mid in ids})
    size = reply_bytes(msg["models"][0], copies=len(ids)) if ids else 0

    def fold(replies: dict, cid: int, reply: dict) -> dict:
        agg.add(reply.pop("models"), reply["num_examples"])
        replies[cid] = copy.deepcopy(reply)  # owned copies: Ray's arrays are views that pin the whole reply
        return replies

    replies = fed.map_fold(mixture_update, cids, msg, fold, {}, reply_bytes=size)
    models = {**state.models, **agg.result()}
    records: list[Record] = [
        rec("participants", agg.trained[mid], scope="cluster", entity=mid) for mid in ids
    ]
    samples = sum(r["train_samples"] for r in replies.values())
    if samples:  # train_accuracy / train_loss come from evaluation: the ensembles on the training splits
        records.append(rec("sgd_loss", sum(r["train_loss_sum"] for r in replies.values()) / samples))
    records.append(rec("participants", len(cids)))
    records += [
        assignment_rec(c, mid, float(replies[c]["omega"][row])) for c in cids for row, mid in enumerate(ids)
    ]
    return replace(state, models=models), records, replies


def update_test_clients(fed: Federation, state: MixtureState) -> None:
    """The shift preset's test clients take the round's models and run their E-step (after every
    round, as the FedRC code does at its default log_freq of 1, whatever the evaluation interval), so
    the number an evaluation reads at a round does not depend on ``eval_every``."""
    if fed.test_client_ids:
        ids = sorted(state.models)
        fed.map(
            test_client_e_step, fed.test_client_ids, {"ids": ids, "models": [state.models[i] for i in ids]}
        )


Hparams = MixtureHparams  # K, hard_predict, persistent_optimizer, drop_last: the mixture round's own
State = MixtureState  # the K models (FedRC's prior fields stay None and empty)


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    new, records, _ = mixture_round(state, fed, hp, rnd, {})
    update_test_clients(fed, new)
    return new, records


def evaluate(state: State, fed: Federation, hp: Hparams, rnd: int) -> list[Record]:
    return ensemble.evaluate(fed, state.models, hp.hard_predict, rnd)
