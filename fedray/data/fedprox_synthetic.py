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

The global test set is every client's test samples pooled, as FedProx evaluates. The multinomial
logistic regression of the paper is ``model: logreg``; ``mlp`` works on it too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedray import seeding
from fedray.coercion import ConfigError
from fedray.data.datasets import ArrayDataset, Dataset, DatasetInfo, DatasetKind, DataSpec, register_dataset
from fedray.data.federated import ClientIndices, FederatedData

if TYPE_CHECKING:
    from fedray.config import Config

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


def _build(cfg: Config) -> tuple[Dataset, dict[int, ClientIndices]]:
    xs, ys, tests, clients, start = [], [], [], {}, 0
    for cid in range(cfg.num_clients):
        x, y, n_train = client_arrays(cfg.seed, cfg.synthetic_alpha, cfg.synthetic_beta, cid)
        xs.append(x)
        ys.append(y)
        clients[cid] = ClientIndices(np.arange(start, start + n_train), np.arange(start + n_train, start + len(y)))
        tests.append(clients[cid].test)
        start += len(y)
    x, y = np.concatenate(xs), np.concatenate(ys)
    pooled = np.concatenate(tests)
    spec = DataSpec((DIM,), CLASSES, scale=1.0)
    return Dataset("fedprox_synthetic", ArrayDataset(x, y), ArrayDataset(x[pooled], y[pooled]), spec), clients


def federated(cfg: Config) -> FederatedData:
    """The data set with its clients."""
    ds, clients = _build(cfg)
    return FederatedData(ds, clients, None)


def _check(cfg: Config) -> None:
    if cfg.shift != "none":
        raise ConfigError("config key 'shift': fedprox_synthetic makes its own clients; a shift preset does not apply")


def label(config: dict) -> str:
    """How reports name its runs' partition: Synthetic(alpha,beta)."""
    return f"Synthetic({config.get('synthetic_alpha', 1.0):g},{config.get('synthetic_beta', 1.0):g})"


register_dataset(
    DatasetKind(
        "fedprox_synthetic",
        lambda cfg: _build(cfg)[0],
        lambda cfg: DatasetInfo((DIM,), CLASSES, None),
        keys=("synthetic_alpha", "synthetic_beta"),
        check=_check,
        federate=federated,
        partition_label=label,
    )
)
