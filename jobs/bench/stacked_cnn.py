"""How fast one SGD step of many simple CNNs can go, four ways, on the GPU table's cell.

    python -m jobs.bench.stacked_cnn [--device cuda] [--models 40,160,640] [--steps 200]

The stacked engine steps M models at once under ``torch.func.vmap``, which turns each model's
convolution into one grouped convolution of M groups; on the H200 a step of 40 simple CNNs takes
about 1.2 ms (1-2% of the float32 peak) and grows in proportion to M, and a profile showed cuDNN
launching a kernel per group. This script times one SGD step (forward, backward, momentum update)
of M simple CNNs (fedray's ``simple_cnn`` on 1x28x28, batch 64) written four ways, without fedray's
engine around them, each step captured in a CUDA graph on CUDA:

- ``vmap``: ``vmap(grad(loss))`` over the models of a ``functional_call`` of the module, as the
  stacked engine does (the convolution becomes a grouped one);
- ``vmap-im2col``: as ``vmap``, with the stacked engine's im2col convolutions (`fedray.engine.step_options`'
  ``conv="im2col"``: ``F.unfold`` contracted with the weights, which vmap batches as one
  contraction over the models): what the engine does when switched;
- ``grouped``: the same grouped convolution written out (models folded into the channels), no vmap;
- ``bmm``: each convolution as ``unfold`` (im2col) of every model's batch at once and one batched
  matrix product over the models (``baddbmm``), the linear layers as ``baddbmm`` too: a handful of
  kernels a layer whatever M is.

First it checks that the four give the same gradients (largest difference, on a few models), then
prints ms a step and sample-steps a second for each M. It answers whether a convolution formulation
that does not launch per model would make the stacked step faster, before the engine is changed.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from fedray.engine import step_options
from fedray.models import build_model

BATCH, CLASSES, SHAPE = 64, 10, (1, 28, 28)


def stacked_params(m: int, device: torch.device) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """M simple CNNs' parameters, stacked on a leading axis, and the module they belong to."""
    models = []
    for i in range(m):
        torch.manual_seed(i)
        models.append(build_model("simple_cnn", SHAPE, CLASSES))
    names = [n for n, _ in models[0].named_parameters()]
    params = {
        n: torch.stack([dict(mm.named_parameters())[n].detach() for mm in models]).to(device) for n in names
    }
    return models[0].to(device), params


def conv_grouped(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x [M, B, C, H, W], w [M, O, C, k, k], b [M, O] -> [M, B, O, H', W'], as one grouped conv."""
    m, bs, c, h, wd = x.shape
    o = w.shape[1]
    y = F.conv2d(
        x.transpose(0, 1).reshape(bs, m * c, h, wd), w.reshape(m * o, *w.shape[2:]), b.reshape(-1), groups=m
    )
    return y.reshape(bs, m, o, *y.shape[2:]).transpose(0, 1)


def conv_bmm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same convolution as im2col of every model's batch and one batched matrix product."""
    m, bs, c, h, wd = x.shape
    o, k = w.shape[1], w.shape[-1]
    cols = F.unfold(x.reshape(m * bs, c, h, wd), k)  # [M*B, C*k*k, L]
    ckk, length = cols.shape[1:]
    cols = cols.reshape(m, bs, ckk, length).transpose(1, 2).reshape(m, ckk, bs * length)
    y = torch.baddbmm(b[:, :, None], w.reshape(m, o, ckk), cols)  # [M, O, B*L]
    side = h - k + 1
    return y.reshape(m, o, bs, side, wd - k + 1).transpose(1, 2)


def forward(p: dict[str, torch.Tensor], x: torch.Tensor, conv) -> torch.Tensor:
    """M simple CNNs on x [M, B, 1, 28, 28] -> logits [M, B, classes]."""
    m, bs = x.shape[:2]

    def pool(t: torch.Tensor) -> torch.Tensor:
        r = F.max_pool2d(F.relu(t.reshape(m * bs, *t.shape[2:])), 2)
        return r.reshape(m, bs, *r.shape[1:])

    h = pool(conv(x, p["encoder.conv1.weight"], p["encoder.conv1.bias"]))
    h = pool(conv(h, p["encoder.conv2.weight"], p["encoder.conv2.bias"])).reshape(m, bs, -1)
    for name, act in (("encoder.fc1", True), ("encoder.fc2", True), ("head", False)):
        h = torch.baddbmm(p[f"{name}.bias"][:, None, :], h, p[f"{name}.weight"].transpose(1, 2))
        h = F.relu(h) if act else h
    return h


def explicit_step(conv):
    """One step's gradients of the summed per-model mean cross-entropy (autograd, no vmap)."""

    def grads(p, x, y):
        leaves = {n: t.detach().requires_grad_(True) for n, t in p.items()}
        logits = forward(leaves, x, conv)
        loss = F.cross_entropy(logits.reshape(-1, CLASSES), y.reshape(-1), reduction="sum") / x.shape[1]
        g = torch.autograd.grad(loss, list(leaves.values()))
        return dict(zip(leaves, g, strict=True))

    return grads


def vmap_step(module: torch.nn.Module, im2col: bool = False):
    """``vmap(grad(loss))`` over the models; with ``im2col`` each convolution as the stacked engine
    computes it under ``conv="im2col"`` (`fedray.engine.step_options.conv_mode`)."""

    def loss_one(params, x, y):
        return F.cross_entropy(functional_call(module, params, (x,)), y)

    g = vmap(grad(loss_one))
    if not im2col:
        return g

    def with_im2col(p, x, y):
        before = step_options.use(conv="im2col")
        try:
            with step_options.conv_mode():
                return g(p, x, y)
        finally:
            step_options.use(conv=before.conv)

    return with_im2col


def sgd(p, bufs, g, lr=0.01, mom=0.9) -> None:
    with torch.no_grad():
        ps, gs, bs = list(p.values()), [g[n] for n in p], list(bufs.values())
        torch._foreach_mul_(bs, mom)
        torch._foreach_add_(bs, gs)
        torch._foreach_add_(ps, bs, alpha=-lr)


def timed(way: str, m: int, steps: int, device: torch.device) -> float:
    """Seconds a step of ``way`` at M models, the step captured in a CUDA graph on CUDA."""
    module, p = stacked_params(m, device)
    bufs = {n: torch.zeros_like(t) for n, t in p.items()}
    x = torch.randn(m, BATCH, *SHAPE, device=device)
    y = torch.randint(0, CLASSES, (m, BATCH), device=device)
    if way.startswith("vmap"):
        grads = vmap_step(module, im2col=way == "vmap-im2col")
    else:
        grads = explicit_step(conv_grouped if way == "grouped" else conv_bmm)

    def step() -> None:
        sgd(p, bufs, grads(p, x, y))

    cuda = device.type == "cuda"
    # matrix products at the convolutions' precision (TF32) where they replace them, as
    # fedray.engine.step_options' im2col does (vmap-im2col: its mode sets it); float32 elsewhere, as fedray runs
    torch.backends.cuda.matmul.allow_tf32 = way == "bmm"
    if cuda:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run = graph.replay
        torch.cuda.synchronize()
    else:
        step()
        run = step
    t0 = time.perf_counter()
    for _ in range(steps):
        run()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def agreement(device: torch.device) -> float:
    """The largest difference between the four ways' gradients, on 3 models."""
    module, p = stacked_params(3, device)
    x = torch.randn(3, 8, *SHAPE, device=device)
    y = torch.randint(0, CLASSES, (3, 8), device=device)
    want = vmap_step(module)(p, x, y)
    worst = 0.0
    for grads in (explicit_step(conv_grouped), explicit_step(conv_bmm), vmap_step(module, im2col=True)):
        got = grads(p, x, y)
        worst = max(worst, max(float((got[n] - want[n]).abs().max()) for n in want))
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m jobs.bench.stacked_cnn", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", default="40,160,640", help="models a stack (comma-separated)")
    ap.add_argument("--steps", type=int, default=200, help="timed steps (default 200)")
    ap.add_argument("--ways", default="vmap,vmap-im2col,grouped,bmm")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":  # the kernel settings fedray runs under: deterministic, TF32 convolutions
        from fedray.federation.host import cuda_determinism

        cuda_determinism(True, True)
    print(
        f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}; batch {BATCH}; simple CNN"
    )
    print(f"gradients agree to {agreement(device):.2e} (largest difference, 3 models)", flush=True)
    for m in [int(v) for v in args.models.split(",")]:
        for way in args.ways.split(","):
            sec = timed(way, m, args.steps, device)
            print(
                f"{way:11s} {m:5d} models: {1000 * sec:8.3f} ms a step, {m * BATCH / sec:12,.0f} sample-steps/s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
