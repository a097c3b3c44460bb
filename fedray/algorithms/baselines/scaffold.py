"""SCAFFOLD: Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020 (docs/algorithms/baselines.md#scaffold; NIID-Bench train_net_scaffold).

The server keeps a control variate c, each client its own c_i (client state, zero at first: the
code's random start is equivalent, only differences are used). A participant receives w and c,
takes its local SGD steps, and after every optimizer step corrects w <- w - lr (c - c_i) (outside
the optimizer, as the code: momentum does not see it). With K_i steps, option II:
c_i+ = c_i - c + (w - w_i) / (K_i lr); it sends back w_i and Delta c_i = c_i+ - c_i, and keeps c_i+.
The server averages the models as FedAvg (then ``server_lr``) and moves c by the client deltas:
``server_update: paper`` c += (1/N) sum Delta c_i; ``code`` (NIID-Bench) c += mean over the
participants. Identical at full participation (docs/algorithms/baselines.md#d2-scaffolds-server-control-variate). c and Delta c_i travel, so they
count in bytes_down / bytes_up. Control variates cover every floating-point state-dict entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedray.algorithms.baselines import fedavg
from fedray.algorithms.baselines.fedavg import evaluate, models, server_step  # noqa: F401 - FedAvg's evaluation, part of the record
from fedray.algorithms.rounds import local_sgd_reply, reply_bytes, train_records, train_stats
from fedray.config.hparams import one_of
from fedray.engine.client import Client
from fedray.federation import Federation
from fedray.params import OrderedAverage, Params, get_params
from fedray.records import Record

SERVER_UPDATES = ("paper", "code")


@dataclass
class Hparams(fedavg.ServerHparams):
    # paper: c += (1/N) sum of deltas; code: c += their mean over participants
    server_update: str = field(default="paper", metadata=one_of(*SERVER_UPDATES))


@dataclass
class State:
    params: Params  # the global model w
    c: Params  # the server's control variate, over the floating-point entries of w


def zeros_like(params: Params) -> Params:
    return {k: np.zeros_like(v) for k, v in params.items() if np.issubdtype(np.asarray(v).dtype, np.floating)}


def init(fed: Federation, hp: Hparams) -> State:
    params = get_params(fed.task.build_model())
    return State(params, zeros_like(params))


def scaffold_update(client: Client, cstate: Params | None, msg: dict):
    """Client function; its state is c_i. After every step the model moves by -lr (c - c_i)."""
    w, c = msg["params"], msg["c"]
    ci = zeros_like(c) if cstate is None else cstate
    reply = yield from local_sgd_reply(client, w, msg["round"], correction={k: c[k] - ci[k] for k in c})
    return with_control(reply, w, c, ci, client.task.lr)


def with_control(reply: dict, w: Params, c: Params, ci: Params, lr: float) -> tuple[dict, Params]:
    """The reply with delta c_i, and the new c_i = c_i - c + (w - w_i) / (K lr) (option II)."""
    steps, wi = reply["steps"], reply["params"]
    new_ci = {k: (ci[k] - c[k] + (w[k] - wi[k]) / (steps * lr)).astype(c[k].dtype) for k in c}
    reply["delta_c"] = {k: new_ci[k] - ci[k] for k in c}
    return reply, new_ci


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    """The participants' replies are folded one at a time in client order (`Federation.map_fold`):
    the coordinator holds the running sums, not a reply per participant (1,000 a round at 10^5
    clients), with the same floats as averaging them all at once."""
    cids = fed.sample(fed.task.participation, fed.task.rng("sample", rnd=rnd))
    sizes = fed.num_examples(cids)
    average = OrderedAverage([sizes[c] for c in cids])  # FedAvg's weighted average, in client order
    deltas = {k: np.zeros(ck.shape, dtype=np.float64) for k, ck in state.c.items()}
    stats: dict[int, dict] = {}

    def fold(acc: None, cid: int, reply: dict) -> None:
        average.add(reply["params"])
        for k in deltas:
            deltas[k] += reply["delta_c"][k]
        stats[cid] = train_stats(reply)

    msg = {"params": state.params, "c": state.c, "round": rnd}
    fed.map_fold(scaffold_update, cids, msg, fold, None, reply_bytes=reply_bytes(state.params, copies=2))
    params = server_step(state.params, average.result(), hp.server_lr)
    scale = len(stats) if hp.server_update == "code" else len(fed.client_ids)
    c = {k: (ck + deltas[k] / scale).astype(ck.dtype) for k, ck in state.c.items()}
    return State(params, c), train_records(stats)
