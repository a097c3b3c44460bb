"""FedProx: Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in Heterogeneous
Networks", MLSys 2020 (docs/algorithms/baselines.md#fedprox; NIID-Bench experiments.py train_net_fedprox).

FedAvg's round; every client minimises CE(w; batch) + (mu/2) sum ||w - w^t||^2 over the model's
parameters (not its buffers), w^t being the global model it received this round. The optimizer's
weight decay applies on top, as in NIID-Bench. mu = 0 is FedAvg exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fedray.algorithms.baselines import fedavg
from fedray.algorithms.baselines.fedavg import State, check_run, evaluate, init, models  # noqa: F401 - FedAvg's, part of the record
from fedray.algorithms.rounds import local_sgd_reply, msg_epochs
from fedray.config.hparams import bound
from fedray.engine.client import Client
from fedray.engine.update import proximal
from fedray.federation import Federation
from fedray.records import Record


@dataclass
class Hparams(fedavg.ServerHparams, fedavg.StragglerHparams):
    # proximal weight (NIID-Bench default; FedConcat tunes {0.001, 0.01}, FedCat up to 1)
    mu: float = field(default=0.001, metadata=bound(ge=0))
    drop_stragglers: bool = False  # FedProx keeps the stragglers' partial work (hp.stragglers)


def prox_update(client: Client, cstate: Any, msg: dict, mu: float):
    """Client function: the proximal objective anchored at w^t, the model as received."""
    context = {"anchor": msg["params"], "mu": mu}
    reply = yield from local_sgd_reply(
        client, msg["params"], msg["round"], proximal, context, epochs=msg_epochs(client, msg)
    )
    return reply, cstate


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    return fedavg.fedavg_round(state, fed, hp, rnd, partial(prox_update, mu=hp.mu))
