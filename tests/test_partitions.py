"""Partitions (ALGORITHMS.md §7): structure, determinism, and the §7.3 sanity ranges."""

from __future__ import annotations

import numpy as np
import pytest

from fedray.data.partitions import (
    PartitionError,
    PartitionParams,
    by_labels,
    clientwise_dirichlet,
    dirichlet,
    dominant,
    iid,
    quantity,
    split_train_test,
)

# §7.3's simulation: 10 balanced classes of 6,000 samples, N = 40.
LABELS = np.repeat(np.arange(10), 6000)


def params(**kw) -> PartitionParams:
    return PartitionParams(**{"num_clients": 40, "num_classes": 10, **kw})


def assert_disjoint(parts, total=None):
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "a sample went to two clients"
    if total is not None:
        assert len(allidx) == total


def classes_present(parts):
    return np.mean([len(np.unique(LABELS[p])) for p in parts])


@pytest.mark.parametrize("fn,kw", [(iid, {}), (by_labels, {"k": 2}), (dirichlet, {"beta": 0.5}), (quantity, {"beta": 0.5}),
                                   (clientwise_dirichlet, {"beta": 1.0}), (dominant, {"beta": 0.5, "clusters": 4})])  # fmt: skip
def test_same_generator_seed_gives_same_partition(fn, kw):
    a = fn(LABELS, params(**kw), np.random.default_rng(3))
    b = fn(LABELS, params(**kw), np.random.default_rng(3))
    c = fn(LABELS, params(**kw), np.random.default_rng(4))
    assert all(np.array_equal(x, y) for x, y in zip(a.clients, b.clients, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a.clients, c.clients, strict=True))
    assert len(a.clients) == 40
    assert_disjoint(a.clients)


def test_iid_sizes_differ_by_at_most_one_and_cover_everything():
    p = iid(LABELS, params(), np.random.default_rng(0))
    sizes = [len(c) for c in p.clients]
    assert max(sizes) - min(sizes) <= 1
    assert_disjoint(p.clients, total=len(LABELS))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dirichlet_0_1_matches_section_7_3_ranges(seed):
    p = dirichlet(LABELS, params(beta=0.1), np.random.default_rng(seed))
    sizes = np.array([len(c) for c in p.clients])
    assert_disjoint(p.clients, total=len(LABELS))
    assert sizes.min() >= 10
    # §7.3: sizes about 15..6,800, mean 1,500; 4.6-5.1 classes present on average.
    assert sizes.max() <= 7500 and sizes.mean() == pytest.approx(1500)
    assert 4.0 <= classes_present(p.clients) <= 5.6


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dirichlet_0_5_matches_section_7_3_ranges(seed):
    p = dirichlet(LABELS, params(beta=0.5), np.random.default_rng(seed))
    sizes = np.array([len(c) for c in p.clients])
    # §7.3: sizes about 280..3,100 with 8.2-8.6 classes present.
    assert 150 <= sizes.min() and sizes.max() <= 3600
    assert 7.9 <= classes_present(p.clients) <= 8.9


@pytest.mark.parametrize("k,lo,hi", [(2, 1050, 2060), (3, 1150, 2170)])
def test_labels_k_matches_section_7_3_ranges(k, lo, hi):
    for seed in range(3):
        p = by_labels(LABELS, params(k=k), np.random.default_rng(seed))
        sizes = np.array([len(c) for c in p.clients])
        assert_disjoint(p.clients, total=len(LABELS))
        assert sizes.min() >= lo * 0.9 and sizes.max() <= hi * 1.1
        for i, c in enumerate(p.clients):
            held = set(np.unique(LABELS[c]).tolist())
            assert len(held) == k and i % 10 in held  # client i always holds label i mod C


def test_labels_k_equal_classes_gives_every_client_every_class():
    p = by_labels(LABELS, params(k=10), np.random.default_rng(0))
    assert all(len(np.unique(LABELS[c])) == 10 for c in p.clients)
    assert_disjoint(p.clients, total=len(LABELS))


def test_dirichlet_that_cannot_meet_min_size_names_the_key():
    with pytest.raises(PartitionError, match="partition_beta"):
        dirichlet(LABELS[:200], params(num_clients=40, beta=0.01, min_size=10), np.random.default_rng(0))


def test_quantity_keeps_labels_iid_and_varies_sizes():
    p = quantity(LABELS, params(beta=0.5), np.random.default_rng(0))
    sizes = np.array([len(c) for c in p.clients])
    assert_disjoint(p.clients, total=len(LABELS))
    assert sizes.min() >= 10 and sizes.max() > 3 * sizes.min()
    big = p.clients[int(np.argmax(sizes))]
    shares = np.bincount(LABELS[big], minlength=10) / len(big)
    assert np.all(np.abs(shares - 0.1) < 0.03)


def test_dominant_gives_each_group_its_dominant_class_at_fraction_beta():
    p = dominant(LABELS, params(num_clients=20, beta=0.5, clusters=4, size=1000), np.random.default_rng(0))
    assert p.groups is not None and p.groups.tolist() == [i % 4 for i in range(20)]
    assert_disjoint(p.clients)
    doms = []
    for g in range(4):
        members = [p.clients[i] for i in range(20) if p.groups[i] == g]
        counts = [np.bincount(LABELS[c], minlength=10) for c in members]
        dom = int(np.argmax(counts[0]))
        doms.append(dom)
        for c in counts:
            assert c.sum() == 1000 and c[dom] == 500
            others = np.delete(c, dom)
            assert others.max() - others.min() <= 1  # the rest spread evenly over the other classes
    assert len(set(doms)) == 4


def test_dominant_automatic_size_fits_the_pools():
    p = dominant(LABELS, params(num_clients=40, beta=0.5, clusters=2), np.random.default_rng(0))
    assert_disjoint(p.clients)
    assert len({len(c) for c in p.clients}) == 1


def test_clientwise_dirichlet_fixed_size_and_skew():
    p = clientwise_dirichlet(LABELS, params(num_clients=300, beta=1.0), np.random.default_rng(0))
    assert all(len(c) == 200 for c in p.clients)  # M = floor(n / N)
    assert_disjoint(p.clients, total=60000)
    # §7.7: with alpha = 1.0, about 4.2-4.5 classes present and ~66% in the top class on average.
    present = np.mean([len(np.unique(LABELS[c])) for c in p.clients])
    top = np.mean([np.bincount(LABELS[c]).max() / len(c) for c in p.clients])
    assert 3.5 <= present <= 5.5
    assert 0.55 <= top <= 0.75


def test_split_train_test_keeps_fraction_and_one_train_sample():
    idx = np.arange(100, 150)
    tr, te = split_train_test(idx, 0.1, np.random.default_rng(0))
    assert len(te) == 5 and len(tr) == 45 and set(tr) | set(te) == set(idx)
    tr, te = split_train_test(np.array([7]), 0.5, np.random.default_rng(0))
    assert tr.tolist() == [7] and len(te) == 0
