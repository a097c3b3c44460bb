"""Model registry. Every model is an `EncoderHead`: ``forward(x) = head(encoder(x))``.

FedConcat concatenates encoders, MOON and FedRS work on the feature, LayerCFL picks layers by
name, so the encoder/head split and stable layer names are part of every model's contract.
New models (FedRC's CNN, VGG-9, torchvision ResNets, MobileNetV2) slot into `MODELS`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn


class EncoderHead(nn.Module):
    def __init__(self, encoder: nn.Module, head: nn.Module, feature_dim: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.feature_dim = feature_dim

    def forward(self, x):  # noqa: D401 - plain nn.Module forward
        return self.head(self.encoder(x))


def simple_cnn(input_shape: tuple[int, ...], num_classes: int) -> EncoderHead:
    """NIID-Bench / FedConcat "simple CNN" (ALGORITHMS.md §0.1); 44,426 params at 1x28x28, 62,006 at 3x32x32."""
    c, h, w = input_shape
    out_h, out_w = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2  # two (5x5 conv, 2x2 pool) stages
    flat = 16 * out_h * out_w
    encoder = nn.Sequential(
        OrderedDict(
            conv1=nn.Conv2d(c, 6, 5), relu1=nn.ReLU(), pool1=nn.MaxPool2d(2),
            conv2=nn.Conv2d(6, 16, 5), relu2=nn.ReLU(), pool2=nn.MaxPool2d(2),
            flatten=nn.Flatten(),
            fc1=nn.Linear(flat, 120), relu3=nn.ReLU(),
            fc2=nn.Linear(120, 84), relu4=nn.ReLU(),
        )
    )  # fmt: skip
    return EncoderHead(encoder, nn.Linear(84, num_classes), 84)


def _simple_cnn_problem(shape: tuple[int, ...]) -> str | None:
    if len(shape) != 3:
        return f"needs C x H x W images, the data set gives {list(shape)}"
    if min(shape[1:]) < 16:
        return f"needs images of at least 16x16 (two 5x5 convolutions and two 2x2 pools), got {shape[1]}x{shape[2]}"
    return None


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


@dataclass(frozen=True)
class ModelSpec:
    build: Callable[[tuple[int, ...], int], EncoderHead]
    problem: Callable[[tuple[int, ...]], str | None] = lambda shape: None

    def incompatibility(self, input_shape: tuple[int, ...]) -> str | None:
        """Why this model cannot take inputs of this shape, or None."""
        return self.problem(tuple(input_shape))


MODELS: dict[str, ModelSpec] = {
    "simple_cnn": ModelSpec(simple_cnn, _simple_cnn_problem),
    "mlp": ModelSpec(mlp),
}


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> EncoderHead:
    return MODELS[name].build(tuple(input_shape), num_classes)
