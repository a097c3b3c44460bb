"""A mixture of K global models, as FedEM and FedRC train it (docs/algorithms/mixture.md#fedems-round, docs/algorithms/mixture.md#fedrcs-label-prior).

This module holds the E/M pieces: pure numpy, no federation. The rest of the family, which FedEM
(`fedray.algorithms.mixture.fedem`) and FedRC (`fedray.algorithms.mixture.fedrc`) share:

- `fedray.algorithms.mixture.client`: a client's mixture state (gamma, omega, SGD buffers per model) and its
  update (E-step, then each model trained on its gamma-weighted loss);
- `fedray.algorithms.mixture.fedem`: the server's state, the per-model average and the round;
- `fedray.algorithms.mixture.ensemble`: the omega-weighted ensemble evaluated on the clients' splits, the
  global test set and the shift preset's test clients.

Shapes: K models, n samples of one client, C classes. ``losses[k, j]`` is model k's cross-entropy
on sample j; ``gamma[k, j]`` the sample's responsibility of model k; ``omega[k]`` the client's
mixture weights; ``prior[k, y]`` FedRC's label prior C_{y,k}.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PRIOR_FLOOR = 1e-8  # FedRC code: every per-class gamma sum is floored here before normalising


def e_step(
    losses: np.ndarray, omega: np.ndarray, labels: np.ndarray, prior: np.ndarray | None = None
) -> np.ndarray:
    """gamma[k, j] = softmax_k( log omega_k - l_kj - log C_{y_j, k} ) (FedRC eq. 3; FedEM without ``prior``).

    A model with omega_k = 0 gets gamma = 0 (log 0 = -inf; absorbing, docs/algorithms/mixture.md#edge-cases).
    """
    with np.errstate(divide="ignore"):
        logits = np.log(np.asarray(omega, dtype=np.float64))[:, None] - np.asarray(losses, dtype=np.float64)
        if prior is not None:
            log_c = np.log(np.asarray(prior, dtype=np.float64)[:, labels])
            # minus each sample's largest log C first: the softmax does not change, and a prior that is
            # the same for every model adds exactly 0 (FedRC with a constant prior is FedEM, bit for bit)
            logits = logits - (log_c - log_c.max(axis=0, keepdims=True))
    logits -= logits.max(axis=0, keepdims=True)
    w = np.exp(logits)
    return w / w.sum(axis=0, keepdims=True)


def omega_update(gamma: np.ndarray) -> np.ndarray:
    """omega_k = (1/n) sum_j gamma_kj (the M-step for the mixture weights)."""
    return np.asarray(gamma, dtype=np.float64).mean(axis=1)


def label_stats(gamma: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """S[k, y] = sum of gamma_kj over the samples j of class y (raw sums, what a client reports)."""
    g = np.asarray(gamma, dtype=np.float64)
    out = np.zeros((g.shape[0], num_classes))
    for k in range(g.shape[0]):
        out[k] = np.bincount(labels, weights=g[k], minlength=num_classes)
    return out


def label_prior(stats: np.ndarray, floor: float = PRIOR_FLOOR) -> np.ndarray:
    """C_{y,k} from the summed statistics of all clients: each sum floored at ``floor``, then
    normalised over the classes of each model (FedRC code, docs/algorithms/mixture.md#fedrcs-label-prior step 5). Returns K x C."""
    s = np.maximum(np.asarray(stats, dtype=np.float64), floor)
    return s / s.sum(axis=1, keepdims=True)


@dataclass(frozen=True)
class AdamConstants:
    alpha: float = 1.0
    beta1: float = 0.9  # paper App. H.3; the code uses 0.5
    beta2: float = 0.99  # paper; the code uses 0.5
    eps: float = 1e-8


PAPER_ADAM = AdamConstants()
CODE_ADAM = AdamConstants(beta1=0.5, beta2=0.5)


def adam_gamma(
    gamma_prev: np.ndarray, gamma_e: np.ndarray, nu: np.ndarray, a: np.ndarray, c: AdamConstants
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FedRC-Adam (App. H.3, eqs. 98-103): a step of gamma towards the E-step result ``gamma_e``.

    g = gamma_prev - gamma_e; nu = (1 - b1) g + b1 nu; a = (1 - b2) g^2 + b2 a;
    gamma = gamma_prev - alpha (nu / (1 - b1)) / (sqrt(a / (1 - b2)) + eps), then clipped at 0 and
    renormalised over the models of each sample. The bias correction uses the constant (1 - b), as
    the code. Returns (gamma, nu, a).
    """
    g = gamma_prev - gamma_e
    nu = (1 - c.beta1) * g + c.beta1 * nu
    a = (1 - c.beta2) * g**2 + c.beta2 * a
    step = gamma_prev - c.alpha * (nu / (1 - c.beta1)) / (np.sqrt(a / (1 - c.beta2)) + c.eps)
    step = np.maximum(step, 0.0)
    total = step.sum(axis=0, keepdims=True)
    # a sample whose every entry clipped to 0 keeps the E-step's responsibilities
    gamma = np.where(total > 0, step / np.where(total > 0, total, 1.0), gamma_e)
    return gamma, nu, a


def models_to_keep(gamma_sums: np.ndarray, delta: float) -> np.ndarray:
    """Adaptive removal (App. F, Alg. 3): keep model k unless its share of all responsibilities,
    sum_{i,j} gamma_ijk / sum_{i,j,k} gamma_ijk, is below ``delta``. ``gamma_sums[k]`` is summed over
    all clients' samples. Never removes every model: the largest stays."""
    s = np.asarray(gamma_sums, dtype=np.float64)
    keep = s / s.sum() >= delta
    keep[int(np.argmax(s))] = True
    return keep


def drop_models(gamma: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Remove the rows of dropped models and renormalise every sample's responsibilities; omega is
    recomputed from them. Returns (gamma, omega)."""
    g = np.asarray(gamma, dtype=np.float64)[keep]
    total = g.sum(axis=0, keepdims=True)
    g = np.where(total > 0, g / np.where(total > 0, total, 1.0), 1.0 / g.shape[0])
    return g, omega_update(g)


def ensemble_proba(probas: np.ndarray, omega: np.ndarray, hard: bool = False) -> np.ndarray:
    """p(y | x) = clamp(sum_k omega_k softmax(f_k(x)), 0, 1) (App. H.2). ``probas`` is K x n x C.
    ``hard``: omega replaced by the one-hot of its argmax (hard-cluster prediction, Table 15)."""
    w = np.asarray(omega, dtype=np.float64)
    if hard:
        w = np.eye(len(w))[int(np.argmax(w))]
    return np.clip(np.tensordot(w, np.asarray(probas, dtype=np.float64), axes=1), 0.0, 1.0)
