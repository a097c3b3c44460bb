"""A fedray plug-in with its own local objective: FedAvg whose clients train with label smoothing.

Each client minimises (1 - eps) CE(f(x), y) + eps U(f(x)), U being the mean over the classes of
-log softmax(f(x)): the cross-entropy against labels smoothed towards uniform (Szegedy et al.,
"Rethinking the Inception Architecture", 2016). The server averages as FedAvg. With eps = 0 it is
FedAvg exactly (its reduces-to test: tests/front/test_plugins.py).

The client function says what to train and gets the result back: it yields a
``fedray.LocalUpdate`` whose objective is ``smoothed`` and whose context carries eps. Written this
way, the same function trains one client at a time or many clients as one stack
(``batched_clients: on``, or ``auto`` on a GPU) with no other code: docs/extending.md.

    fedray run --plugin examples/plugin/fedavg_ls.py --set algorithm=fedavg_ls

(the embedded default, digits and the MLP; examples/plugin/config.yaml is fedavgm's, whose hp it refuses)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import fedray  # every name a plug-in needs is fedray's own (docs/extending.md#what-is-stable)


@dataclass
class Hparams:
    smoothing: float = field(
        default=0.1, metadata=fedray.bound(ge=0, lt=1)
    )  # eps: the weight of the uniform target


@dataclass
class State:
    params: fedray.Params  # the global model


def init(fed: fedray.Federation, hp: Hparams) -> State:
    return State(fedray.get_params(fed.task.build_model()))


def smoothed(model, batch: fedray.Batch, context) -> fedray.Step:
    """(1 - eps) CE + eps U over the batch; the reported loss (``sgd_loss``) is the plain CE."""
    out = model(batch.x)
    ce = batch.cross_entropy(out)
    uniform = batch.mean(-torch.log_softmax(out, dim=1).mean(dim=1))
    eps = context["smoothing"]
    return fedray.Step(out, ce, (1 - eps) * ce + eps * uniform)


def smoothed_update(client: fedray.Client, cstate, msg):
    """Client function: the received model trained on the smoothed objective. ``cstate`` is the
    client's own state, None on its first call; this algorithm keeps none."""
    trained = yield fedray.LocalUpdate(
        msg["params"], msg["round"], objective=smoothed, context={"smoothing": msg["smoothing"]}
    )
    return fedray.train_reply(client, trained.params, trained.stats), cstate


def round(state: State, fed: fedray.Federation, hp: Hparams, rnd: int):  # noqa: A001
    cids = fed.sample(fed.task.participation, fed.task.rng("sample", rnd=rnd))
    replies = fed.map(
        smoothed_update, cids, {"params": state.params, "round": rnd, "smoothing": hp.smoothing}
    )
    return State(fedray.fedavg_aggregate(replies)), fedray.train_records(replies)


def evaluate(state: State, fed: fedray.Federation, hp: Hparams, rnd: int) -> list[fedray.Record]:
    return fedray.single_model_records(fed, state.params)  # FedAvg's: the global model everywhere


def models(state: State, hp: Hparams) -> list[fedray.SavedModel]:
    return fedray.global_model(state.params)


fedray.register_algorithm("fedavg_ls", __import__(__name__))
