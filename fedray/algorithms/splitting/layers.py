"""Layers of a model as groups of parameter names, and LayerCFL's layer selection (docs/algorithms/splitting.md#layercfl).

A layer is one module's own parameters (its weight and bias: docs/algorithms/splitting.md#d2-which-layers-layercfl-compares, docs/algorithms/splitting.md#what-a-layer-is). Selections:
``conv`` every convolution, ``fc`` the first fully connected layer (LayerCFL's choices for feature
and for label skew), ``conv:I`` / ``fc:I`` the I-th convolution / fully connected layer (1-based, in
the model's order: the paper names one layer), ``auto`` the convolutions where the model has any,
else its first fully connected layer (so it works for every model), ``all`` every parameter (CFL),
or a list of regular expressions matched (``re.search``) against parameter names, e.g.
``["features\\\\.7\\\\."]`` for VGG-16's 4th conv.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from torch import nn

PRESETS = ("auto", "conv", "fc", "all")  # and conv:I, fc:I
_KINDS = {"conv": (nn.Conv1d, nn.Conv2d, nn.Conv3d), "fc": (nn.Linear,)}


def is_preset(spec: str) -> bool:
    """``spec`` names a preset (``conv:2`` included), not a pattern list."""
    kind, _, index = spec.partition(":")
    return spec in PRESETS or (kind in _KINDS and index.isdigit() and int(index) >= 1)


def layer_params(model: nn.Module) -> dict[str, list[str]]:
    """Module name -> the full names of its own parameters, in the model's order (modules without
    parameters of their own left out; buffers never included)."""
    out: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        own = [f"{name}.{p}" if name else p for p, _ in module.named_parameters(recurse=False)]
        if own:
            out[name] = own
    return out


def _of_type(model: nn.Module, kinds: tuple[type, ...]) -> list[str]:
    return [
        n for n, m in model.named_modules() if isinstance(m, kinds) and any(True for _ in m.parameters(False))
    ]


def select(model: nn.Module, spec: str | Sequence[str]) -> list[str]:
    """The parameter names a selection picks, in the model's order; an error names what matched nothing."""
    by_layer = layer_params(model)
    every = [p for ps in by_layer.values() for p in ps]
    if isinstance(spec, str):
        if spec == "all":
            return every
        if not is_preset(spec):
            raise ValueError(
                f"config key 'hp.layers': one of {', '.join(PRESETS)}, conv:I, fc:I or a list of patterns, got {spec!r}"
            )
        convs, fcs = _of_type(model, _KINDS["conv"]), _of_type(model, _KINDS["fc"])
        kind, _, index = spec.partition(":")
        if spec == "auto":
            chosen = convs or fcs[:1]
        elif index:
            pool = convs if kind == "conv" else fcs
            chosen = pool[int(index) - 1 : int(index)]
        else:
            chosen = convs if kind == "conv" else fcs[:1]
        if not chosen:
            raise ValueError(
                f"config key 'hp.layers': {spec!r} finds no such layer in {type(model).__name__}, which has "
                f"{len(convs)} convolution(s) and {len(fcs)} fully connected layer(s) ({', '.join(by_layer) or 'none'}); "
                f"set hp.layers to {_suggest(convs, fcs)}"
            )
        return [p for layer in chosen for p in by_layer[layer]]
    picked = [p for p in every if any(re.search(pat, p) for pat in spec)]
    for pat in spec:
        if not any(re.search(pat, p) for p in every):
            raise ValueError(
                f"config key 'hp.layers': pattern {pat!r} matches no parameter of {type(model).__name__} "
                f"(its parameters: {', '.join(every[:12])}{', ...' if len(every) > 12 else ''})"
            )
    return picked


def _suggest(convs: list[str], fcs: list[str]) -> str:
    options = [
        *(["conv", f"conv:1 .. conv:{len(convs)}"] if convs else []),
        *(["fc", f"fc:1 .. fc:{len(fcs)}"] if fcs else []),
        "all",
        "auto",
    ]
    return ", ".join(options)


def flatten(params: dict[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
    """The named entries of a state dict as one float64 vector, in ``names`` order."""
    return np.concatenate([np.asarray(params[n], dtype=np.float64).ravel() for n in names])
