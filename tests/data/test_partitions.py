"""Partitions (docs/algorithms/partitions.md#partitions): structure, determinism, and the docs/algorithms/partitions.md#dirichlet sanity ranges."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedray.data.partitions import (
    PARTITIONS,
    Partition,
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

# docs/algorithms/partitions.md#dirichlet's simulation: 10 balanced classes of 6,000 samples, N = 40.
LABELS = np.repeat(np.arange(10), 6000)


def params(draw, num_clients: int = 40, **keys) -> PartitionParams:
    """The params of ``draw``'s partition for 10 classes: ``keys`` (config key names), else Config's defaults."""
    (scheme,) = [s for s in PARTITIONS.values() if s.draw is draw]
    return scheme.params(num_clients, 10, **keys)


def assert_disjoint(parts, total=None):
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "a sample went to two clients"
    if total is not None:
        assert len(allidx) == total


def classes_present(parts):
    return np.mean([len(np.unique(LABELS[p])) for p in parts])


@pytest.mark.parametrize(
    "fn,kw",
    [
        (iid, {}),
        (by_labels, {"partition_k": 2}),
        (dirichlet, {"partition_beta": 0.5}),
        (quantity, {"partition_beta": 0.5}),
        (clientwise_dirichlet, {"partition_beta": 1.0}),
        (dominant, {"partition_beta": 0.5, "partition_clusters": 4}),
    ],
)
def test_same_generator_seed_gives_same_partition(fn, kw):
    a = fn(LABELS, params(fn, **kw), np.random.default_rng(3))
    b = fn(LABELS, params(fn, **kw), np.random.default_rng(3))
    c = fn(LABELS, params(fn, **kw), np.random.default_rng(4))
    assert all(np.array_equal(x, y) for x, y in zip(a.clients, b.clients, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a.clients, c.clients, strict=True))
    assert len(a.clients) == 40
    assert_disjoint(a.clients)


def test_iid_sizes_differ_by_at_most_one_and_cover_everything():
    p = iid(LABELS, params(iid), np.random.default_rng(0))
    sizes = [len(c) for c in p.clients]
    assert max(sizes) - min(sizes) <= 1
    assert_disjoint(p.clients, total=len(LABELS))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dirichlet_0_1_matches_section_7_3_ranges(seed):
    p = dirichlet(LABELS, params(dirichlet, partition_beta=0.1), np.random.default_rng(seed))
    sizes = np.array([len(c) for c in p.clients])
    assert_disjoint(p.clients, total=len(LABELS))
    assert sizes.min() >= 10
    # docs/algorithms/partitions.md#dirichlet: sizes about 15..6,800, mean 1,500; 4.6-5.1 classes present on average.
    assert sizes.max() <= 7500 and sizes.mean() == pytest.approx(1500)
    assert 4.0 <= classes_present(p.clients) <= 5.6


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dirichlet_0_5_matches_section_7_3_ranges(seed):
    p = dirichlet(LABELS, params(dirichlet, partition_beta=0.5), np.random.default_rng(seed))
    sizes = np.array([len(c) for c in p.clients])
    # docs/algorithms/partitions.md#dirichlet: sizes about 280..3,100 with 8.2-8.6 classes present.
    assert 150 <= sizes.min() and sizes.max() <= 3600
    assert 7.9 <= classes_present(p.clients) <= 8.9


@pytest.mark.parametrize("k,lo,hi", [(2, 1050, 2060), (3, 1150, 2170)])
def test_labels_k_matches_section_7_3_ranges(k, lo, hi):
    for seed in range(3):
        p = by_labels(LABELS, params(by_labels, partition_k=k), np.random.default_rng(seed))
        sizes = np.array([len(c) for c in p.clients])
        assert_disjoint(p.clients, total=len(LABELS))
        assert sizes.min() >= lo * 0.9 and sizes.max() <= hi * 1.1
        for i, c in enumerate(p.clients):
            held = set(np.unique(LABELS[c]).tolist())
            assert len(held) == k and i % 10 in held  # client i always holds label i mod C


def test_labels_k_equal_classes_gives_every_client_every_class():
    p = by_labels(LABELS, params(by_labels, partition_k=10), np.random.default_rng(0))
    assert all(len(np.unique(LABELS[c])) == 10 for c in p.clients)
    assert_disjoint(p.clients, total=len(LABELS))


def test_dirichlet_that_cannot_meet_min_size_names_the_key():
    with pytest.raises(PartitionError, match="partition_beta"):
        dirichlet(
            LABELS[:200],
            params(dirichlet, num_clients=40, partition_beta=0.01, partition_min_size=10),
            np.random.default_rng(0),
        )


def test_quantity_keeps_labels_iid_and_varies_sizes():
    p = quantity(LABELS, params(quantity, partition_beta=0.5), np.random.default_rng(0))
    sizes = np.array([len(c) for c in p.clients])
    assert_disjoint(p.clients, total=len(LABELS))
    assert sizes.min() >= 10 and sizes.max() > 3 * sizes.min()
    big = p.clients[int(np.argmax(sizes))]
    shares = np.bincount(LABELS[big], minlength=10) / len(big)
    assert np.all(np.abs(shares - 0.1) < 0.03)


def test_dominant_gives_each_group_its_dominant_class_at_fraction_beta():
    p = dominant(
        LABELS,
        params(dominant, num_clients=20, partition_beta=0.5, partition_clusters=4, partition_size=1000),
        np.random.default_rng(0),
    )
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
    p = dominant(
        LABELS,
        params(dominant, num_clients=40, partition_beta=0.5, partition_clusters=2),
        np.random.default_rng(0),
    )
    assert_disjoint(p.clients)
    assert len({len(c) for c in p.clients}) == 1


def test_clientwise_dirichlet_fixed_size_and_skew():
    p = clientwise_dirichlet(
        LABELS, params(clientwise_dirichlet, num_clients=300, partition_beta=1.0), np.random.default_rng(0)
    )
    assert all(len(c) == 200 for c in p.clients)  # M = floor(n / N)
    assert_disjoint(p.clients, total=60000)
    # docs/algorithms/partitions.md#clientwise_dirichlet: with alpha = 1.0, about 4.2-4.5 classes present and ~66% in the top class on average.
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


# ------------------------------------------------------------------------------------------------
# The registry: one record per partition
# ------------------------------------------------------------------------------------------------

# Every partition, the config keys it reads and its report label for the run below. This table is
# the test's own, written out on purpose: a change to the registry shows up here.
EXPECTED = {
    "iid": ((), "iid"),
    "labels": (("partition_k",), "#C=3"),
    "dirichlet": (("partition_beta", "partition_min_size"), "dirichlet(0.25)"),
    "quantity": (("partition_beta", "partition_min_size"), "quantity(0.25)"),
    "dominant": (("partition_beta", "partition_clusters", "partition_size"), "dominant(0.25,K=5)"),
    "clientwise_dirichlet": (("partition_beta",), "clientwise_dirichlet(0.25)"),
    "rotation": (("partition_clusters", "partition_size"), "rotation"),
    "file": (("partition_file", "partition_name"), "#C=2"),
}


def test_every_partition_is_one_record_with_its_keys_and_label():
    from fedray.config.keys import Config

    assert set(PARTITIONS) == set(EXPECTED)
    config = {
        **Config().to_dict(),
        "partition_k": 3,
        "partition_beta": 0.25,
        "partition_clusters": 5,
        "partition_name": "#C=2",
        "partition_file": "out/partitions/x.parquet",
    }
    for name, (keys, label) in EXPECTED.items():
        scheme = PARTITIONS[name]
        assert scheme.name == name and scheme.keys == keys, name
        assert scheme.describe({**config, "partition": name}) == label, name
    assert PARTITIONS["file"].describe({**config, "partition_name": ""}) == "x"  # the file's name
    # Every partition_* key of the Config is read by some partition; nothing else is declared.
    partition_fields = {f for f in Config.__dataclass_fields__ if f.startswith("partition_")}
    assert {k for s in PARTITIONS.values() for k in s.keys} == partition_fields


def test_the_grouped_partitions_are_those_whose_record_says_so():
    from fedray.data import GROUPED_PARTITIONS

    assert sorted(GROUPED_PARTITIONS) == ["dominant", "rotation"]
    assert "dominant" in GROUPED_PARTITIONS and "dirichlet" not in GROUPED_PARTITIONS


def test_a_draw_gets_its_declared_keys_with_the_config_defaults_and_nothing_else():
    from fedray.config.keys import Config

    p = PARTITIONS["dirichlet"].params(40, 10, partition_beta=0.1)
    assert p["partition_beta"] == 0.1 and p["partition_min_size"] == Config().partition_min_size
    with pytest.raises(KeyError, match="does not declare"):
        p["partition_k"]
    with pytest.raises(KeyError, match="reads"):
        PARTITIONS["dirichlet"].params(40, 10, partition_k=3)
    # Each built-in draw reads only the keys its record declares (a KeyError otherwise).
    for name, scheme in PARTITIONS.items():
        if name != "file":
            size = {"partition_size": 100} if "partition_size" in scheme.keys else {}
            assert (
                len(scheme.draw(LABELS, scheme.params(8, 10, **size), np.random.default_rng(0)).clients) == 8
            )


def test_the_report_labels_come_from_the_registry():
    from analysis.report import _covered, partition_label

    base = {"dataset": "fmnist", "partition": "dominant", "partition_beta": 0.5, "partition_clusters": 2}
    assert partition_label(base) == "dominant(0.5,K=2)"
    assert partition_label({**base, "partition": "gone"}) == "gone"  # a partition no longer registered
    # The keys the labels stand for (runs differing there are told apart by the label itself).
    assert _covered(["partition"]) == {
        "partition",
        "partition_k",
        "partition_beta",
        "partition_clusters",
        "partition_file",
        "partition_name",
    }


def test_a_plugged_in_partition_is_chosen_validated_drawn_and_labelled(tmp_path):
    """A partition from outside fedray: registered once, it is a value of `partition`, its keys are
    checked as a built-in's are, runs draw it, and reports name it."""
    from fedray.config.keys import ConfigError
    from fedray.data import build_federated_data, partition_label, register_partition
    from fedray.experiment.checks import from_dict
    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import execute
    from tests.conftest import small_config

    def check(cfg, info):
        if cfg.partition_k > cfg.num_clients:
            raise ConfigError(f"config key 'partition_k': halves: at most num_clients={cfg.num_clients}")

    @register_partition("halves", keys=("partition_k",), label="halves(k={partition_k})", check=check)
    def halves(labels, p, rng):
        """Clients hold the low or the high half of the labels, alternately (k: labels each)."""
        low = np.flatnonzero(labels < p["partition_k"])
        high = np.flatnonzero(labels >= p["partition_k"])
        return Partition(
            [
                *np.array_split(low, p.num_clients // 2),
                *np.array_split(high, p.num_clients - p.num_clients // 2),
            ]
        )

    try:
        with pytest.raises(ValueError, match="registered already"):
            register_partition("halves")(halves)
        with pytest.raises(ValueError, match="not a partition_\\* config key"):
            register_partition("bad", keys=("partition_alpha",))(halves)
        with pytest.raises(ValueError, match="not a partition_\\* config key"):
            register_partition("bad", keys=("seed",))(halves)  # every partition reads it
        cfg = small_config(tmp_path, partition="halves", partition_k=5)
        data = build_federated_data(cfg)
        assert len(data.clients) == 6 and np.all(data.dataset.train.y[data.clients[0].train] < 5)
        assert partition_label(cfg.to_dict()) == "halves(k=5)"
        with pytest.raises(ConfigError, match="halves: at most num_clients=6"):
            small_config(tmp_path, partition="halves", partition_k=7)
        with pytest.raises(
            ConfigError,
            match=r"'partition_k' is not read by partition 'dirichlet' \(it is read by: labels, halves\)",
        ):
            from_dict({"partition_k": 3})
        list(execute(dataclasses.replace(cfg, rounds=1), make_local_federation))
    finally:
        PARTITIONS.pop("halves", None)
    # a report in a process that has not loaded the plug-in names its partition as the run did
    from analysis import pivot, run_values

    assert pivot(run_values(cfg.output))["partition"].tolist() == ["halves(k=5)"]


def test_a_plugged_in_draw_that_gives_no_partition_of_the_training_set_is_refused_naming_the_client(tmp_path):
    # Lists of floats (or indices past the training set) once passed, the data was loaded, and the
    # run failed in its first training step inside fedray/engine/client.py ("only integer scalar arrays").
    from fedray.data import PartitionError, check_partition, register_partition
    from tests.conftest import small_config

    gives, seen = {}, {}

    @register_partition("given")
    def given(labels, p, rng):
        seen["n"], k = len(labels), p.num_clients
        return gives["what"](
            [list(range(c * (seen["n"] // k), (c + 1) * (seen["n"] // k))) for c in range(k)]
        )

    try:
        cfg = small_config(tmp_path, partition="given")
        last = cfg.num_clients - 1
        gives["what"] = Partition  # lists of ints: taken as int64 arrays
        sizes = check_partition(cfg)
        assert len(sizes) == cfg.num_clients and all(v > 0 for v in sizes.values())
        for what, says in (
            (
                lambda cs: Partition([np.asarray(c, float) for c in cs]),
                "gave client 0 1-d indices of dtype float64",
            ),
            (
                lambda cs: Partition([*cs[:-1], [0, seen["n"]]]),
                f"gave client {last} index {{n}}, outside the",
            ),
            (lambda cs: Partition(cs[:-1]), f"gave {last} clients, and num_clients is {cfg.num_clients}"),
            (lambda cs: cs, "returned a list, not a fedray.Partition"),
        ):
            gives["what"] = what
            with pytest.raises(PartitionError, match="config key 'partition': partition 'given'") as e:
                check_partition(cfg)
            assert says.format(n=seen["n"]) in str(e.value), str(e.value)
    finally:
        PARTITIONS.pop("given", None)
