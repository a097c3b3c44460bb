"""CFL and LayerCFL: the bipartition, the gap and purity on hand-made matrices, the layer selection,
the rotation clusters, and the reductions (CFL that never splits is FedAvg; LayerCFL on all layers
without its check is CFL)."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import layer_gaps, load_assignments
from fedray.algorithms import clustering
from fedray.algorithms.splitting import cfl, geometry, layers
from fedray.config.keys import ConfigError
from fedray.data import build_federated_data
from fedray.data.rotation import rotate
from fedray.models import MODELS
from tests.conftest import small_config
from tests.helpers import run_metrics

# Two clear groups {0, 1, 2} and {3, 4}: similar inside (0.8-0.9), dissimilar across (at most 0.1).
S = np.array(
    [
        [1.0, 0.9, 0.8, 0.1, 0.0],
        [0.9, 1.0, 0.85, 0.0, -0.1],
        [0.8, 0.85, 1.0, 0.05, 0.1],
        [0.1, 0.0, 0.05, 1.0, 0.7],
        [0.0, -0.1, 0.1, 0.7, 1.0],
    ]
)


def test_bipartition_of_a_hand_made_similarity_matrix():
    assert geometry.bipartition(1.0 - S).tolist() == [0, 0, 0, 1, 1]
    # the same groups, rows shuffled: the half holding the first row is 0
    order = [3, 0, 4, 1, 2]
    assert geometry.bipartition(1.0 - S[np.ix_(order, order)]).tolist() == [0, 1, 0, 1, 1]


def test_gap_by_hand():
    truth = [0, 0, 0, 1, 1]
    # intra min = 0.7 (clients 3, 4), cross max = 0.1: gap 0.6
    assert geometry.gap_cos(S, truth) == pytest.approx(0.6)
    # a wrong grouping {0, 2, 4}, {1, 3}: intra min 0.0 (clients 0 and 4), cross max 0.9 (clients 0 and 1)
    assert geometry.gap_cos(S, [0, 1, 0, 1, 0]) == pytest.approx(0.0 - 0.9)
    # L2: points 0, 1 on a line and 10, 12: d_cross_min = 9, d_intra_max = 2
    x = np.array([[0.0], [1.0], [10.0], [12.0]])
    assert geometry.gap_l2(geometry.euclidean_distances(x), [0, 0, 1, 1]) == pytest.approx(7.0)
    np.testing.assert_allclose(geometry.euclidean_distances(x)[2], [10, 9, 0, 2])
    # cosine with the zero-update guard: a zero row is at similarity 0 from everyone, and finite
    c = geometry.cosine_similarity(np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 0.0]]))
    assert c[0, 1] == pytest.approx(1.0) and c[0, 2] == 0.0 and np.isfinite(c).all()


def test_purity_by_hand():
    truth = {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1}
    assert clustering.purity({0: 5, 1: 5, 2: 5, 3: 7, 4: 7, 5: 7}, truth) == 1.0
    # group 0's majority cluster holds 2 of 3, group 1's 3 of 3: 5/6
    assert clustering.purity({0: 5, 1: 5, 2: 7, 3: 7, 4: 7, 5: 7}, truth) == pytest.approx(5 / 6)
    # over-split: group 1 spread over three clusters keeps 1 of 3
    assert clustering.purity({0: 0, 1: 0, 2: 0, 3: 1, 4: 2, 5: 3}, truth) == pytest.approx(4 / 6)


def test_split_norms_by_hand():
    u = np.array([[3.0, 4.0], [-3.0, -4.0], [0.0, 0.5]])
    mean_norm, max_norm = geometry.split_norms(u, "norm")
    # ||(0, 0.5/3)||, ||(3, 4)||
    assert mean_norm == pytest.approx(0.5 / 3) and max_norm == pytest.approx(5.0)
    assert geometry.split_norms(u, "coordinate")[1] == 4.0  # the FedRC code's largest |coordinate|


def test_layer_selection_of_the_simple_cnn_and_vgg16():
    cnn = MODELS["simple_cnn"].build((1, 28, 28), 10)
    conv = ["encoder.conv1.weight", "encoder.conv1.bias", "encoder.conv2.weight", "encoder.conv2.bias"]
    assert layers.select(cnn, "conv") == conv
    assert layers.select(cnn, "fc") == ["encoder.fc1.weight", "encoder.fc1.bias"]
    assert layers.select(cnn, "all") == [n for n, _ in cnn.named_parameters()]
    assert layers.select(cnn, [r"fc2\."]) == ["encoder.fc2.weight", "encoder.fc2.bias"]
    assert list(layers.layer_params(cnn)) == [
        "encoder.conv1",
        "encoder.conv2",
        "encoder.fc1",
        "encoder.fc2",
        "head",
    ]
    with pytest.raises(ValueError, match=r"'hp.layers'.*'conv9'.*matches no parameter"):
        layers.select(cnn, ["conv9"])
    mlp = MODELS["mlp"].build((64,), 10)
    with pytest.raises(ValueError, match=r"'hp.layers'.*'conv'.*no such layer") as e:
        layers.select(mlp, "conv")
    assert "0 convolution(s) and 3 fully connected layer(s)" in str(
        e.value
    ) and "set hp.layers to fc, fc:1 .. fc:3" in str(e.value)
    # One layer by its place, and auto: the convolutions where there are any, else the first FC layer.
    assert layers.select(cnn, "conv:2") == conv[2:] and layers.select(cnn, "fc:2") == [
        "encoder.fc2.weight",
        "encoder.fc2.bias",
    ]
    assert layers.select(cnn, "auto") == conv and layers.select(mlp, "auto") == layers.select(mlp, "fc")
    with pytest.raises(ValueError, match=r"'conv:3' finds no such layer.*2 convolution"):
        layers.select(cnn, "conv:3")
    for channels in (1, 3):
        vgg = MODELS["vgg16"].build((channels, 32, 32), 10)
        convs = layers.select(vgg, "conv")
        assert len(convs) == 26 and convs[:2] == ["encoder.features.0.weight", "encoder.features.0.bias"]
        assert vgg.state_dict()["encoder.features.0.weight"].shape[1] == channels
        # the paper's 4th layer (the 4th convolution: features.7) and the first FC layer
        assert (
            layers.select(vgg, [r"features\.7\."])
            == [
                "encoder.features.7.weight",
                "encoder.features.7.bias",
            ]
            == layers.select(vgg, "conv:4")
        )
        assert layers.select(vgg, "fc") == ["encoder.classifier.0.weight", "encoder.classifier.0.bias"]
        assert vgg(np_batch(channels)).shape == (2, 10)


def np_batch(channels: int):
    import torch

    return torch.zeros(2, channels, 32, 32)


def test_rotation_clusters_rotate_each_groups_images(tmp_path):
    cfg = small_config(
        tmp_path,
        dataset="digits",
        partition="rotation",
        partition_clusters=4,
        num_clients=8,
        participation=1.0,
    )
    data = build_federated_data(cfg)
    assert data.groups.tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    x = np.arange(16).reshape(1, 1, 4, 4)
    assert rotate(x, 90).tolist() == np.rot90(x, 1, axes=(2, 3)).tolist()
    assert rotate(x, 360).tolist() == x.tolist()
    odd = rotate(x.astype(np.float32), 45)
    assert odd.shape == x.shape and odd.dtype == np.float32
    plain = build_federated_data(small_config(tmp_path, dataset="digits", partition="iid", num_clients=8))
    # the same IID split (same stream): client 1's images are client 1's original images turned 90 degrees
    c = data.clients[1]
    orig = plain.dataset.train.x[np.sort(np.concatenate([plain.clients[1].train, plain.clients[1].test]))]
    got = data.dataset.train.x[np.sort(np.concatenate([c.train, c.test]))]
    assert got.shape == orig.shape
    assert np.array_equal(
        np.sort(got.reshape(len(got), -1), axis=0), np.sort(rotate(orig, 90).reshape(len(got), -1), axis=0)
    )
    with pytest.raises(ConfigError, match="'partition_clusters'"):
        small_config(tmp_path, partition="rotation", partition_clusters=9, num_clients=8)


OVER = dict(rounds=3, participation=1.0, client_test_fraction=0.2, seed=4)


def test_cfl_that_never_splits_is_fedavg(tmp_path):
    ref = run_metrics(small_config(tmp_path / "fedavg", **OVER))
    got = run_metrics(
        small_config(
            tmp_path / "cfl", algorithm="cfl", hp={"eps1": 0.0, "persistent_optimizer": False}, **OVER
        )
    )
    for name, scope in [
        ("accuracy", "cluster"),
        ("loss", "cluster"),
        ("local_accuracy", "global"),
        ("train_loss", "global"),
        ("train_accuracy", "global"),
        ("sgd_loss", "global"),
        ("sgd_accuracy", "global"),
    ]:
        a = ref[(ref["metric"] == name) & (ref["scope"] == "global")]["value"].tolist()
        b = got[(got["metric"] == name) & (got["scope"] == scope)]["value"].tolist()
        assert len(a) == 3 and a == b, name
    assert set(got[got["metric"] == "num_clusters"]["value"]) == {1.0}


def test_layercfl_on_all_layers_without_its_check_is_cfl(tmp_path):
    over = dict(OVER, partition="dominant", partition_clusters=2, num_clients=8, lr=0.1)
    hp = {"eps1": 10.0, "eps2": 0.0}  # split whenever there are more than two members
    ref = run_metrics(small_config(tmp_path / "cfl", algorithm="cfl", hp=hp, **over))
    got = run_metrics(
        small_config(
            tmp_path / "layercfl",
            algorithm="layercfl",
            hp={**hp, "layers": "all", "check_split": False},
            **over,
        )
    )
    assert got.equals(ref), got.compare(ref)
    assert ref[ref["metric"] == "num_clusters"]["value"].max() > 1


def test_splits_assignments_gap_and_purity_on_dominant_clusters(tmp_path):
    cfg = small_config(
        tmp_path,
        algorithm="layercfl",
        hp={"eps1": 10.0, "eps2": 0.0, "layers": "fc", "max_clusters": 2},
        partition="dominant",
        partition_clusters=2,
        num_clients=8,
        lr=0.1,
        **{**OVER, "rounds": 2},
    )
    m = run_metrics(cfg)
    g = m[m["scope"] == "global"].set_index(["round", "metric"])["value"]
    assert g[(1, "num_clusters")] == 2 and g[(2, "num_clusters")] == 2  # capped at max_clusters
    assert g[(1, "similarity_dims")] == 64 * 200 + 200  # the MLP's first FC layer (8x8 inputs, 200 units)
    a = load_assignments(cfg.output)
    assert sorted(a[a["round"] == 2]["client"]) == list(range(8))
    gaps = layer_gaps(cfg.output)
    assert set(gaps["layer"]) == {"encoder.fc1", "encoder.fc2", "head"} and set(gaps["distance"]) == {
        "cos",
        "l2",
    }
    assert len(gaps) == 2 * 3 * 2  # rounds x layers x distances
    assert 0 <= g[(2, "purity")] <= 1


def test_cfl_needs_every_client_every_round(tmp_path):
    with pytest.raises(ConfigError, match=r"'participation'.*cfl.*1\.0"):
        small_config(tmp_path, algorithm="cfl", participation=0.5)
    # at config time, before Ray
    with pytest.raises(ConfigError, match=r"'hp.layers'.*'conv'.*no such layer"):
        # the MLP has none
        small_config(tmp_path, algorithm="layercfl", participation=1.0, hp={"layers": "conv"})
    with pytest.raises(ConfigError, match=r"'hp.distance'"):
        small_config(tmp_path, algorithm="layercfl", participation=1.0, hp={"distance": "cosine"})


def test_theorem_1_check_by_hand():
    halves = np.array([0, 0, 0, 1, 1])
    # alpha_cross_max of S's true split is 0.1: sqrt((1 - 0.1) / 2) = 0.671
    assert geometry.split_is_safe(S, halves, 0.5) == (True, pytest.approx(0.1))
    assert geometry.split_is_safe(S, halves, 0.7)[0] is False
    # a wrong split {0, 2, 4} | {1, 3} has clients 0 and 1 across at 0.9: sqrt(0.05) = 0.224 < 0.5
    assert geometry.split_is_safe(S, np.array([0, 1, 0, 1, 0]), 0.5) == (False, pytest.approx(0.9))


def test_relative_thresholds_by_hand(tmp_path):
    relative = cfl.Hparams(eps1=0.1, eps2=0.3, eps_rule="relative")
    assert geometry.split_thresholds(relative.eps1, relative.eps2, relative.eps_rule, 2.0) == (
        pytest.approx(0.2),
        pytest.approx(0.6),
    )
    assert geometry.split_thresholds(0.4, 1.6, "absolute", 2.0) == (0.4, 1.6)  # absolute: the norms
    with pytest.raises(ConfigError, match=r"'hp.eps_rule'.*absolute, relative.*'tenth'"):
        small_config(tmp_path, algorithm="cfl", participation=1.0, hp={"eps_rule": "tenth"})


def test_relative_rule_splits_when_the_mean_update_falls_below_its_fraction_of_the_peak(tmp_path):
    """eps1 is 0.99 x the largest mean update norm so far (all clusters, all rounds), eps2 0: each
    round's eps1 row, and where the splits fall, follow from the norm rows by that rule (here the
    mean norm rises for 5 rounds and falls in the 6th: the first split)."""
    over = dict(OVER, partition="dominant", partition_clusters=2, num_clients=8, lr=0.1, rounds=6)
    cfg = small_config(
        tmp_path,
        algorithm="layercfl",
        hp={"eps1": 0.99, "eps2": 0.0, "eps_rule": "relative", "layers": "fc", "check_split": False},
        **over,
    )
    m = run_metrics(cfg)
    a = load_assignments(cfg.output)
    peak, expected = 0.0, []
    for r in range(1, 7):
        norms = m[(m["round"] == r) & (m["metric"] == "mean_update_norm")].set_index("entity")["value"]
        peak = max(peak, norms.max())
        eps1 = m[(m["round"] == r) & (m["metric"] == "eps1")]["value"].item()
        assert eps1 == pytest.approx(0.99 * peak)
        assert m[(m["round"] == r) & (m["metric"] == "eps2")]["value"].item() == 0.0
        # the clusters this round trained: the previous round's assignment (round 1: one of all 8)
        sizes = a[a["round"] == r - 1].groupby("cluster").size().to_dict() if r > 1 else {0: 8}
        want = [int(k) for k, v in norms.items() if v < eps1 and sizes[int(k)] > 2]
        got = m[(m["round"] == r) & (m["metric"] == "split")]["entity"].astype(int).tolist()
        assert got == want, r
        expected += want
    assert expected, "the rule never let a cluster split: the test shows nothing"


@pytest.mark.parametrize("algorithm", ["cfl", "layercfl"])
def test_a_federation_too_big_for_the_similarities_is_refused_before_anything_starts(
    tmp_path, monkeypatch, algorithm
):
    from fedray.algorithms import scale
    from fedray.config.coercion import ConfigError
    from tests.conftest import small_config

    monkeypatch.setattr(scale, "machine_memory", lambda: 1 << 20)  # a 1 MiB machine
    over = {"algorithm": algorithm, "participation": 1.0, "num_clients": 6}
    if algorithm == "layercfl":
        over["hp"] = {"layers": "fc"}
    with pytest.raises(
        ConfigError,
        match=r"config key 'num_clients': .* holds every client's update each round "
        r"\(6 clients x [\d,]+ values\).*cross-silo method.*fits at most about \d+ clients",
    ):
        small_config(tmp_path, **over)
    monkeypatch.setattr(scale, "machine_memory", lambda: 1 << 34)
    assert small_config(tmp_path, **over).num_clients == 6
