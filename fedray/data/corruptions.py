"""FashionMNIST-C image corruptions (docs/algorithms/mixture.md#the-fmnist-c-benchmark), after FedRC's generator.

FedRC (Guo, Tang, Lin, ICML 2024; ``create_c/make_fmnist_c.py`` in LINs-lab/FedRC) corrupts 20% + 10%
of the clients with one corruption type and one severity each, following Mu & Gilmer's MNIST-C. The
constants below are theirs, indexed by severity - 1. Everything works on 28x28 uint8 grayscale and
returns uint8 clipped to [0, 255].

Randomness comes only from the numpy Generator we are given, drawn image by image in image order,
so ``corrupt`` is a pure function of (images, name, severity, generator state), and corrupting a
batch equals corrupting its images one after another with the same generator. The draws are ours,
so the output is reproducible for a seed but not bit-identical to the reference's ``np.random``.

Where we differ from the reference (on purpose, each small):

* float -> uint8 conversions round to nearest; the reference's ``np.uint8(float)`` truncates, which
  also turns float error such as 254.99999 into 254.
* ``motion_blur``: the reference calls ImageMagick's MotionBlurImage through Wand. We rebuild that
  operator: a one-sided kernel of width 2*ceil(radius)+1 with weights exp(-i^2 / 2 sigma^2),
  normalised, whose i-th tap sits at round(i*cos(angle), i*sin(angle)), correlated with
  ``scipy.ndimage`` with edge replication (ImageMagick's default virtual pixels). Not bit-identical
  (ImageMagick works in its quantum depth and the reference round-trips through PNG).
* ``shear`` builds the matrix [[1, -sin c], [0, cos c]] explicitly: that is what
  ``AffineTransform(shear=c)`` meant in the scikit-image the reference ran on (it still passes
  ``multichannel=``, removed in 0.20); scikit-image 0.21 changed it to [[1, -tan c], [0, 1]].
* ``dotted_line`` and ``zigzag`` draw with ``skimage.draw.line_aa`` (zigzag vertices rounded to
  pixels) where the reference has its own line profile, about 3 px tall; our lines are thinner.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from skimage import color, draw, feature, filters, transform, util

Corruption = Callable[[np.ndarray, int, np.random.Generator], np.ndarray]

SIDE = 28
CENTRE = (SIDE - 1) / 2  # 13.5: geometric corruptions keep this point fixed

_SHOT = (60, 25, 12, 5, 3)
_IMPULSE = (0.03, 0.06, 0.09, 0.17, 0.27)
_GLASS = ((0.7, 1, 2), (0.9, 2, 1), (1.0, 2, 3), (1.1, 3, 2), (1.5, 4, 2))  # sigma, max_delta, iterations
_MOTION = ((10, 3), (15, 5), (15, 8), (15, 12), (20, 15))  # radius, sigma (ImageMagick's)
_SHEAR = (0.2, 0.4, 0.6, 0.8, 1.0)
_SCALE = (1 / 0.9, 1 / 0.8, 1 / 0.7, 1 / 0.6, 1 / 0.5)  # inverse map: content shrinks to 90%..50%
_ROTATE = (0.2, 0.4, 0.6, 0.8, 1.0)  # radians
_BRIGHTNESS = (0.1, 0.2, 0.3, 0.4, 0.5)
_SPATTER = (  # loc, scale, sigma, threshold, sigma2; the reference's 6th value (mode) is unused for FMNIST
    (0.65, 0.3, 4, 0.69, 0.6),
    (0.65, 0.3, 3, 0.68, 0.6),
    (0.65, 0.3, 2, 0.68, 0.5),
    (0.65, 0.3, 1, 0.65, 1.5),
    (0.67, 0.4, 1, 0.65, 1.5),
)
_MUD = 63 / 255  # spatter colour


# ---- helpers ------------------------------------------------------------------------------------


def _unit(batch: np.ndarray) -> np.ndarray:
    return batch.astype(np.float64) / 255.0


def _to_uint8(x: np.ndarray) -> np.ndarray:
    """[0, 1] floats -> uint8, rounding (see the module docstring) and clipping."""
    return np.clip(np.rint(x * 255.0), 0, 255).astype(np.uint8)


def _signs(rng: np.random.Generator, n: int, k: int = 1) -> np.ndarray:
    """(n, k) random signs, drawn image by image so batches match one-by-one calls."""
    return np.stack([np.where(rng.random(k) < 0.5, -1.0, 1.0) for _ in range(n)])


def _blur(batch: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur of each image of an (n, 28, 28) float stack (axis 0 is not blurred)."""
    return filters.gaussian(batch, sigma=(0, sigma, sigma))


def _warp_about_centre(batch: np.ndarray, linears: list[np.ndarray]) -> np.ndarray:
    """Warp image i with inverse map x -> A_i (x - c) + c, c the centre (13.5, 13.5), as the reference does."""
    x, out = _unit(batch), np.empty(batch.shape)
    for i, a in enumerate(linears):
        m = np.eye(3)
        m[:2, :2] = a
        m[:2, 2] = CENTRE - a @ np.array([CENTRE, CENTRE])
        out[i] = transform.warp(x[i], inverse_map=transform.AffineTransform(matrix=m))
    return _to_uint8(out)


# ---- the corruptions, on (n, 28, 28) uint8 stacks ------------------------------------------------


def _identity(batch: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    return batch.copy()


def _shot_noise(batch: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    c = _SHOT[severity - 1]
    x = _unit(batch)
    return _to_uint8(np.stack([rng.poisson(xi * c) for xi in x]) / c)


def _impulse_noise(batch: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    amount = _IMPULSE[severity - 1]
    return _to_uint8(
        np.stack([util.random_noise(xi, mode="s&p", amount=amount, rng=rng) for xi in _unit(batch)])
    )


def _glass_blur(batch: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Blur, locally shuffle pixels, blur again.

    As in the reference, pixels are visited from (27-d, 27-d) down to (d+1, d+1), row-major, and each
    is swapped with probability 1/2 with the pixel at offset (dy, dx), both uniform on [-d, d-1]
    (the reference's exclusive upper bound). Swaps chain, so the visit order matters; we keep it and
    vectorise across images instead.
    """
    sigma, d, iterations = _GLASS[severity - 1]
    n = len(batch)
    x = _to_uint8(_blur(_unit(batch), sigma)).reshape(n, SIDE * SIDE)
    span = np.arange(SIDE - d, d, -1)  # rows (and columns) visited, in visiting order
    here = (span[:, None] * SIDE + span[None, :]).ravel()  # flat index of each visited pixel
    u = np.stack([rng.random((iterations, here.size, 3)) for _ in range(n)])  # (n, it, pixels, 3)
    offset = np.floor(u[..., 1:] * 2 * d).astype(np.int64) - d  # (dy, dx) in [-d, d-1]
    offset[u[..., 0] >= 0.5] = 0  # no swap: swapping a pixel with itself
    there = here[None, None, :] + offset[..., 0] * SIDE + offset[..., 1]  # (n, it, pixels)
    rows = np.arange(n)
    for it in range(iterations):
        for k, p in enumerate(here):
            q = there[:, it, k]
            mine = x[:, p].copy()
            x[:, p] = x[rows, q]
            x[rows, q] = mine
    return _to_uint8(_blur(x.reshape(batch.shape) / 255.0, sigma))


def _motion_kernel(radius: float, sigma: float, angle_deg: float) -> tuple[np.ndarray, tuple[int, int]]:
    """ImageMagick's motion-blur taps as a small 2-D correlation kernel and its scipy ``origin``.

    Tap i (weight exp(-i^2 / 2 sigma^2), normalised) reads the pixel at offset
    (round(i sin a), round(i cos a)) in (row, column). With edge replication any offset beyond the
    image acts like one of SIDE - 1, so offsets are clipped there to keep the kernel (and the cost) small.
    """
    width = 2 * int(np.ceil(radius)) + 1
    i = np.arange(width)
    weights = np.exp(-(i**2) / (2.0 * sigma**2))
    weights /= weights.sum()
    a = np.deg2rad(angle_deg)
    dy = np.clip(np.ceil(i * np.sin(a) - 0.5).astype(np.int64), 1 - SIDE, SIDE - 1)
    dx = np.clip(np.ceil(i * np.cos(a) - 0.5).astype(np.int64), 1 - SIDE, SIDE - 1)
    y0, x0 = dy.min(), dx.min()
    kernel = np.zeros((dy.max() - y0 + 1, dx.max() - x0 + 1))
    np.add.at(kernel, (dy - y0, dx - x0), weights)
    # ndimage.correlate centres the kernel at size // 2 + origin; we need offset 0 at index -y0 / -x0.
    origin = (int(-y0 - kernel.shape[0] // 2), int(-x0 - kernel.shape[1] // 2))
    return kernel, origin


def _motion_blur(batch: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    radius, sigma = _MOTION[severity - 1]
    angles = [rng.uniform(-45.0, 45.0) for _ in range(len(batch))]
    x, out = _unit(batch), np.empty(batch.shape)
    from scipy import ndimage  # imported where used (start-up time)

    for k, angle in enumerate(angles):
        kernel, origin = _motion_kernel(radius, sigma, angle)
        out[k] = ndimage.correlate(x[k], kernel, mode="nearest", origin=origin)
    return _to_uint8(out)


def _shear(batch: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    c = _SHEAR[severity - 1] * _signs(rng, len(batch))[:, 0]
    return _warp_about_centre(batch, [np.array([[1.0, -np.sin(ci)], [0.0, np.cos(ci)]]) for ci in c])


def _scale(batch: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    s = _SCALE[severity - 1]
    return _warp_about_centre(batch, [np.diag([s, s])] * len(batch))


def _rotate(batch: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    c = _ROTATE[severity - 1] * _signs(rng, len(batch))[:, 0]
    return _warp_about_centre(batch, [np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]) for a in c])


def _brightness(batch: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Raise the HSV value channel; for gray input this is clip(x + c), but we take the reference's route."""
    hsv = color.rgb2hsv(color.gray2rgb(_unit(batch)))
    hsv[..., 2] = np.clip(hsv[..., 2] + _BRIGHTNESS[severity - 1], 0, 1)
    return _to_uint8(color.rgb2gray(color.hsv2rgb(hsv)))


def _translate(batch: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Shift by `severity` pixels in x and in y, each direction random (integer shifts, so exact)."""
    shifts = severity * _signs(rng, len(batch), 2)  # (dx, dy) of the inverse map
    x, out = _unit(batch), np.empty(batch.shape)
    for i, t in enumerate(shifts):
        out[i] = transform.warp(x[i], inverse_map=transform.AffineTransform(translation=t))
    return _to_uint8(out)


def _stripe(batch: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    out = batch.copy()
    out[..., :7] = 255 - out[..., :7]
    out[..., 21:] = 255 - out[..., 21:]
    return out


def _spatter(batch: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Mud splashes: thresholded blurred noise, softened, kept only where solid (>= 0.8), painted gray 63."""
    loc, scale, sigma, threshold, sigma2 = _SPATTER[severity - 1]
    liquid = _blur(np.stack([rng.normal(loc, scale, (SIDE, SIDE)) for _ in range(len(batch))]), sigma)
    mask = _blur((liquid > threshold).astype(np.float64), sigma2)
    mask[mask < 0.8] = 0
    return _to_uint8(_unit(batch) * (1 - mask) + _MUD * mask)


def _canvas_add(canvas: np.ndarray, rr: np.ndarray, cc: np.ndarray, val: np.ndarray) -> None:
    """Add anti-aliased line pixels to a canvas, dropping those outside the image."""
    keep = (rr >= 0) & (rr < SIDE) & (cc >= 0) & (cc < SIDE)
    np.add.at(canvas, (rr[keep], cc[keep]), val[keep])


def _dotted_line(batch: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """A line from column 0 to 27 between random rows in [0, 26], with columns 0-1, 4-5, ..., 24-25 blanked."""
    rows = np.floor(np.stack([rng.random(2) for _ in range(len(batch))]) * (SIDE - 1)).astype(np.int64)
    gaps = (np.arange(SIDE) // 2) % 2 == 0
    out = _unit(batch)
    for i, (r0, r1) in enumerate(rows):
        canvas = np.zeros((SIDE, SIDE))
        _canvas_add(canvas, *draw.line_aa(r0, 0, r1, SIDE - 1))
        canvas[:, gaps] = 0
        out[i] += canvas
    return _to_uint8(np.clip(out, 0, 1))


def _zigzag_vertices(r0: int, r1: int) -> np.ndarray:
    """(row, col) vertices of the reference's zigzag from (r0, column 2) towards (r1, column 25).

    Along the tilted axis the teeth peak every 2 * a = 4 px, alternating +-b = 2 px across it; the
    last, partial tooth ends on the axis end with the reference's shortened offset.
    """
    a = b = 2.0
    c0, c1 = 2, 25
    theta = np.arctan((r1 - r0) / (c1 - c0))
    length = (c1 - c0) / np.cos(theta)
    teeth = int((length - a) // (2 * a)) + 1
    along = [0.0] + [(2 * k + 1) * a for k in range(teeth)]
    across = [0.0] + [b * (-1) ** k for k in range(teeth)]
    full = 2 * a * (length // (2 * a))
    if length != full:
        along.append(length)
        across.append(across[-1] / (2 * (length - full)))
    along_, across_ = np.array(along), np.array(across)
    cols = c0 + along_ * np.cos(theta) - across_ * np.sin(theta)
    rows = r0 + along_ * np.sin(theta) + across_ * np.cos(theta)
    return np.rint(np.stack([rows, cols], axis=1)).astype(np.int64)


def _zigzag(batch: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """A zigzag from column 2 to 25 starting at a random row in [0, 26], tilted towards r0 + U{-5..4}."""
    u = np.stack([rng.random(2) for _ in range(len(batch))])
    starts = np.floor(u[:, 0] * (SIDE - 1)).astype(np.int64)
    tilts = np.floor(u[:, 1] * 10).astype(np.int64) - 5
    out = _unit(batch)
    for i, (r0, tilt) in enumerate(zip(starts, tilts, strict=True)):
        canvas = np.zeros((SIDE, SIDE))
        v = _zigzag_vertices(int(r0), int(r0 + tilt))
        for (ra, ca), (rb, cb) in zip(v[:-1], v[1:], strict=True):
            _canvas_add(canvas, *draw.line_aa(ra, ca, rb, cb))
        out[i] += canvas
    return _to_uint8(np.clip(out, 0, 1))


def _canny_edges(batch: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    return np.stack([feature.canny(xi) for xi in _unit(batch)]).astype(np.uint8) * np.uint8(255)


_BATCH: dict[str, Corruption] = {
    "identity": _identity,
    "shot_noise": _shot_noise,
    "impulse_noise": _impulse_noise,
    "glass_blur": _glass_blur,
    "motion_blur": _motion_blur,
    "shear": _shear,
    "scale": _scale,
    "rotate": _rotate,
    "brightness": _brightness,
    "translate": _translate,
    "stripe": _stripe,
    "spatter": _spatter,
    "dotted_line": _dotted_line,
    "zigzag": _zigzag,
    "canny_edges": _canny_edges,
}

SEVERITY_FREE = frozenset({"identity", "stripe", "dotted_line", "zigzag", "canny_edges"})  # ignore severity


# ---- public API --------------------------------------------------------------------------------


def _check(name: str, severity: int) -> Corruption:
    if name not in _BATCH:
        raise ValueError(f"unknown corruption {name!r}; valid: {', '.join(_BATCH)}")
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or not 1 <= severity <= 5:
        raise ValueError(f"corruption severity must be an integer in 1..5, got {severity!r}")
    return _BATCH[name]


def _single(name: str) -> Corruption:
    def fn(image: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
        return corrupt(np.asarray(image)[None], name, severity, rng)[0]

    fn.__name__ = name
    fn.__doc__ = f"{name} on one 28x28 uint8 image; see `corrupt`."
    return fn


CORRUPTIONS: dict[str, Corruption] = {name: _single(name) for name in _BATCH}


def corrupt(images: np.ndarray, name: str, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Apply corruption `name` at `severity` (1..5) to each image of (n, 28, 28) or (n, 1, 28, 28) uint8.

    Returns a new array of the same shape and dtype. Each image gets its own random draws from
    `rng`, taken in image order.
    """
    fn = _check(name, severity)
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.shape[-2:] != (SIDE, SIDE) or images.ndim not in (3, 4):
        raise ValueError(
            f"expected (n, 28, 28) or (n, 1, 28, 28) uint8 images, got {images.shape} {images.dtype}"
        )
    if images.ndim == 4 and images.shape[1] != 1:
        raise ValueError(f"expected one channel, got shape {images.shape}")
    flat = images.reshape(-1, SIDE, SIDE)
    return fn(flat, int(severity), rng).reshape(images.shape)
