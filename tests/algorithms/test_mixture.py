"""The E/M pieces of FedEM and FedRC, on numbers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedray.algorithms.mixture import (
    CODE_ADAM,
    PAPER_ADAM,
    adam_gamma,
    drop_models,
    e_step,
    ensemble_proba,
    label_prior,
    label_stats,
    models_to_keep,
    omega_update,
)

LOSSES = np.array([[1.0, 2.0], [2.0, 1.0]])  # model k (rows) on sample j (columns)
LABELS = np.array([0, 1])


def test_e_step_two_samples_two_models_by_hand():
    g = e_step(LOSSES, np.array([0.5, 0.5]), LABELS)
    s = 1 / (1 + math.exp(-1))  # softmax(-1, -2) = (1/(1 + e^-1), ...)
    np.testing.assert_allclose(g, [[s, 1 - s], [1 - s, s]])
    # omega = (3/4, 1/4): sample 0 has odds 3 e^-1 : e^-2 = 3e : 1
    g = e_step(LOSSES, np.array([0.75, 0.25]), LABELS)
    assert g[0, 0] == pytest.approx(3 * math.e / (3 * math.e + 1))
    np.testing.assert_allclose(omega_update(g), g.mean(axis=1))
    # FedRC's prior C_{y,k}: model 0 holds class 0 (0.9), model 1 class 1. Sample 0 (y = 0) has odds
    # (e^-1 / 0.9) : (e^-2 / 0.1) = e/9 : 1, so the prior pushes it towards the model that LACKS its label
    prior = np.array([[0.9, 0.1], [0.1, 0.9]])
    g = e_step(LOSSES, np.array([0.5, 0.5]), LABELS, prior)
    assert g[0, 0] == pytest.approx(math.e / (9 + math.e))
    np.testing.assert_allclose(g.sum(axis=0), 1.0)


def test_a_constant_prior_is_fedem_and_a_zero_weight_is_absorbing():
    omega = np.array([0.3, 0.7])
    np.testing.assert_allclose(
        e_step(LOSSES, omega, LABELS, np.full((2, 2), 0.5)), e_step(LOSSES, omega, LABELS)
    )
    g = e_step(LOSSES, np.array([1.0, 0.0]), LABELS)
    np.testing.assert_array_equal(g, [[1.0, 1.0], [0.0, 0.0]])


def test_label_statistics_and_the_prior_floor():
    gamma = np.array([[0.7, 0.2, 1.0], [0.3, 0.8, 0.0]])
    s = label_stats(gamma, np.array([0, 1, 0]), 3)
    np.testing.assert_allclose(s, [[1.7, 0.2, 0.0], [0.3, 0.8, 0.0]])
    c = label_prior(s)
    # class 2 never seen: floored at 1e-8 before normalising, so log C ~ -18 and not -inf
    assert c[0, 2] == pytest.approx(1e-8 / (1.9 + 1e-8)) and c[0, 2] > 0
    np.testing.assert_allclose(c.sum(axis=1), 1.0)
    np.testing.assert_allclose(c[1, :2], np.array([0.3, 0.8]) / (1.1 + 1e-8))


def test_fedrc_adam_on_hand_numbers():
    prev, target = np.array([[0.6], [0.4]]), np.array([[0.5], [0.5]])
    zero = np.zeros_like(prev)
    # step 1: g = (0.1, -0.1), nu = 0.1 g, a = 0.01 g^2 -> a step of exactly alpha = 1 against g:
    # (0.6 - 1, 0.4 + 1) = (-0.4, 1.4) -> clipped (0, 1.4) -> (0, 1)
    g1, nu, a = adam_gamma(prev, target, zero, zero, PAPER_ADAM)
    np.testing.assert_allclose(g1, [[0.0], [1.0]], atol=1e-6)
    np.testing.assert_allclose(nu, [[0.01], [-0.01]])
    # step 2: g = (-0.5, 0.5); nu0 = 0.1 (-0.5) + 0.9 (0.01) = -0.041; a = 0.01 (0.25) + 0.99 (1e-4) = 0.002599
    # gamma0 = 0 + 0.41 / sqrt(0.2599) = 0.804230..., gamma1 = 1 - 0.804230... (sums to 1 already)
    g2, nu, a = adam_gamma(g1, target, nu, a, PAPER_ADAM)
    r = 0.41 / (math.sqrt(0.2599) + 1e-8)
    np.testing.assert_allclose(g2, [[r], [1 - r]], rtol=1e-6)
    np.testing.assert_allclose(a, [[0.002599], [0.002599]])
    # the code's constants b1 = b2 = 0.5: the same first step; then nu0 = 0.5 (-0.5) + 0.5 (0.05) = -0.225,
    # a = 0.5 (0.25) + 0.5 (0.005) = 0.1275, gamma0 = 0.45 / sqrt(0.255) = 0.891133...
    c1, nu, a = adam_gamma(prev, target, zero, zero, CODE_ADAM)
    np.testing.assert_allclose(c1, [[0.0], [1.0]], atol=1e-6)
    c2, _, _ = adam_gamma(c1, target, nu, a, CODE_ADAM)
    r = 0.45 / (math.sqrt(0.255) + 1e-8)
    np.testing.assert_allclose(c2, [[r], [1 - r]], rtol=1e-6)


def test_removal_renormalises_gamma_and_omega():
    keep = models_to_keep(np.array([50.0, 3.0, 47.0]), delta=0.05)
    np.testing.assert_array_equal(keep, [True, False, True])
    assert models_to_keep(np.array([1.0, 1.0]), delta=0.9).any()  # never every model
    gamma = np.array([[0.5, 0.2], [0.3, 0.0], [0.2, 0.8]])
    g, omega = drop_models(gamma, keep)
    np.testing.assert_allclose(g, [[0.5 / 0.7, 0.2], [0.2 / 0.7, 0.8]])
    np.testing.assert_allclose(omega, [(0.5 / 0.7 + 0.2) / 2, (0.2 / 0.7 + 0.8) / 2])


def test_ensemble_prediction_soft_and_hard():
    probas = np.array([[[0.9, 0.1]], [[0.2, 0.8]]])
    np.testing.assert_allclose(ensemble_proba(probas, np.array([0.25, 0.75])), [[0.375, 0.625]])
    np.testing.assert_allclose(ensemble_proba(probas, np.array([0.25, 0.75]), hard=True), [[0.2, 0.8]])
