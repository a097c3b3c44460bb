"""Two ways to run the stacked engine's step that are being measured on GPUs, off by default.

They are not config keys: each moves the numbers by float round-off, and neither has yet paid where
it could (docs/benchmark.md has the figures). The benchmarks and the GPU check switch them on for a
process with `use` (``python -m jobs.bench_batched --stacked-conv im2col --stacked-compile``,
scripts/gpu_check.sh); tests/test_batched.py checks that each gives the per-client numbers.

- ``conv="im2col"``: a stack's convolutions as every model's batch unfolded at once (im2col) and
  contracted with its weights in one batched matrix product, a few kernels a layer whatever the
  stack's width, in place of vmap's grouped convolution (which cuDNN runs a kernel a model).
- ``compile=True``: the step (forward, backward and every model's SGD update) compiled by
  `torch.compile` as one graph, its elementwise operations fused (about 90 operations a step eager,
  each a kernel on a GPU, where a step's time is mostly those kernels' fixed cost). The first step of
  each stack shape in a process compiles (about 40 s on a 2-core CPU, 6 s from inductor's cache).
  On a CPU it does not pay (an epoch of 8 simple CNNs: 1.1 s compiled in a fixed stack, 0.9 s per
  client).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

CONVS = ("grouped", "im2col")


@dataclass(frozen=True)
class StepOptions:
    conv: str = "grouped"  # grouped | im2col
    compile: bool = False


_options = StepOptions()


def use(conv: str | None = None, compile: bool | None = None) -> StepOptions:
    """Set this process's step options (those not given stay as they are); returns the options
    before, which ``use(before.conv, before.compile)`` puts back."""
    global _options
    before = _options
    if conv is not None and conv not in CONVS:
        raise ValueError(f"the stacked step's convolution must be one of {', '.join(CONVS)}, got {conv!r}")
    _options = StepOptions(
        before.conv if conv is None else conv, before.compile if compile is None else bool(compile)
    )
    return before


def current() -> StepOptions:
    return _options


def conv2d_im2col(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> torch.Tensor:
    """``F.conv2d`` as im2col and a matrix product: the same values up to float round-off."""

    def pair(v: Any) -> tuple[int, int]:
        return (v, v) if isinstance(v, int) else tuple(v)

    if groups != 1 or input.dim() != 4 or isinstance(padding, str):
        return nn.functional.conv2d(input, weight, bias, stride, padding, dilation, groups)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = weight.shape[-2:], pair(stride), pair(padding), pair(dilation)
    b, _, h, w = input.shape
    out_h = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = nn.functional.unfold(input, (kh, kw), (dh, dw), (ph, pw), (sh, sw))  # [B, C*kh*kw, L]
    out = torch.einsum("bkl,ok->bol", cols, weight.flatten(1))
    if bias is not None:
        out = out + bias[None, :, None]
    return out.reshape(b, weight.shape[0], out_h, out_w)


class _Im2col(torch.overrides.TorchFunctionMode):
    """Every ``F.conv2d`` called inside computed by `conv2d_im2col`. Inside, CUDA's matrix products
    may use TF32 where its convolutions may (``cuda_tf32``; fedray keeps matrix products float32
    otherwise), so the products that replace the convolutions run at the convolutions' precision
    (the linear layers of the step too)."""

    def __enter__(self):
        self._tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32
        return super().__enter__()

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self._tf32
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is nn.functional.conv2d:
            return conv2d_im2col(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def conv_mode() -> Any:
    """The context a stacked step's convolutions run in."""
    return _Im2col() if _options.conv == "im2col" else contextlib.nullcontext()


def compiled(step: Callable[..., None]) -> Callable[..., None]:
    """The step, compiled where the options ask (one graph, fullgraph: a break would split the
    fusion and the CUDA graph's step)."""
    return torch.compile(step, fullgraph=True) if _options.compile else step
