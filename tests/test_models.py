"""Models: the paper's parameter counts and the encoder/head contract."""

from __future__ import annotations

import pytest
import torch

from fedray.models import MODELS, build_model


@pytest.mark.parametrize("shape,params", [((1, 28, 28), 44_426), ((3, 32, 32), 62_006)])
def test_simple_cnn_matches_niid_bench_parameter_counts(shape, params):
    m = build_model("simple_cnn", shape, 10)
    assert sum(p.numel() for p in m.parameters()) == params
    x = torch.zeros(2, *shape)
    feats = m.encoder(x)
    assert feats.shape == (2, 84) and m.feature_dim == 84
    assert torch.equal(m(x), m.head(feats))
    assert {
        "encoder.conv1.weight",
        "encoder.conv2.weight",
        "encoder.fc1.weight",
        "encoder.fc2.weight",
        "head.weight",
    } <= set(m.state_dict())


def test_mlp_takes_any_shape():
    m = build_model("mlp", (1, 8, 8), 10)
    assert m(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    assert m.encoder(torch.zeros(3, 1, 8, 8)).shape == (3, m.feature_dim)


def test_incompatible_shapes_are_explained():
    assert "16x16" in MODELS["simple_cnn"].incompatibility((1, 8, 8))
    assert "C x H x W" in MODELS["simple_cnn"].incompatibility((64,))
    assert MODELS["simple_cnn"].incompatibility((3, 32, 32)) is None
