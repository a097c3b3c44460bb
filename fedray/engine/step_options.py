"""Ways to run the stacked engine that are being measured on GPUs.

They are not config keys: each moves the numbers by float round-off (docs/benchmark.md has the
figures). An engine decided (`fedray.engine.choice.Engine`) carries the options of its process at
that moment to every stacked call it makes. The benchmarks and the GPU check switch them for a
process with `use`, before its runs start (``python -m
jobs.bench.batched --stacked-conv im2col --stacked-compile --stacked-eval off``,
scripts/gpu_check.sh); tests/engine/test_batched.py checks that each gives the per-client numbers. The
first two are off by default (neither has yet paid where it could); the third is on where it can pay:

- ``conv="im2col"``: a stack's convolutions as every model's batch unfolded at once (im2col) and
  contracted with its weights in one batched matrix product, a few kernels a layer whatever the
  stack's width, in place of vmap's grouped convolution (which cuDNN runs a kernel a model).
- ``compile=True``: the step (forward, backward and every model's SGD update) compiled by
  `torch.compile` as one graph, its elementwise operations fused (on a GPU a step's time is mostly
  its kernels' fixed cost). The first step of each stack shape in a process compiles; on a CPU it
  does not pay (docs/benchmark.md#figures-behind-defaults).
- ``stacked_eval``: a client's evaluations of several models on one split (FedEM's and FedRC's
  E-step and ensemble, K models on its training split) as one forward of the K models stacked, each
  batch read once, in place of a pass a model. ``auto`` (the default): on a CUDA device, where a
  pass is mostly kernels' fixed cost; on the CPU the passes stay one a model (they cost their
  arithmetic either way, and give the per-client engine's numbers to the bit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

CONVS = ("grouped", "im2col")
STACKED_EVALS = ("auto", "on", "off")


@dataclass(frozen=True)
class StepOptions:
    conv: str = "grouped"  # grouped | im2col
    compile: bool = False
    stacked_eval: str = "auto"  # auto (on a CUDA device) | on | off


_options = StepOptions()


def use(conv: str | None = None, compile: bool | None = None, stacked_eval: str | None = None) -> StepOptions:
    """Set this process's step options (those not given stay as they are); returns the options
    before, which ``use(before.conv, before.compile, before.stacked_eval)`` puts back."""
    global _options
    before = _options
    if conv is not None and conv not in CONVS:
        raise ValueError(f"the stacked step's convolution must be one of {', '.join(CONVS)}, got {conv!r}")
    if stacked_eval is not None and stacked_eval not in STACKED_EVALS:
        raise ValueError(
            f"stacked evaluation must be one of {', '.join(STACKED_EVALS)}, got {stacked_eval!r}"
        )
    _options = StepOptions(
        before.conv if conv is None else conv,
        before.compile if compile is None else bool(compile),
        before.stacked_eval if stacked_eval is None else stacked_eval,
    )
    return before


def current() -> StepOptions:
    """This process's options: what an engine decided now carries (`fedray.engine.choice.Engine`)."""
    return _options


def stacks_evaluations(device: torch.device, options: StepOptions | None = None) -> bool:
    """Whether a host that trains batched on ``device`` evaluates a client's models stacked, under
    ``options`` (its engine's; None: this process's)."""
    options = options or _options
    if options.stacked_eval == "auto":
        return device.type == "cuda"
    return options.stacked_eval == "on"


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


def conv_mode(options: StepOptions | None = None) -> Any:
    """The context a stacked step's convolutions run in under ``options`` (None: this process's)."""
    return _Im2col() if (options or _options).conv == "im2col" else contextlib.nullcontext()


def compiled(step: Callable[..., None], options: StepOptions | None = None) -> Callable[..., None]:
    """The step, compiled where ``options`` ask (None: this process's; one graph, fullgraph: a break
    would split the fusion and the CUDA graph's step)."""
    return torch.compile(step, fullgraph=True) if (options or _options).compile else step
