"""Models: the paper's parameter counts and the encoder/head contract."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedray.experiment.local import task_for
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
    from fedray.experiment.checks import validate
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


# ------------------------------------------------------------------------------------------------
# weight_init: LEAF's models start from LEAF's TensorFlow 1 initial weights
# ------------------------------------------------------------------------------------------------


def _leaf_task(model, shape, classes, seed=3, weight_init="model"):
    from fedray.data import DataSpec
    from fedray.engine.client import Task

    return Task(
        seed=seed,
        model=model,
        spec=DataSpec(shape, classes, 1.0),
        local_epochs=1,
        batch_size=8,
        lr=0.1,
        momentum=0.0,
        weight_decay=0.0,
        participation=1.0,
        eval_batch_size=8,
        weight_init=weight_init,
    )


LEAF_MODELS = [("leaf_cnn", (1, 28, 28), 62), ("leaf_lstm", (80,), 80)]


def test_leaf_models_have_leafs_parameter_counts():
    cnn = build_model("leaf_cnn", (1, 28, 28), 62)
    assert sum(p.numel() for p in cnn.parameters()) == 6_603_710
    # LEAF's Shakespeare model by hand: embedding 80 x 8, two LSTM layers of 256 (torch: weight_ih
    # [4h, in], weight_hh [4h, h], two biases of 4h), dense 256 -> 80
    h, embed, vocab = 256, 8, 80
    lstm_layer = lambda inputs: 4 * h * inputs + 4 * h * h + 2 * 4 * h  # noqa: E731
    by_hand = vocab * embed + lstm_layer(embed) + lstm_layer(h) + (h * vocab + vocab)
    assert by_hand == 819_920
    lstm = build_model("leaf_lstm", (80,), 80)
    assert sum(p.numel() for p in lstm.parameters()) == by_hand
    # TF's BasicLSTMCell has one bias per layer: LEAF's own count is 2 x 4h fewer
    assert by_hand - 2 * 4 * h == 817_872


def _glorot_bound(name: str, p: torch.Tensor, model: torch.nn.Module) -> float:
    """The bound LEAF's TF draws ``p`` from: sqrt(6 / (fan_in + fan_out)) of TF's variable."""
    if ".lstm.weight_" in name:
        lstm = model.encoder.lstm
        fan_in, fan_out = (
            getattr(lstm, f"weight_ih_l{name[-1]}").shape[1] + lstm.hidden_size,
            4 * lstm.hidden_size,
        )
    else:
        fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(p)
    return (6.0 / (fan_in + fan_out)) ** 0.5


@pytest.mark.parametrize("name,shape,classes", LEAF_MODELS)
def test_leaf_models_start_from_leafs_tf_initialisation(name, shape, classes):
    assert MODELS[name].init is not None
    torch.manual_seed(0)
    m = build_model(name, shape, classes)  # weight_init: model, the default
    params = dict(m.named_parameters())
    assert len(params) == (11 if name == "leaf_lstm" else 8)  # every parameter checked below
    for key, p in params.items():
        p = p.detach().double()
        if "bias" in key:
            if key.startswith("encoder.lstm.bias_ih"):
                h = m.encoder.lstm.hidden_size
                assert torch.equal(p[h : 2 * h], torch.ones(h, dtype=p.dtype)), key  # TF's forget_bias
                assert not p[:h].any() and not p[2 * h :].any(), key
            else:
                assert not p.any(), key  # TF's zeros_initializer (bias_hh too: TF has one bias)
            continue
        bound = _glorot_bound(key, p, m)
        assert p.abs().max() <= bound, key
        assert p.abs().max() > 0.9 * bound, key  # the whole range is used
        variance = p.var().item()
        assert abs(variance / (bound**2 / 3) - 1) < 0.2, (key, variance, bound**2 / 3)
        assert abs(p.mean().item()) < 0.1 * bound, key
    x = torch.zeros(2, *shape, dtype=torch.long if name == "leaf_lstm" else torch.float)
    assert m(x).shape == (2, classes)


def test_the_lstm_kernel_bound_is_tfs_joint_kernels():
    torch.manual_seed(1)
    lstm = build_model("leaf_lstm", (80,), 80).encoder.lstm
    # layer 0: TF's kernel [8 + 256, 1024]; weight_hh alone ([1024, 256]) would give sqrt(6 / 1280)
    bound0 = (6.0 / (8 + 256 + 1024)) ** 0.5
    for w in (lstm.weight_ih_l0, lstm.weight_hh_l0):
        assert w.abs().max() <= bound0 and w.abs().max() > 0.99 * bound0
    bound1 = (6.0 / (256 + 256 + 1024)) ** 0.5
    for w in (lstm.weight_ih_l1, lstm.weight_hh_l1):
        assert w.abs().max() <= bound1 and w.abs().max() > 0.99 * bound1


@pytest.mark.parametrize("name,shape,classes", LEAF_MODELS)
def test_weight_init_torch_gives_pytorchs_default(name, shape, classes):
    torch.manual_seed(0)
    m = build_model(name, shape, classes, weight_init="torch")
    torch.manual_seed(0)
    leaf = build_model(name, shape, classes, weight_init="model")
    a, b = m.state_dict(), leaf.state_dict()
    assert not any(torch.equal(a[k], b[k]) for k in a)  # every tensor differs
    assert m.head.bias.any()  # PyTorch draws biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert m.head.bias.abs().max() <= 1 / m.head.in_features**0.5
    if name == "leaf_cnn":
        assert m.encoder.conv1.bias.any() and m.encoder.conv2.bias.any() and m.encoder.fc1.bias.any()
        fc1 = m.encoder.fc1.weight
        assert fc1.abs().max() <= 1 / fc1.shape[1] ** 0.5  # kaiming_uniform(a=sqrt(5)): 1/sqrt(fan_in)
    else:
        lstm = m.encoder.lstm
        h = lstm.hidden_size
        assert lstm.bias_ih_l0.abs().max() <= 1 / h**0.5  # U(-1/sqrt(h), 1/sqrt(h)): no 1.0 anywhere
        assert not torch.equal(lstm.bias_ih_l0[h : 2 * h], torch.ones(h)) and lstm.bias_hh_l0.any()
        assert m.encoder.embed.weight.std() > 0.5  # N(0, 1), not Glorot's sqrt(6 / 88) / sqrt(3)


@pytest.mark.parametrize(
    "name,shape",
    [("mlp", (1, 8, 8)), ("simple_cnn", (1, 28, 28)), ("fedrc_cnn", (1, 28, 28)), ("logreg", (1, 8, 8))],
)
def test_weight_init_model_leaves_models_without_their_own_init_as_before(name, shape):
    from fedray.params import get_params

    assert MODELS[name].init is None
    torch.manual_seed(5)
    before = build_model(name, shape, 10, weight_init="torch")  # the build alone, as before the key
    torch.manual_seed(5)
    now = build_model(name, shape, 10)
    assert all(torch.equal(v, now.state_dict()[k]) for k, v in before.state_dict().items())
    a = get_params(_leaf_task(name, shape, 10).build_model())
    b = get_params(_leaf_task(name, shape, 10, weight_init="torch").build_model())
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


# sha256 (first 16 hex digits) of the initial models of seed 0, drawn by the code before weight_init
MLP_DIGEST, SIMPLE_CNN_DIGEST = "fb166ce53384eaaf", "030be599ef1cb4ce"


def test_mlp_and_simple_cnn_initial_weights_are_pinned():
    # the initial weights of models without an init of their own, as drawn before weight_init existed
    import hashlib

    from fedray.params import get_params

    def digest(name, shape):
        p = get_params(_leaf_task(name, shape, 10, seed=0).build_model())
        return hashlib.sha256(b"".join(np.ascontiguousarray(p[k]).tobytes() for k in sorted(p))).hexdigest()[
            :16
        ]

    assert digest("mlp", (1, 8, 8)) == MLP_DIGEST
    assert digest("simple_cnn", (1, 28, 28)) == SIMPLE_CNN_DIGEST


@pytest.mark.parametrize("name,shape,classes", LEAF_MODELS)
def test_the_same_seed_gives_the_same_leaf_weights(name, shape, classes):
    from fedray.config import seeding
    from fedray.models import leaf_init
    from fedray.params import get_params

    def same(a, b):
        return set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)

    task = _leaf_task(name, shape, classes, seed=3)
    first, again = task.init_models(2), _leaf_task(name, shape, classes, seed=3).init_models(2)
    assert same(first[0], again[0]) and same(first[1], again[1])  # bit for bit
    assert not same(first[0], first[1])  # model k from its own stream
    assert not same(first[0], get_params(_leaf_task(name, shape, classes, seed=4).build_model()))
    # the draw is the derived stream's: the build's draws, then LEAF's, from one generator
    torch.manual_seed(seeding.torch_seed(3, "init"))
    m = MODELS[name].build(shape, classes)
    leaf_init(m)
    assert same(first[0], get_params(m))
    torch_task = _leaf_task(name, shape, classes, seed=3, weight_init="torch")
    torch.manual_seed(seeding.torch_seed(3, "init"))
    assert same(get_params(torch_task.build_model()), get_params(MODELS[name].build(shape, classes)))


def test_weight_init_is_a_checked_config_key_threaded_into_the_task(tmp_path):
    from fedray.config.keys import ConfigError
    from fedray.data import DataSpec
    from fedray.experiment.checks import validate
    from tests.conftest import small_config

    cfg = small_config(tmp_path)
    assert cfg.weight_init == "model"
    assert small_config(tmp_path, weight_init="model").run_id() == cfg.run_id()  # earlier runs keep their ids
    assert small_config(tmp_path, weight_init="torch").run_id() != cfg.run_id()
    with pytest.raises(ConfigError, match="'weight_init': unknown value 'tf'"):
        validate(small_config(tmp_path, weight_init="tf"))
    spec = DataSpec((1, 8, 8), 10, 1.0)
    assert task_for(small_config(tmp_path, weight_init="torch"), spec).weight_init == "torch"
    assert task_for(cfg, spec).weight_init == "model"
    with pytest.raises(ValueError, match="weight_init 'tf'"):
        build_model("mlp", (1, 8, 8), 10, weight_init="tf")
