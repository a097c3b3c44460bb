"""FedAvg: McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient Learning of
Deep Networks from Decentralized Data", AISTATS 2017; procedure as in NIID-Bench (ALGORITHMS.md §0.2).

Each round: sample the first floor(N * participation) clients of a random permutation; each runs
``local_epochs`` of SGD (fresh optimizer) from the global weights; the server takes the
data-size-weighted average of all state-dict entries. ``server_lr`` != 1 turns the average into a
server step w + eta_g (avg - w) (FedAvgM-style without momentum); 1 is the paper and NIID-Bench.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedray.evaluation import single_model_records
from fedray.export import SavedModel, global_model
from fedray.federation import ClientFn, Federation
from fedray.hparams import bound
from fedray.params import Params, get_params
from fedray.records import Record
from fedray.rounds import fedavg_aggregate, local_update, train_records


@dataclass
class Hparams:
    # eta_g: global step size on (average - current); 1 = plain FedAvg average
    server_lr: float = field(default=1.0, metadata=bound(gt=0))


@dataclass
class State:
    params: Params  # the global model w_t


def init(fed: Federation, hp: Hparams) -> State:
    return State(get_params(fed.task.build_model()))


def models(state: State, hp: Hparams) -> list[SavedModel]:
    """The trained model, saved when the run finishes (fedray/export.py)."""
    return global_model(state.params)


def server_step(current: Params, average: Params, server_lr: float) -> Params:
    if server_lr == 1.0:
        return average  # exactly the weighted average, no round-off from w + (avg - w)
    return {k: (current[k] + server_lr * (average[k] - current[k])).astype(current[k].dtype) for k in current}


def fedavg_round(
    state: State, fed: Federation, hp: Hparams, rnd: int, update: ClientFn = local_update
) -> tuple[State, list[Record]]:
    """FedAvg's round with any client update that takes and returns FedAvg's messages (FedProx,
    MOON, FedRS and FedLC change only the local objective; their hyperparameters are bound into
    ``update`` with functools.partial, so the messages, and the bytes counted, stay FedAvg's)."""
    cids = fed.sample(fed.task.participation, fed.task.rng("sample", rnd=rnd))
    replies = fed.map(update, cids, {"params": state.params, "round": rnd})
    return State(server_step(state.params, fedavg_aggregate(replies), hp.server_lr)), train_records(replies)


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    return fedavg_round(state, fed, hp, rnd)


def evaluate(state: State, fed: Federation, hp: Hparams, rnd: int) -> list[Record]:
    return single_model_records(fed, state.params)
