"""Model registry. Every model is an `EncoderHead`: ``forward(x) = head(encoder(x))``.

FedConcat concatenates encoders, MOON and FedRS work on the feature, LayerCFL picks layers by
name, so the encoder/head split and stable layer names are part of every model's contract.
New models (FedRC's CNN, VGG-9, torchvision ResNets, MobileNetV2) slot into `MODELS`.

May import: `fedray.config` and `fedray.params`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedray.params import Params


class EncoderHead(nn.Module):
    def __init__(self, encoder: nn.Module, head: nn.Module, feature_dim: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.feature_dim = feature_dim

    def forward(self, x):  # noqa: D401 - plain nn.Module forward
        return self.head(self.encoder(x))


def simple_cnn(input_shape: tuple[int, ...], num_classes: int) -> EncoderHead:
    """NIID-Bench / FedConcat "simple CNN" (docs/algorithms/common.md#simple-cnn); 44,426 params at 1x28x28, 62,006 at 3x32x32."""
    c, h, w = input_shape
    out_h, out_w = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2  # two (5x5 conv, 2x2 pool) stages
    flat = 16 * out_h * out_w
    encoder = nn.Sequential(
        OrderedDict(
            conv1=nn.Conv2d(c, 6, 5),
            relu1=nn.ReLU(),
            pool1=nn.MaxPool2d(2),
            conv2=nn.Conv2d(6, 16, 5),
            relu2=nn.ReLU(),
            pool2=nn.MaxPool2d(2),
            flatten=nn.Flatten(),
            fc1=nn.Linear(flat, 120),
            relu3=nn.ReLU(),
            fc2=nn.Linear(120, 84),
            relu4=nn.ReLU(),
        )
    )
    return EncoderHead(encoder, nn.Linear(84, num_classes), 84)


def mcmahan_cnn(input_shape: tuple[int, ...], num_classes: int) -> EncoderHead:
    """McMahan et al. 2017's CNN (docs/algorithms/common.md#simple-cnn, FedCat's model): two 5x5 "same" convolutions
    (32, 64 channels) each with ReLU and 2x2 max pooling, FC(512), ReLU, then the linear head.
    1,663,370 params at 1x28x28 (flatten 64*7*7 = 3136), 2,156,490 at 3x32x32 (64*8*8 = 4096)."""
    return two_conv_cnn(input_shape, num_classes, 512)


def two_conv_cnn(input_shape: tuple[int, ...], num_classes: int, hidden: int) -> EncoderHead:
    """Two 5x5 "same" convolutions (32, 64 channels), each with ReLU and 2x2 max pooling, FC(hidden),
    ReLU, then the linear head: McMahan et al.'s CNN (hidden 512) and LEAF's FEMNIST CNN (2048)."""
    c, h, w = input_shape
    encoder = nn.Sequential(
        OrderedDict(
            conv1=nn.Conv2d(c, 32, 5, padding=2),
            relu1=nn.ReLU(),
            pool1=nn.MaxPool2d(2),
            conv2=nn.Conv2d(32, 64, 5, padding=2),
            relu2=nn.ReLU(),
            pool2=nn.MaxPool2d(2),
            flatten=nn.Flatten(),
            fc1=nn.Linear(64 * (h // 4) * (w // 4), hidden),
            relu3=nn.ReLU(),
        )
    )
    return EncoderHead(encoder, nn.Linear(hidden, num_classes), hidden)


# Models that normalise their own inputs, (x - mean) / std, as their paper's code does: the data set
# must not normalise them too (config validation refuses it).
SELF_NORMALIZING = {"fedrc_cnn": (0.1307, 0.3081)}


class Normalize(nn.Module):
    """A fixed (x - mean) / std in front of a model (FedRC's FMNIST CNN normalises its own inputs).
    The constants are not parameters and not in the state dict: they never travel or average."""

    def __init__(self, mean: float, std: float) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean), persistent=False)
        self.register_buffer("std", torch.tensor(std), persistent=False)

    def forward(self, x):  # noqa: D401 - plain nn.Module forward
        return (x - self.mean) / self.std


def fedrc_cnn(input_shape: tuple[int, ...], num_classes: int) -> EncoderHead:
    """FedRC's FMNIST CNN (docs/algorithms/common.md#simple-cnn, RC:models.py FemnistCNN; the paper's "three-layer
    CNN" is two convolutions and two FC layers): inputs normalised with mean 0.1307, std 0.3081,
    Conv(32, 5x5), ReLU, MaxPool 2, Conv(64, 5x5), ReLU, MaxPool 2, FC(2048), ReLU, then the head.
    2,171,786 params at 1x28x28 (flatten 64*4*4 = 1024)."""
    c, h, w = input_shape
    flat = 64 * (((h - 4) // 2 - 4) // 2) * (((w - 4) // 2 - 4) // 2)
    encoder = nn.Sequential(
        OrderedDict(
            normalize=Normalize(*SELF_NORMALIZING["fedrc_cnn"]),
            conv1=nn.Conv2d(c, 32, 5),
            relu1=nn.ReLU(),
            pool1=nn.MaxPool2d(2),
            conv2=nn.Conv2d(32, 64, 5),
            relu2=nn.ReLU(),
            pool2=nn.MaxPool2d(2),
            flatten=nn.Flatten(),
            fc1=nn.Linear(flat, 2048),
            relu3=nn.ReLU(),
        )
    )
    return EncoderHead(encoder, nn.Linear(2048, num_classes), 2048)


def resnet18(input_shape: tuple[int, ...], num_classes: int) -> EncoderHead:
    """torchvision's ResNet-18 for 32x32 inputs (the usual CIFAR stem: a 3x3 stride-1 first
    convolution for the input's channels, no max pool); encoder = up to the pooled 512-d feature."""
    from torchvision.models import resnet18 as tv_resnet18

    net = tv_resnet18(num_classes=num_classes)
    net.conv1 = nn.Conv2d(input_shape[0], 64, kernel_size=3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    head = net.fc
    net.fc = nn.Identity()  # the network up to here is the encoder: pooled and flattened features
    return EncoderHead(net, head, 512)


def mobilenet_v2(input_shape: tuple[int, ...], num_classes: int) -> EncoderHead:
    """torchvision's MobileNetV2 for 32x32 inputs (first convolution stride 1 for the input's
    channels); encoder = features, pooling and dropout (1280-d), head = the last Linear."""
    from torchvision.models import mobilenet_v2 as tv_mobilenet_v2

    net = tv_mobilenet_v2(num_classes=num_classes)
    first = net.features[0][0]
    net.features[0][0] = nn.Conv2d(input_shape[0], first.out_channels, 3, stride=1, padding=1, bias=False)
    head = net.classifier[1]
    net.classifier[1] = nn.Identity()
    return EncoderHead(net, head, net.last_channel)


def vgg16(input_shape: tuple[int, ...], num_classes: int) -> EncoderHead:
    """torchvision's VGG-16 (no batch norm) for 32x32 inputs of any channel count (LayerCFL's model):
    the first convolution takes the input's channels, the five pools leave 512 x 1 x 1, so the
    average pool is global and the first FC layer takes 512 features; encoder = features, pool and
    the first two FC layers (``classifier.0``, ``classifier.3``), head = the last Linear."""
    from torchvision.models import vgg16 as tv_vgg16

    net = tv_vgg16(num_classes=num_classes)
    net.features[0] = nn.Conv2d(input_shape[0], 64, kernel_size=3, padding=1)
    net.avgpool = nn.AdaptiveAvgPool2d((1, 1))
    net.classifier[0] = nn.Linear(512, 4096)
    head = net.classifier[6]
    net.classifier[6] = nn.Identity()
    return EncoderHead(net, head, 4096)


def leaf_cnn(input_shape: tuple[int, ...], num_classes: int) -> EncoderHead:
    """LEAF's FEMNIST CNN (its models/femnist/cnn.py): Conv(32, 5x5, same), ReLU, MaxPool 2,
    Conv(64, 5x5, same), ReLU, MaxPool 2, FC(2048), ReLU, then the head. 6,603,710 parameters at
    1x28x28 and 62 classes. No normalisation: LEAF feeds its grey levels in [0, 1] as they are.

    Initial weights (`leaf_init`, config key weight_init: model) as LEAF's TensorFlow 1 draws them:
    ``tf.layers.conv2d`` and ``tf.layers.dense`` are called without initialisers, so every kernel is
    Glorot-uniform (TF1's default for a float variable: U(-b, b), b = sqrt(6 / (fan_in + fan_out)),
    fan_in = in_channels * 5 * 5 and fan_out = out_channels * 5 * 5 for a convolution, in and out
    features for a dense layer: the fans torch's ``xavier_uniform_`` computes from torch's layouts)
    and every bias zero (the layers' ``bias_initializer=zeros_initializer()``)."""
    return two_conv_cnn(input_shape, num_classes, 2048)


class CharLSTM(nn.Module):
    """A sequence of symbol indices (stored as numbers) through an embedding and stacked LSTM
    layers, giving the last step's output: LEAF's Shakespeare encoder."""

    def __init__(self, vocab: int, embed: int = 8, hidden: int = 256, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, layers, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(x.long()))
        return out[:, -1]


def leaf_lstm(input_shape: tuple[int, ...], num_classes: int) -> EncoderHead:
    """LEAF's Shakespeare model (its models/shakespeare/stacked_lstm.py): each of the 80 characters
    embedded in 8 dimensions, two LSTM layers of 256, and the head on the last step's output over
    the ``num_classes`` symbols (LEAF's 80). 819,920 parameters at 80 symbols: torch's LSTM has two
    bias vectors per layer (``bias_ih``, ``bias_hh``) where TF's BasicLSTMCell has one, so 2 x 1,024
    more than LEAF's 817,872.

    Initial weights (`leaf_init`, config key weight_init: model) as LEAF's TensorFlow 1 draws them:

    - the embedding, ``tf.get_variable("embedding", [80, 8])`` without an initialiser: TF1's
      default for a float variable, Glorot-uniform over [80, 8] (b = sqrt(6 / 88));
    - each ``BasicLSTMCell(256)`` layer: one kernel [input + 256, 4 * 256] (``add_variable`` without
      an initialiser: Glorot-uniform with fan_in = input + 256, fan_out = 1,024) applied to
      concat(x, h), and one bias [1,024] initialised to zeros, with ``forget_bias=1.0`` added to the
      forget gate's pre-activation at run time. torch splits that kernel into ``weight_ih`` [1,024,
      input] and ``weight_hh`` [1,024, 256] (gate order i, f, g, o where TF's is i, j, f, o): both
      are drawn from U(-b, b) with the joint kernel's b = sqrt(6 / (input + 256 + 1,024)) (the
      entries are i.i.d., so the gate order changes nothing). TF's run-time forget bias becomes
      the initial value 1.0 of ``bias_ih``'s forget slice [256:512], the rest of ``bias_ih`` and all
      of ``bias_hh`` zero: the same pre-activations at the start, and an offset held as a
      parameter's initial value trains as TF's constant does under plain SGD, LEAF's optimiser
      (weight decay would pull the 1.0 towards 0 where TF's constant stays). Not a matter of the
      initialisation: ``bias_hh`` gets the same gradient as ``bias_ih``, so a gate's effective
      bias moves twice as far per step as TF's one bias;
    - the dense head (``tf.layers.dense``): Glorot-uniform kernel, zero bias."""
    return EncoderHead(CharLSTM(num_classes), nn.Linear(256, num_classes), 256)


def _glorot_(weight: torch.Tensor, fan_in: int, fan_out: int) -> None:
    """TF1's ``glorot_uniform_initializer`` (variance scaling 1, fan_avg, uniform): U(-b, b) with
    b = sqrt(6 / (fan_in + fan_out)), drawn from torch's default generator."""
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    nn.init.uniform_(weight, -bound, bound)


@torch.no_grad()
def leaf_init(model: nn.Module) -> None:
    """LEAF's initial weights (its TensorFlow 1 defaults; `leaf_cnn`, `leaf_lstm` say which and
    why): Glorot-uniform kernels of every convolution, dense layer, embedding and LSTM layer (an
    LSTM layer's bound from TF's joint [input + hidden, 4 * hidden] kernel), zero biases but the
    LSTM's forget gate, 1.0 in ``bias_ih`` (TF's ``forget_bias``). Draws, in module order, from
    torch's default generator: the stream the model was built from."""
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(module.weight)
            _glorot_(module.weight, fan_in, fan_out)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            vocab, dim = module.weight.shape  # TF's [vocab, dim] variable: fan_in vocab, fan_out dim
            _glorot_(module.weight, vocab, dim)
        elif isinstance(module, nn.LSTM):
            if module.bidirectional or module.proj_size or not module.bias:
                raise ValueError(
                    "leaf_init: a unidirectional LSTM with biases and no projection (BasicLSTMCell's)"
                )
            h = module.hidden_size
            for layer in range(module.num_layers):
                w_ih, w_hh = getattr(module, f"weight_ih_l{layer}"), getattr(module, f"weight_hh_l{layer}")
                fan_in, fan_out = w_ih.shape[1] + h, 4 * h  # TF's kernel [input + hidden, 4 * hidden]
                _glorot_(w_ih, fan_in, fan_out)
                _glorot_(w_hh, fan_in, fan_out)
                b_ih, b_hh = getattr(module, f"bias_ih_l{layer}"), getattr(module, f"bias_hh_l{layer}")
                nn.init.zeros_(b_ih)
                nn.init.zeros_(b_hh)
                nn.init.ones_(b_ih[h : 2 * h])  # torch's gates i, f, g, o: the forget gate's slice


def _sequence_problem(shape: tuple[int, ...]) -> str | None:
    return None if len(shape) == 1 else f"needs sequences of symbol indices, the data set gives {list(shape)}"


def _image_problem(min_side: int, why: str) -> Callable[[tuple[int, ...]], str | None]:
    def problem(shape: tuple[int, ...]) -> str | None:
        if len(shape) != 3:
            return f"needs C x H x W images, the data set gives {list(shape)}"
        if min(shape[1:]) < min_side:
            return f"needs images of at least {min_side}x{min_side} ({why}), got {shape[1]}x{shape[2]}"
        return None

    return problem


def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int = 200) -> EncoderHead:
    """Two hidden layers of 200 units (McMahan et al.'s 2NN), for digits and tabular data."""
    d = math.prod(input_shape)
    encoder = nn.Sequential(
        OrderedDict(
            flatten=nn.Flatten(),
            fc1=nn.Linear(d, hidden),
            relu1=nn.ReLU(),
            fc2=nn.Linear(hidden, hidden),
            relu2=nn.ReLU(),
        )
    )
    return EncoderHead(encoder, nn.Linear(hidden, num_classes), hidden)


def logreg(input_shape: tuple[int, ...], num_classes: int) -> EncoderHead:
    """Multinomial logistic regression (FedProx's model for its synthetic data, MNIST and FEMNIST):
    softmax(W x + b) over the flattened input; the encoder only flattens."""
    d = math.prod(input_shape)
    return EncoderHead(nn.Flatten(), nn.Linear(d, num_classes), d)


# Config key weight_init: model = a model's own initialisation where it declares one (its
# ModelSpec's ``init``), PyTorch's elsewhere; torch = PyTorch's default layers' for every model.
WEIGHT_INITS = ("model", "torch")


@dataclass(frozen=True)
class ModelSpec:
    build: Callable[[tuple[int, ...], int], EncoderHead]
    problem: Callable[[tuple[int, ...]], str | None] = lambda shape: None
    # the model's authors' initialisation, applied in place to a freshly built model (weight_init:
    # model) under no_grad, drawing from torch's default generator; None: PyTorch's layers' own
    init: Callable[[nn.Module], None] | None = None

    def incompatibility(self, input_shape: tuple[int, ...]) -> str | None:
        """Why this model cannot take inputs of this shape, or None."""
        return self.problem(tuple(input_shape))


MODELS: dict[str, ModelSpec] = {}


def register_model(
    name: str,
    problem: Callable[[tuple[int, ...]], str | None] | None = None,
    init: Callable[[nn.Module], None] | None = None,
) -> Callable[[Callable[[tuple[int, ...], int], EncoderHead]], Callable[[tuple[int, ...], int], EncoderHead]]:
    """Decorator: add a model, which ``model: NAME`` then chooses. The function takes
    ``(input_shape, num_classes)`` and returns an `EncoderHead` (the encoder/head split FedConcat,
    MOON and LayerCFL need; a plain network is ``EncoderHead(body, nn.Linear(d, classes), d)``).
    ``problem(input_shape)`` says why the model cannot take such inputs (None: it can), checked
    before any data is read. ``init(model)``: the model's authors' initialisation where it is not
    PyTorch's, applied in place to each freshly built model under ``weight_init: model`` (the
    default), drawing from torch's default generator (seeded for the draw, so one seed gives the
    same weights); ``weight_init: torch`` skips it. The built-ins are added the same way."""

    def add(
        build: Callable[[tuple[int, ...], int], EncoderHead],
    ) -> Callable[[tuple[int, ...], int], EncoderHead]:
        if name in MODELS:
            raise ValueError(f"model {name!r} is registered already (by {MODELS[name].build.__module__})")
        MODELS[name] = ModelSpec(build, problem or (lambda shape: None), init)
        return build

    return add


register_model("simple_cnn", _image_problem(16, "two 5x5 convolutions and two 2x2 pools"))(simple_cnn)
register_model("mcmahan_cnn", _image_problem(4, "two 2x2 pools"))(mcmahan_cnn)
register_model("fedrc_cnn", _image_problem(16, "two 5x5 convolutions and two 2x2 pools"))(fedrc_cnn)
register_model("resnet18", _image_problem(8, "ResNet-18's three stride-2 stages"))(resnet18)
register_model("mobilenet_v2", _image_problem(8, "MobileNetV2's stride-2 stages"))(mobilenet_v2)
register_model("vgg16", _image_problem(32, "VGG-16's five 2x2 pools"))(vgg16)
register_model("mlp")(mlp)
register_model("logreg")(logreg)
register_model("leaf_cnn", _image_problem(4, "two 2x2 pools"), init=leaf_init)(leaf_cnn)
register_model("leaf_lstm", _sequence_problem, init=leaf_init)(leaf_lstm)


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    head_bias: bool = True,
    weight_init: str = "model",
) -> EncoderHead:
    """The named model; ``head_bias=False``: its last layer without a bias (config key head_bias).
    The encoder's initial weights are the same either way (the head is built last).
    ``weight_init`` (config key): "model" applies the model's declared ``init`` (`ModelSpec`) after
    the build, from the same generator; "torch" (and "model" for a model that declares none) keeps
    PyTorch's layers' initialisation, the draws of the build alone."""
    if weight_init not in WEIGHT_INITS:
        raise ValueError(f"weight_init {weight_init!r}: one of {', '.join(WEIGHT_INITS)}")
    spec = MODELS[name]
    model = spec.build(tuple(input_shape), num_classes)
    if not isinstance(model, EncoderHead):
        raise TypeError(
            f"model {name!r} ({spec.build.__module__}) returned a {type(model).__name__}, not an "
            "EncoderHead: wrap it as EncoderHead(body, head, feature_dim) (docs/extending.md)"
        )
    if not head_bias:
        head = model.head
        if not isinstance(head, nn.Linear):
            raise ValueError(f"model {name!r}: its head is a {type(head).__name__}, not a Linear layer")
        head.register_parameter("bias", None)  # no further random draws: the weight is as built
    if weight_init == "model" and spec.init is not None:
        with torch.no_grad():
            spec.init(model)
    return model


# ------------------------------------------------------------------------------------------------
# FedConcat's concatenated model (docs/algorithms/fedconcat.md#stage-3-a-global-classifier-over-concatenated-encoders steps 8-9, eq. F5)
# ------------------------------------------------------------------------------------------------


class ConcatEncoder(nn.Module):
    """K encoders side by side: E(x) = [E_1(x), ..., E_K(x)] along the feature axis, in cluster order."""

    def __init__(self, encoders: Sequence[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(encoders)

    def forward(self, x):  # noqa: D401 - plain nn.Module forward
        return torch.cat([e(x) for e in self.parts], dim=1)


def concatenated(build: Callable[[], EncoderHead], k: int, num_classes: int) -> EncoderHead:
    """K copies of a model's encoder under one linear head Linear(K * feature_dim -> classes)."""
    models = [build() for _ in range(k)]
    d = models[0].feature_dim
    return EncoderHead(ConcatEncoder([m.encoder for m in models]), nn.Linear(k * d, num_classes), k * d)


def projected(base: EncoderHead, out_dim: int, num_classes: int) -> EncoderHead:
    """MOON's model (docs/algorithms/baselines.md#moon, MOON:model.py ModelFedCon): the base encoder h, then a
    projection head z = L2(ReLU(L1(h))) (L1: d -> d, L2: d -> out_dim), then a linear classifier on z.
    The encoder of the result is h followed by the projection, so ``model.encoder(x)`` is z."""
    d = base.feature_dim
    projection = nn.Sequential(OrderedDict(l1=nn.Linear(d, d), relu=nn.ReLU(), l2=nn.Linear(d, out_dim)))
    encoder = nn.Sequential(OrderedDict(base=base.encoder, projection=projection))
    bias = getattr(base.head, "bias", None) is not None  # head_bias: false reaches MOON's classifier too
    return EncoderHead(encoder, nn.Linear(out_dim, num_classes, bias=bias), out_dim)


@dataclass(frozen=True)
class Arch:
    """Which network a parameter dict is for. It travels in messages, so a client (or an evaluation
    worker) builds the network the parameters belong to."""

    concat: int = 0  # 0: the task's model; K >= 1: K of its encoders concatenated under one linear head
    head_only: bool = False  # with concat: only that head (a linear layer over precomputed features)
    projection: int = 0  # > 0: the task's model with MOON's projection head of this output size


TASK = Arch()


def build_arch(arch: Arch, build: Callable[[], EncoderHead], num_classes: int) -> nn.Module:
    if arch.projection > 0:
        if arch.concat:
            raise ValueError("an Arch is either concatenated or projected, not both")
        return projected(build(), arch.projection, num_classes)
    if arch.concat == 0:
        return build()
    if arch.head_only:
        return nn.Linear(arch.concat * build().feature_dim, num_classes)
    return concatenated(build, arch.concat, num_classes)


def concat_params(encoders: Sequence[Params], head: Params) -> dict[str, np.ndarray]:
    """Parameters of `concatenated` from K task models' encoders (in cluster order) and a head
    (``weight``, ``bias`` of the Linear)."""
    out: dict[str, np.ndarray] = {}
    for k, enc in enumerate(encoders):
        for name, v in enc.items():
            if name.startswith("encoder."):
                out[f"encoder.parts.{k}.{name[len('encoder.') :]}"] = v
    out.update({f"head.{n}": v for n, v in head.items()})
    return out


def head_from_clusters(models: Sequence[Params]) -> dict[str, np.ndarray]:
    """F5: the head [W_1 | ... | W_K] with bias b_1 + ... + b_K, so the concatenated model's logits
    start as the sum of the K cluster models' logits."""
    weight = np.concatenate([np.asarray(m["head.weight"]) for m in models], axis=1)
    bias = np.sum([np.asarray(m["head.bias"], dtype=np.float64) for m in models], axis=0)
    return {"weight": weight, "bias": bias.astype(np.asarray(models[0]["head.bias"]).dtype)}
