"""Models: the paper's parameter counts and the encoder/head contract."""

from __future__ import annotations

import numpy as np
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


@pytest.mark.parametrize(
    "shape,params,flat", [((1, 28, 28), 1_663_370, 3136), ((3, 32, 32), 2_156_490, 4096)]
)
def test_mcmahan_cnn_matches_the_papers_parameter_count(shape, params, flat):
    m = build_model("mcmahan_cnn", shape, 10)
    assert sum(p.numel() for p in m.parameters()) == params
    assert m.encoder.fc1.in_features == flat
    feats = m.encoder(torch.zeros(2, *shape))
    assert feats.shape == (2, 512) and m.feature_dim == 512
    assert m.head.out_features == 10
    assert "C x H x W" in MODELS["mcmahan_cnn"].incompatibility((64,))


def test_fedrc_cnn_has_the_papers_size_and_normalises_its_own_inputs():
    m = build_model("fedrc_cnn", (1, 28, 28), 10)
    assert sum(p.numel() for p in m.parameters()) == 2_171_786
    assert m.encoder.fc1.in_features == 1024 and m.feature_dim == 2048
    assert not any("normalize" in k for k in m.state_dict())  # the constants never travel
    x = torch.full((1, 1, 28, 28), 0.1307)  # the mean: zero after normalisation
    assert torch.allclose(m.encoder.normalize(x), torch.zeros_like(x))


@pytest.mark.parametrize("name,dim", [("resnet18", 512), ("mobilenet_v2", 1280)])
@pytest.mark.parametrize("shape", [(3, 32, 32), (1, 32, 32)])
def test_torchvision_models_take_32x32_inputs_with_an_encoder_head_split(name, dim, shape):
    m = build_model(name, shape, 10).eval()
    x = torch.zeros(2, *shape)
    feats = m.encoder(x)
    assert feats.shape == (2, dim) and m.feature_dim == dim
    assert torch.equal(m(x), m.head(feats)) and m(x).shape == (2, 10)
    assert set(n for n, _ in m.head.named_parameters()) == {"weight", "bias"}


def test_mlp_takes_any_shape():
    m = build_model("mlp", (1, 8, 8), 10)
    assert m(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    assert m.encoder(torch.zeros(3, 1, 8, 8)).shape == (3, m.feature_dim)


def test_incompatible_shapes_are_explained():
    assert "16x16" in MODELS["simple_cnn"].incompatibility((1, 8, 8))
    assert "C x H x W" in MODELS["simple_cnn"].incompatibility((64,))
    assert MODELS["simple_cnn"].incompatibility((3, 32, 32)) is None


def test_concatenated_model_from_cluster_models_and_the_f5_head_init():
    from fedray.models import Arch, concat_params, concatenated, head_from_clusters
    from fedray.params import get_params, set_params
    from tests.helpers import encoder_params

    torch.manual_seed(0)
    clusters = [build_model("simple_cnn", (1, 28, 28), 10) for _ in range(3)]
    params = [get_params(m) for m in clusters]
    big = concatenated(lambda: build_model("simple_cnn", (1, 28, 28), 10), 3, 10)
    assert big.feature_dim == 3 * 84 and big.head.weight.shape == (10, 252)
    set_params(big, concat_params([encoder_params(p) for p in params], head_from_clusters(params)))
    x = torch.rand(5, 1, 28, 28)
    with torch.no_grad():
        # the features are the K encoders' outputs side by side, in cluster order
        assert torch.equal(big.encoder(x), torch.cat([m.encoder(x) for m in clusters], dim=1))
        # F5: concatenated weights and summed biases make the logits the sum of the cluster models' logits
        assert torch.allclose(big(x), sum(m(x) for m in clusters), atol=1e-5)
    head = head_from_clusters(params)
    assert head["weight"].shape == (10, 252) and head["bias"].dtype == params[0]["head.bias"].dtype
    assert Arch(concat=3, head_only=True) != Arch(concat=3) and Arch() == Arch(concat=0)


def test_task_builds_each_arch_with_seeded_init():
    from fedray.data import DataSpec
    from fedray.engine.client import Task
    from fedray.models import Arch

    spec = DataSpec((1, 28, 28), 10, 1 / 255)
    task = Task(
        seed=3,
        model="simple_cnn",
        spec=spec,
        local_epochs=1,
        batch_size=8,
        lr=0.1,
        momentum=0.0,
        weight_decay=0.0,
        participation=1.0,
        eval_batch_size=8,
    )
    head = task.build_model("classifier_init", Arch(concat=5, head_only=True))
    assert isinstance(head, torch.nn.Linear) and head.weight.shape == (10, 420)
    again = task.build_model("classifier_init", Arch(concat=5, head_only=True))
    assert torch.equal(head.weight, again.weight)  # the same derived stream
    assert (
        sum(p.numel() for p in task.build_model(arch=Arch(concat=2)).parameters())
        == 2 * (44_426 - 850) + 1_690
    )


@pytest.mark.parametrize("name,shape", [("simple_cnn", (1, 28, 28)), ("mlp", (1, 8, 8))])
def test_moon_projection_head_wraps_any_model(name, shape):
    from fedray.models import projected

    base = build_model(name, shape, 10)
    m = projected(base, 256, 10)
    d = base.feature_dim
    x = torch.rand(4, *shape)
    z = m.encoder(x)
    assert z.shape == (4, 256) and m.feature_dim == 256 and m(x).shape == (4, 10)
    assert torch.equal(m.encoder.base(x), base.encoder(x))  # h: the base encoder, unchanged
    extra = sum(p.numel() for p in m.parameters()) - sum(p.numel() for p in base.encoder.parameters())
    assert extra == (d * d + d) + (d * 256 + 256) + (256 * 10 + 10)  # L1, L2, classifier on z
    assert {"encoder.projection.l1.weight", "encoder.projection.l2.weight", "head.weight"} <= set(
        m.state_dict()
    )


def test_head_bias_false_drops_only_the_last_layers_bias():
    torch.manual_seed(3)
    with_bias = build_model("simple_cnn", (1, 28, 28), 10)
    torch.manual_seed(3)
    bare = build_model("simple_cnn", (1, 28, 28), 10, head_bias=False)
    a, b = with_bias.state_dict(), bare.state_dict()
    assert set(a) - set(b) == {"head.bias"} and set(b) <= set(a)
    assert all(torch.equal(a[k], v) for k, v in b.items())  # same draws: the bias is dropped, not redrawn
    x = torch.rand(2, 1, 28, 28)
    h = bare.encoder(x)
    assert torch.equal(bare(x), h @ bare.head.weight.T)  # logits are W h, nothing added
    from fedray.models import projected

    assert projected(bare, 16, 10).head.bias is None  # MOON's classifier follows the task model's


def test_head_bias_false_runs_saves_and_loads_back(tmp_path):
    from analysis import load_models
    from fedray.config.keys import ConfigError
    from fedray.experiment.validation import validate
    from tests.conftest import small_config
    from tests.helpers import run_metrics

    cfg = small_config(tmp_path, head_bias=False, rounds=2)
    run_metrics(cfg)
    (model,) = load_models(cfg.output, cfg.run_id()).values()
    assert "head.bias" not in model.state_dict() and model.head.bias is None
    assert small_config(tmp_path).run_id() != cfg.run_id()
    with pytest.raises(ConfigError, match="config key 'head_bias': fedconcat"):
        validate(small_config(tmp_path, algorithm="fedconcat", head_bias=False, rounds=40))


def test_model_init_seed_plus_k_draws_model_k_after_torch_seed_seed_plus_k():
    # The FedEM/FedRC code draws learner k right after torch.manual_seed(seed + k); checked here bit for
    # bit against its FemnistCNN (2,171,786 parameters), and by hand against the rule below.
    from fedray.data import DataSpec
    from fedray.engine.client import Task
    from fedray.params import get_params

    def task(seed, init):
        return Task(
            seed=seed,
            model="fedrc_cnn",
            spec=DataSpec((1, 28, 28), 10, 1 / 255),
            local_epochs=1,
            batch_size=8,
            lr=0.1,
            momentum=0.0,
            weight_decay=0.0,
            participation=1.0,
            eval_batch_size=8,
            model_init=init,
        )

    def same(a, b):
        return all(np.array_equal(a[k], b[k]) for k in a)

    for seed in (0, 5):
        models = task(seed, "seed_plus_k").init_models(3)
        for k in range(3):
            torch.manual_seed(seed + k)
            assert same(models[k], get_params(build_model("fedrc_cnn", (1, 28, 28), 10)))
    a, b = task(0, "seed_plus_k").init_models(3), task(1, "seed_plus_k").init_models(3)
    assert same(a[1], b[0]) and same(a[2], b[1])  # consecutive seeds share K - 1 models
    a, b = task(0, "derived").init_models(3), task(1, "derived").init_models(3)
    assert not any(same(a[i], b[j]) for i in range(3) for j in range(3))  # the default: none shared
    # FedAvg's single model is model 0: seed_plus_k draws it from the seed itself
    torch.manual_seed(7)
    assert same(
        get_params(task(7, "seed_plus_k").build_model()),
        get_params(build_model("fedrc_cnn", (1, 28, 28), 10)),
    )
