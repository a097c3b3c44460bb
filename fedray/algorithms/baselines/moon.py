"""MOON: Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021 (docs/algorithms/baselines.md#moon;
MOON main.py train_net_fedcon, model.py ModelFedCon; NIID-Bench train_net_moon).

The model is the task's model with a projection head (z = L2(ReLU(L1(h))), L2 to ``out_dim``; the
classifier reads z); ``out_dim: 0`` drops the head (NIID-Bench's use_projection_head=False). Each
client minimises CE + mu l_con, where
    l_con = -log( exp(cos(z, z_glob)/T) / (exp(cos(z, z_glob)/T) + exp(cos(z, z_prev)/T)) ),
z_glob from the global model it received (frozen, eval mode) and z_prev from its own local model
of the last round it took part in (buffer of one, kept as client state: it never travels). In
round 0 the pool is empty, so l_con is a cross-entropy over one logit, zero (docs/algorithms/baselines.md#d3-moons-contrastive-term-in-round-0).
After round 0 the references keep every client's model in the pool, participant or not: a client
that took part in no round yet still holds the shared initial model, and that is its negative
(under partial participation). It rebuilds that model from the run's seed, so nothing travels for
it. FedAvg's sampling, averaging and evaluation; mu = 0 without the projection head is FedAvg
exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from fedray.algorithms.baselines import fedavg
from fedray.algorithms.baselines.fedavg import State
from fedray.algorithms.evaluation import single_model_records
from fedray.algorithms.rounds import local_sgd_reply
from fedray.config.hparams import bound
from fedray.engine.client import Client
from fedray.engine.update import Batch, Frozen, Step
from fedray.federation import Federation
from fedray.models import Arch
from fedray.params import Params, get_params
from fedray.records import Record
from fedray.storage.export import SavedModel, global_model


@dataclass
class Hparams(fedavg.ServerHparams):
    # weight of the contrastive term (MOON: 1, tuned {1, 5}; FedConcat's FMNIST: {0.001, 0.01, 0.1})
    mu: float = field(default=1.0, metadata=bound(ge=0))
    temperature: float = field(default=0.5, metadata=bound(gt=0))  # T
    # projection head output size; 0 = no projection head
    out_dim: int = field(default=256, metadata=bound(ge=0))


def arch(hp: Hparams) -> Arch:
    return Arch(projection=hp.out_dim)


def init(fed: Federation, hp: Hparams) -> State:
    return State(get_params(fed.task.build_model(arch=arch(hp))))


def models(state: State, hp: Hparams) -> list[SavedModel]:
    return global_model(state.params, arch(hp))  # with its projection head, as trained


def contrastive(model: Any, batch: Batch, context: dict) -> Step:
    """CE + mu * l_con: a cross-entropy over [cos(z, z_glob), cos(z, z_prev)] / T with target 0.
    Context: ``mu``, ``temperature``, the frozen models ``glob`` and ``prev`` (None: no negative)."""
    z = model.encoder(batch.x)
    logits = model.head(z)
    ce = batch.cross_entropy(logits)
    glob, prev = context["glob"], context["prev"]
    with torch.no_grad():
        others = [glob.encoder(batch.x)] + ([prev.encoder(batch.x)] if prev is not None else [])
    sims = torch.stack([torch.nn.functional.cosine_similarity(z, o, dim=1) for o in others], dim=1)
    target = torch.zeros(len(batch.y), dtype=torch.long, device=batch.y.device)
    l_con = batch.cross_entropy(sims / context["temperature"], target)
    return Step(logits, ce, ce + context["mu"] * l_con)


def moon_update(client: Client, cstate: Params | None, msg: dict, mu: float, temperature: float, arch: Arch):
    """Client function; its state is its local model from the last round it took part in."""
    if cstate is not None:
        prev = Frozen(cstate, arch)
    elif msg["round"] > 0:  # not in the pool's first round: the initial model it still holds
        prev = Frozen(
            client.kept("moon-initial", arch, lambda: get_params(client.task.build_model(arch=arch))), arch
        )
    else:
        prev = None
    context = {"mu": mu, "temperature": temperature, "glob": Frozen(msg["params"], arch), "prev": prev}
    reply = yield from local_sgd_reply(client, msg["params"], msg["round"], contrastive, context, arch=arch)
    return reply, reply["params"]


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    update = partial(moon_update, mu=hp.mu, temperature=hp.temperature, arch=arch(hp))
    return fedavg.fedavg_round(state, fed, hp, rnd, update)


def evaluate(state: State, fed: Federation, hp: Hparams, rnd: int) -> list[Record]:
    return single_model_records(fed, state.params, arch=arch(hp))
