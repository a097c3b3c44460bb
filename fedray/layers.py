"""Layers of a model as groups of parameter names, and LayerCFL's layer selection (ALGORITHMS.md §6.2).

A layer is one module's own parameters (its weight and bias: register row 21, §6.2(d)). Selections:
``conv`` every convolution, ``fc`` the first fully connected layer (LayerCFL's choices for feature
and for label skew), ``all`` every parameter (CFL), or a list of regular expressions matched
(``re.search``) against parameter names, e.g. ``["features\\\\.7\\\\."]`` for VGG-16's 4th conv.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from torch import nn

PRESETS = ("conv", "fc", "all")


def layers(model: nn.Module) -> dict[str, list[str]]:
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
    by_layer = layers(model)
    every = [p for ps in by_layer.values() for p in ps]
    if isinstance(spec, str):
        if spec == "all":
            return every
        if spec == "conv":
            chosen = _of_type(model, (nn.Conv1d, nn.Conv2d, nn.Conv3d))
        elif spec == "fc":
            chosen = _of_type(model, (nn.Linear,))[:1]
        else:
            raise ValueError(
                f"config key 'hp.layers': one of {', '.join(PRESETS)} or a list of patterns, got {spec!r}"
            )
        if not chosen:
            raise ValueError(
                f"config key 'hp.layers': {spec!r} finds no such layer in {type(model).__name__}"
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


def flatten(params: dict[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
    """The named entries of a state dict as one float64 vector, in ``names`` order."""
    return np.concatenate([np.asarray(params[n], dtype=np.float64).ravel() for n in names])
