"""Clustering clients: label distributions, K-means on hand-made distributions, the balanced cap,
the elbow, DP noise (docs/algorithms/fedconcat.md#equations: F1, F3, F4)."""

from __future__ import annotations

import numpy as np
import pytest

from fedray.algorithms.clustering import (
    balanced_cap,
    balanced_kmeans,
    cluster_vectors,
    elbow,
    kmeans,
    label_distributions,
    laplace_noise,
)


def rng(seed=0):
    return np.random.default_rng(seed)


def test_label_distributions_are_counts_over_client_size():
    p = label_distributions({1: np.array([0, 3, 1]), 0: np.array([2, 2, 0])})
    assert p.tolist() == [[0.5, 0.5, 0.0], [0.0, 0.75, 0.25]]  # sorted client order


def hand_made(n_per=4, noise=0.02, seed=0):
    """Three obvious groups of #C=2-like distributions over 6 classes."""
    r = rng(seed)
    protos = np.array([[0.5, 0.5, 0, 0, 0, 0], [0, 0, 0.5, 0.5, 0, 0], [0, 0, 0, 0, 0.5, 0.5]])
    x = np.repeat(protos, n_per, axis=0) + r.uniform(0, noise, (3 * n_per, 6))
    return {c: v / v.sum() for c, v in enumerate(x)}, np.repeat(np.arange(3), n_per)


def same_partition(a, b) -> bool:
    """Equal up to renaming the clusters."""
    pairs = set(zip(a, b, strict=True))
    return len(pairs) == len(set(a)) == len(set(b))


def test_kmeans_recovers_hand_made_groups_and_is_seeded():
    vectors, truth = hand_made()
    got = cluster_vectors(vectors, 3, rng(1))
    assert same_partition([got.assignment[c] for c in sorted(vectors)], truth)
    assert got.k == 3
    sizes = {r["entity"]: r["value"] for r in got.records if r["metric"] == "cluster_size"}
    assert sizes == {0: 4, 1: 4, 2: 4}
    again = cluster_vectors(vectors, 3, rng(1))
    assert again.assignment == got.assignment


def test_balanced_kmeans_honours_the_cap():
    # 10 points in one tight blob and 2 far away: plain K-means with K=2 splits 10 / 2.
    r = rng(0)
    x = np.vstack([r.normal(0, 0.01, (10, 2)), r.normal(5, 0.01, (2, 2))])
    plain, _, _ = kmeans(x, 2, rng(0))
    assert sorted(np.bincount(plain)) == [2, 10]
    cap = balanced_cap(12, 2)
    assert cap == 7  # floor(1.2 * 12 / 2)
    labels = balanced_kmeans(x, 2, cap, rng(0))
    assert np.bincount(labels, minlength=2).max() <= cap and (labels >= 0).all()
    assert sorted(np.bincount(labels)) == [5, 7]  # the far pair keeps together, topped up to the cap
    assert len(set(labels[10:])) == 1
    # F4's paper example: 40 clients, 5 clusters -> 9 each at most; 200 and 2 -> 120
    assert balanced_cap(40, 5) == 9 and balanced_cap(200, 2) == 120
    assert balanced_cap(3, 2) == 2  # floor(1.8) = 1 could not hold 3 clients


def test_elbow_finds_the_bend_and_records_the_curve():
    vectors, _ = hand_made(n_per=5, noise=0.01)
    x = np.stack([vectors[c] for c in sorted(vectors)])
    k, curve = elbow(x, range(1, 8), rng(0))
    assert k == 3 and sorted(curve) == list(range(1, 8))
    assert curve[1] > curve[2] > curve[3] and curve[3] < 0.05 * curve[1]
    got = cluster_vectors(vectors, 99, rng(0), elbow_range=[1, 7], stage="encoder")
    assert got.k == 3 and len(set(got.assignment.values())) == 3
    rows = [r for r in got.records if r["metric"] == "elbow_inertia"]
    assert [r["entity"] for r in rows] == list(range(1, 8)) and {r["stage"] for r in rows} == {"encoder"}


def test_laplace_noise_has_the_dp_scale_and_is_not_clipped():
    p = np.full((2000, 10), 0.1)
    noisy = laplace_noise(p, 2.5, rng(0))
    # Laplace(0, b) has mean absolute deviation b = 1 / eps = 0.4
    assert np.mean(np.abs(noisy - p)) == pytest.approx(0.4, rel=0.03)
    assert (noisy < 0).any()
