"""A fedray plug-in: one algorithm and one model fedray does not ship.

- ``fedavgm``: FedAvg with server momentum (Hsu, Qi, Brown, "Measuring the Effects of
  Non-Identical Data Distribution for Federated Visual Classification", 2019). The server treats
  the round's change as a gradient, Delta = w - avg(w_i), keeps a velocity v <- beta v + Delta and
  steps w <- w - server_lr v. With beta = 0 and server_lr = 1 it is FedAvg exactly (the plug-in's
  reduces-to test, tests/front/test_plugins.py::test_fedavgm_with_no_momentum_is_fedavg_exactly).
- ``digits_cnn``: a small CNN for 8x8 images (sklearn's digits, fedray's default data set): one
  3x3 convolution, a 2x2 pool and a linear head.

Name it in a config (``plugins: [fedavgm.py]``, relative to the config) or on the command line
(``fedray run --plugin examples/plugin/fedavgm.py --set algorithm=fedavgm``). docs/extending.md says
what an algorithm module defines and which fedray calls it may use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from torch import nn

import fedray  # every name a plug-in needs is fedray's own (docs/extending.md#what-is-stable)


@dataclass
class Hparams:
    beta: float = field(default=0.9, metadata=fedray.bound(ge=0, lt=1))  # server momentum (Hsu et al.: 0.9)
    server_lr: float = field(default=1.0, metadata=fedray.bound(gt=0))  # server step size on the velocity


@dataclass
class State:
    params: fedray.Params  # the global model w
    velocity: fedray.Params | None = None  # v: None until the first round


def init(fed: fedray.Federation, hp: Hparams) -> State:
    return State(fedray.get_params(fed.task.build_model()))


def server_momentum(state: State, average: fedray.Params, hp: Hparams) -> State:
    if hp.beta == 0 and hp.server_lr == 1.0:
        return State(average, None)  # FedAvg exactly: no round-off from w - (w - avg)
    w = state.params
    delta = {k: w[k] - average[k] for k in w}
    v = delta if state.velocity is None else {k: hp.beta * state.velocity[k] + delta[k] for k in w}
    return State({k: (w[k] - hp.server_lr * v[k]).astype(w[k].dtype) for k in w}, v)


def round(state: State, fed: fedray.Federation, hp: Hparams, rnd: int) -> tuple[State, list[fedray.Record]]:  # noqa: A001
    cids = fed.sample(fed.task.participation, fed.task.rng("sample", rnd=rnd))
    replies = fed.map(fedray.local_update, cids, {"params": state.params, "round": rnd})
    new = server_momentum(state, fedray.fedavg_aggregate(replies), hp)
    norm = (
        0.0
        if new.velocity is None
        else float(np.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for v in new.velocity.values())))
    )
    return new, [*fedray.train_records(replies), fedray.rec("velocity_norm", norm)]


def evaluate(state: State, fed: fedray.Federation, hp: Hparams, rnd: int) -> list[fedray.Record]:
    return fedray.single_model_records(fed, state.params)  # FedAvg's: the global model everywhere


def models(state: State, hp: Hparams) -> list[fedray.SavedModel]:
    return fedray.global_model(state.params)


# Imported by name in every process of a run (driver, coordinator, client actors), this module
# registers itself: the same registry the built-ins are in.
fedray.register_algorithm("fedavgm", __import__(__name__))


@fedray.register_model(
    "digits_cnn", problem=lambda shape: None if len(shape) == 3 else "needs C x H x W images"
)
def digits_cnn(input_shape: tuple[int, ...], num_classes: int) -> fedray.EncoderHead:
    c, h, w = input_shape
    encoder = nn.Sequential(nn.Conv2d(c, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
    features = 16 * (h // 2) * (w // 2)
    return fedray.EncoderHead(encoder, nn.Linear(features, num_classes), features)
