"""FedAvg: McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient Learning of
Deep Networks from Decentralized Data", AISTATS 2017; procedure as in NIID-Bench (docs/algorithms/common.md#the-fedavg-core).

Each round: sample the first floor(N * participation) clients of a random permutation; each runs
``local_epochs`` of SGD (fresh optimizer) from the global weights; the server takes the
data-size-weighted average of all state-dict entries. ``server_lr`` != 1 turns the average into a
server step w + eta_g (avg - w) (FedAvgM-style without momentum); 1 is the paper and NIID-Bench.

FedAvg as the FedRC codebase (FedEM's) runs it, for the side-by-side on its FMNIST-C: each client
keeps its own SGD optimizer, so its momentum buffer carries over from its last round
(``persistent_optimizer``), and its loaders drop each epoch's last partial batch (``drop_last``; a
client of 180 samples at batch 128 takes one step, not two). Both off by default, as the paper and
NIID-Bench; the same two options as IFCA's, FeSEM's and CFL's.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Any

from fedray.algorithms.evaluation import single_model_records
from fedray.algorithms.plan import RunPlan
from fedray.algorithms.rounds import fedavg_aggregate, kept_update, local_update, train_records
from fedray.config.hparams import bound
from fedray.federation import ClientFn, Federation
from fedray.params import Params, get_params
from fedray.records import Record
from fedray.storage.export import SavedModel, global_model


@dataclass
class ServerHparams:
    """The server step FedAvg and the algorithms that change only its local objective share."""

    # eta_g: global step size on (average - current); 1 = plain FedAvg average
    server_lr: float = field(default=1.0, metadata=bound(gt=0))


@dataclass
class StragglerHparams:
    """FedProx's systems heterogeneity (Li et al. 2020, Sec. 5.2): this fraction of each round's
    sampled clients are stragglers, each running a number of local epochs drawn uniformly from
    1..E-1 instead of E (the same clients and epochs for every algorithm of a seed). FedAvg drops
    them (its round waits for no one: their work is lost); FedProx keeps their partial work."""

    # fraction of each round's clients that straggle: 1..E-1 local epochs (FedProx's systems heterogeneity)
    stragglers: float = field(default=0.0, metadata=bound(ge=0, lt=1))
    drop_stragglers: bool = True  # the server leaves the stragglers' updates out (FedAvg)


@dataclass
class Hparams(ServerHparams, StragglerHparams):
    persistent_optimizer: bool = False  # each client keeps its SGD buffers across rounds (the FedRC code)
    drop_last: bool = False  # drop each epoch's last partial batch (the FedRC code's loaders)


def check_run(run: RunPlan, hp: Any) -> None:
    """Stragglers need E >= 2 (their epochs are drawn from 1..E-1), and the plain local update."""
    if hp.stragglers and run.local_epochs < 2:
        raise ValueError(
            f"hp.stragglers: a straggler runs 1..E-1 local epochs, so local_epochs must be 2 or more, got {run.local_epochs}"
        )
    if hp.stragglers and (getattr(hp, "persistent_optimizer", False) or getattr(hp, "drop_last", False)):
        raise ValueError(
            "hp.stragglers: not with hp.persistent_optimizer or hp.drop_last (the FedRC code's update)"
        )


@dataclass
class State:
    params: Params  # the global model w_t


def init(fed: Federation, hp: Hparams) -> State:
    return State(get_params(fed.task.build_model()))


def models(state: State, hp: Hparams) -> list[SavedModel]:
    """The trained model, saved when the run finishes (fedray/storage/export.py)."""
    return global_model(state.params)


def server_step(current: Params, average: Params, server_lr: float) -> Params:
    if server_lr == 1.0:
        return average  # exactly the weighted average, no round-off from w + (avg - w)
    return {k: (current[k] + server_lr * (average[k] - current[k])).astype(current[k].dtype) for k in current}


def fedavg_round(
    state: State, fed: Federation, hp: ServerHparams, rnd: int, update: ClientFn = local_update, **extra
) -> tuple[State, list[Record]]:
    """FedAvg's round with any client update that takes and returns FedAvg's messages (FedProx,
    MOON, FedRS and FedLC change only the local objective; their hyperparameters are bound into
    ``update`` with functools.partial, so the messages, and the bytes counted, stay FedAvg's);
    ``extra`` goes into the message too."""
    cids = fed.sample(fed.task.participation, fed.task.rng("sample", rnd=rnd))
    slow = stragglers(fed, hp, cids, rnd)
    if slow and getattr(hp, "drop_stragglers", False):
        cids, slow = [c for c in cids if c not in slow], {}
        if not cids:  # every sampled client straggled: nothing arrives, the model stays
            return state, []
    if slow:
        extra = {**extra, "epochs": slow}
    replies = fed.map(update, cids, {"params": state.params, "round": rnd, **extra})
    return State(server_step(state.params, fedavg_aggregate(replies), hp.server_lr)), train_records(replies)


def stragglers(fed: Federation, hp: Any, cids: list[int], rnd: int) -> dict[int, int]:
    """Round ``rnd``'s stragglers among ``cids`` and their local epochs: round(|cids| x
    hp.stragglers) of them, each with epochs uniform in 1..E-1, drawn from the round's own stream
    (so every algorithm of a seed gets the same ones); {} without ``hp.stragglers``."""
    frac = getattr(hp, "stragglers", 0.0)
    if not frac:
        return {}
    g = fed.task.rng("stragglers", rnd=rnd)
    slow = sorted(int(c) for c in g.choice(cids, builtins.round(len(cids) * frac), replace=False))
    return {c: int(g.integers(1, fed.task.local_epochs)) for c in slow}


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    if hp.persistent_optimizer or hp.drop_last:
        return fedavg_round(
            state,
            fed,
            hp,
            rnd,
            kept_update,
            persistent_optimizer=hp.persistent_optimizer,
        )
    return fedavg_round(state, fed, hp, rnd)


def evaluate(state: State, fed: Federation, hp: Hparams, rnd: int) -> list[Record]:
    return single_model_records(fed, state.params)
