"""FedProx's Synthetic(alpha, beta) (``dataset: fedprox_synthetic``): Li, Sahu, Zaheer, Sanjabi,
Talwalkar, Smith, "Federated Optimization in Heterogeneous Networks", MLSys 2020, Sec. 5.1 (the
LEAF synthetic task). A data set that comes with its clients: no partition is drawn.

Client k's data, drawn from (seed, k) alone, so any client can be made without the others:

- its size n_k = floor(LogNormal(4, 2)) + 50 (a power law: most clients small, a few very large);
- its model y = argmax(W_k x + b_k) over 10 classes and 60 features, with every entry of W_k and b_k
  drawn from N(u_k, 1) and u_k ~ N(0, alpha): alpha sets how far the clients' models differ;
- its inputs x ~ N(v_k, Sigma), Sigma diagonal with Sigma_jj = j^-1.2 (j = 1..60), v_k's entries from
  N(B_k, 1) and B_k ~ N(0, beta): beta sets how far the clients' inputs differ;
- a shuffle, then the first 90% of its samples for training and the rest for testing.

The global test set is every client's test samples pooled, as FedProx evaluates (with
``eval_clients``: those clients' test samples). Nothing is generated for a client until it is used
(`SyntheticSource`, a `fedray.data.federated.ClientSource`): a run over a million clients holds a
seed, not their samples. The multinomial
logistic regression of the paper is ``model: logreg``; ``mlp`` works on it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fedray.config import seeding
from fedray.config.coercion import ConfigError
from fedray.data.datasets import (
    ArrayDataset,
    Dataset,
    DatasetInfo,
    DatasetKind,
    DataSpec,
    data_seed,
    register_dataset,
)
from fedray.data.federated import ClientSource, FederatedData, SourcedClients, evaluation_clients

if TYPE_CHECKING:
    from fedray.config.sections import DataSection

DIM, CLASSES = 60, 10
TRAIN_FRACTION = 0.9
_SCALE = np.arange(1, DIM + 1, dtype=np.float64) ** -0.6  # sqrt of Sigma's diagonal, j^-1.2


def _size(g: np.random.Generator) -> int:
    """n_k = floor(LogNormal(4, 2)) + 50: the first draw of a client's stream."""
    return int(g.lognormal(4, 2)) + 50


def client_size(seed: int, cid: int) -> int:
    """n_k: client ``cid``'s number of samples (train and test), without drawing the rest."""
    return _size(seeding.rng(seed, "fedprox_synthetic", cid))


def client_arrays(seed: int, alpha: float, beta: float, cid: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Client ``cid``'s samples (float32 inputs, int64 labels), training samples first, and how
    many of them are for training."""
    g = seeding.rng(seed, "fedprox_synthetic", cid)
    n = _size(g)
    u, b_shift = g.normal(0, alpha), g.normal(0, beta)
    v = g.normal(b_shift, 1, DIM)
    w, b = g.normal(u, 1, (DIM, CLASSES)), g.normal(u, 1, CLASSES)
    x = v + g.standard_normal((n, DIM)) * _SCALE
    y = np.argmax(x @ w + b, axis=1)
    order = g.permutation(n)
    return x[order].astype(np.float32), y[order].astype(np.int64), int(TRAIN_FRACTION * n)


@dataclass(frozen=True)
class SyntheticSource(ClientSource):
    """The clients of one Synthetic(alpha, beta) run, each made from (seed, client) when used."""

    seed: int
    alpha: float
    beta: float
    num_clients: int

    def split(self, cid: int) -> tuple[int, int]:
        n = client_size(self.seed, cid)
        return int(TRAIN_FRACTION * n), n - int(TRAIN_FRACTION * n)

    def samples(self, cid: int) -> ArrayDataset:
        x, y, _ = client_arrays(self.seed, self.alpha, self.beta, cid)
        return ArrayDataset(x, y)


def federated(section: DataSection) -> FederatedData:
    """The data set with its clients: made on demand; the global test set is the evaluated
    clients' test splits pooled (every client's, unless ``eval_clients`` picks some)."""
    source = SyntheticSource(
        data_seed(section), section.synthetic_alpha, section.synthetic_beta, section.num_clients
    )
    clients = SourcedClients(source)
    chosen = evaluation_clients(section.seed, clients.ids, section.eval_clients)
    xs, ys = [np.zeros((0, DIM), np.float32)], [np.zeros(0, np.int64)]
    for cid in clients.ids if chosen is None else chosen:
        made, n_train = source.samples(cid), source.split(cid)[0]
        xs.append(made.x[n_train:])
        ys.append(made.y[n_train:])
    empty = ArrayDataset(np.zeros((0, DIM), np.float32), np.zeros(0, np.int64))
    test = ArrayDataset(np.concatenate(xs), np.concatenate(ys))
    dataset = Dataset("fedprox_synthetic", empty, test, DataSpec((DIM,), CLASSES, scale=1.0))
    return FederatedData(dataset, clients, None, eval_clients=chosen)


# Beyond this many clients a run must name the clients it evaluates on (eval_clients): every
# client's test split pooled is about 45 samples a client, and each evaluation would visit them all.
MAX_POOLED_CLIENTS = 10_000


def _check(section: DataSection) -> None:
    if section.shift != "none":
        raise ConfigError(
            "config key 'shift': fedprox_synthetic makes its own clients; a shift preset does not apply"
        )
    if section.num_clients > MAX_POOLED_CLIENTS and section.eval_clients == 0:
        raise ConfigError(
            f"config key 'eval_clients': fedprox_synthetic over {section.num_clients} clients evaluates on every "
            f"client's test split unless told otherwise (more than {MAX_POOLED_CLIENTS} clients: about 45 samples "
            "each, all visited at every evaluation); set eval_clients (e.g. 1000) to evaluate on that many, "
            "drawn once from the seed"
        )


def label(config: dict) -> str:
    """How reports name its runs' partition: Synthetic(alpha,beta)."""
    return f"Synthetic({config.get('synthetic_alpha', 1.0):g},{config.get('synthetic_beta', 1.0):g})"


register_dataset(
    DatasetKind(
        "fedprox_synthetic",
        lambda section: federated(section).dataset,
        lambda section: DatasetInfo((DIM,), CLASSES, None),
        keys=("synthetic_alpha", "synthetic_beta"),
        check=_check,
        federate=federated,
        partition_label=label,
    )
)
