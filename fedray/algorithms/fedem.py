"""FedEM: Marfoq, Neglia, Bellet, Kameni, Vidal, "Federated Multi-Task Learning under a Mixture of
Distributions", NeurIPS 2021 (ALGORITHMS.md §4.1), as the FedRC codebase runs it.

K global models. Each participant, per round (client state: gamma K x n, omega K, and with
``persistent_optimizer`` one SGD buffer set per model; `fedray.mixture.client`):

1. E-step with the received models: per-sample losses l_kj on its training split (eval mode),
   gamma_kj = softmax_k(log omega_k - l_kj); omega_k = mean_j gamma_kj;
2. trains each model with omega_k > 0 for the local epochs on (1/|B|) sum_b gamma_bk CE_b, from
   the received weights (drop_last batches, as the code's loaders).

The server averages each model over every sampled client, weights n_i, a participant that skipped
model k counting with the model it received (the paper's Algorithm 1; `fedray.mixture.server`).
Model k starts from its own init (seed + k, as the code).

Prediction is the omega-weighted softmax ensemble (``hard_predict``: the argmax model's;
`fedray.mixture.ensemble`): ``accuracy`` on the global test set with the population's omega, or
the shift preset's test clients' mean, each after one E-step per round on its 90% (never with a
label prior) read on its 10%; ``local_accuracy`` and ``train_accuracy`` each client's ensemble on
its test and training split. FedRC (`fedrc.py`) is this round with a label prior in the E-step.
"""

from __future__ import annotations

from fedray.federation import Federation
from fedray.mixture import ensemble
from fedray.mixture.client import ClientMixture  # noqa: F401 - the name checkpoints of format 1 give it
from fedray.mixture.server import (
    MixtureHparams,
    MixtureState,
    init,
    mixture_round,
    models,
    update_test_clients,
)
from fedray.records import Record

__all__ = ["Hparams", "State", "init", "models", "round", "evaluate"]

Hparams = MixtureHparams  # K, hard_predict, persistent_optimizer, drop_last: the mixture round's own
State = MixtureState  # the K models (FedRC's prior fields stay None and empty)


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    new, records, _ = mixture_round(state, fed, hp, rnd, {})
    update_test_clients(fed, new)
    return new, records


def evaluate(state: State, fed: Federation, hp: Hparams, rnd: int) -> list[Record]:
    return ensemble.evaluate(fed, state.models, hp.hard_predict)
