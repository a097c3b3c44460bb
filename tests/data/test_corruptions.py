"""FashionMNIST-C corruptions (docs/algorithms/mixture.md#the-fmnist-c-benchmark): contracts, determinism, and hand-checkable facts."""

from __future__ import annotations

import numpy as np
import pytest
from skimage import draw

from fedray.data.corruptions import CORRUPTIONS, SEVERITY_FREE, corrupt

NAMES = sorted(CORRUPTIONS)
CHANGING = [n for n in NAMES if n != "identity"]
RANDOM = [
    "shot_noise",
    "impulse_noise",
    "glass_blur",
    "motion_blur",
    "shear",
    "rotate",
    "translate",
    "spatter",
    "dotted_line",
    "zigzag",
]


def shapes(n: int = 16, seed: int = 0, low: int = 0) -> np.ndarray:
    """Garment-like test images: a filled ellipse plus a bar, varied sizes and grays, black background."""
    g = np.random.default_rng(seed)
    out = np.full((n, 28, 28), low, dtype=np.uint8)
    for img in out:
        rr, cc = draw.ellipse(
            g.uniform(11, 16),
            g.uniform(11, 16),
            g.uniform(6, 10),
            g.uniform(4, 8),
            shape=img.shape,
            rotation=g.uniform(0, np.pi),
        )
        img[rr, cc] = g.integers(120, 230)
        rr, cc = draw.rectangle((g.integers(5, 9), g.integers(8, 12)), extent=(3, 8), shape=img.shape)
        img[rr, cc] = g.integers(60, 200)
    return out


def blob(radii: tuple[float, float] = (5, 3), value: int = 200) -> np.ndarray:
    """One elongated ellipse at the centre, far from the border: geometric checks stay exact."""
    img = np.zeros((28, 28), dtype=np.uint8)
    rr, cc = draw.ellipse(13.5, 13.5, *radii, shape=img.shape)
    img[rr, cc] = value
    return img


def centre_of_mass(img: np.ndarray) -> np.ndarray:
    w = img.astype(np.float64)
    r, c = np.indices(img.shape)
    return np.array([(w * r).sum(), (w * c).sum()]) / w.sum()


def test_all_fifteen_registered():
    assert len(NAMES) == 15
    assert SEVERITY_FREE <= set(NAMES)


@pytest.mark.parametrize("name", CHANGING)
@pytest.mark.parametrize("severity", [1, 2, 3, 4, 5])
def test_changes_image_and_keeps_dtype_and_shape(name, severity):
    imgs = shapes()
    before = imgs.copy()
    out = corrupt(imgs, name, severity, np.random.default_rng(1))
    assert out.dtype == np.uint8 and out.shape == imgs.shape
    assert np.array_equal(imgs, before), "input modified in place"
    assert (out != imgs).any()


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_and_batch_equals_one_by_one(name):
    imgs = shapes(8)
    a = corrupt(imgs, name, 3, np.random.default_rng(7))
    assert np.array_equal(a, corrupt(imgs, name, 3, np.random.default_rng(7)))
    rng = np.random.default_rng(7)
    one_by_one = np.stack([CORRUPTIONS[name](img, 3, rng) for img in imgs])
    assert np.array_equal(a, one_by_one)


@pytest.mark.parametrize("name", RANDOM)
def test_other_seed_differs(name):
    imgs = shapes(8)
    a = corrupt(imgs, name, 3, np.random.default_rng(7))
    assert not np.array_equal(a, corrupt(imgs, name, 3, np.random.default_rng(8)))


@pytest.mark.parametrize("name", ["scale", "brightness", "stripe", "canny_edges", "identity"])
def test_deterministic_ones_ignore_the_seed(name):
    imgs = shapes(4)
    assert np.array_equal(
        corrupt(imgs, name, 2, np.random.default_rng(0)), corrupt(imgs, name, 2, np.random.default_rng(1))
    )


def test_channel_axis_shape_is_kept():
    imgs = shapes(4)
    out = corrupt(imgs[:, None], "shear", 2, np.random.default_rng(0))
    assert out.shape == (4, 1, 28, 28) and out.dtype == np.uint8
    assert np.array_equal(out[:, 0], corrupt(imgs, "shear", 2, np.random.default_rng(0)))


def test_bad_name_and_severity_raise():
    imgs, rng = shapes(2), np.random.default_rng(0)
    with pytest.raises(ValueError, match="unknown corruption 'fog'.*shot_noise"):
        corrupt(imgs, "fog", 3, rng)
    for bad in (0, 6, -1, 2.5, True):
        with pytest.raises(ValueError, match="severity"):
            corrupt(imgs, "rotate", bad, rng)
    with pytest.raises(ValueError, match="severity"):
        CORRUPTIONS["stripe"](imgs[0], 9, rng)
    with pytest.raises(ValueError, match="uint8"):
        corrupt(imgs.astype(np.float32), "rotate", 1, rng)


def test_identity_returns_input_unchanged():
    imgs = shapes(4)
    out = corrupt(imgs, "identity", 5, np.random.default_rng(0))
    assert np.array_equal(out, imgs) and out is not imgs


def test_stripe_inverts_exactly_the_outer_columns():
    imgs = shapes(4)
    out = corrupt(imgs, "stripe", 1, np.random.default_rng(0))
    outer = np.r_[0:7, 21:28]
    assert np.array_equal(out[..., outer], 255 - imgs[..., outer])
    assert np.array_equal(out[..., 7:21], imgs[..., 7:21])


@pytest.mark.parametrize("severity", [1, 2, 3, 4, 5])
def test_translate_moves_centre_of_mass_by_severity(severity):
    img = blob()
    out = corrupt(np.stack([img] * 6), "translate", severity, np.random.default_rng(severity))
    for o in out:
        assert o.sum() == img.sum()  # integer shift: nothing resampled, nothing cut off
        np.testing.assert_allclose(
            np.abs(centre_of_mass(o) - centre_of_mass(img)), [severity, severity], atol=1e-9
        )


def test_brightness_raises_the_mean_with_severity():
    imgs = shapes(8)
    means = [imgs.mean()] + [
        corrupt(imgs, "brightness", s, np.random.default_rng(0)).mean() for s in range(1, 6)
    ]
    assert all(a < b for a, b in zip(means, means[1:], strict=False))
    # gray in HSV: value += c, so the black background becomes c * 255
    out = corrupt(imgs, "brightness", 2, np.random.default_rng(0))
    assert np.all(out[imgs == 0] == 51)


@pytest.mark.parametrize("severity,amount", [(1, 0.03), (3, 0.09), (5, 0.27)])
def test_impulse_noise_changes_about_amount_of_pixels(severity, amount):
    imgs = shapes(60, low=30)  # no pixel is 0 or 255, so every salt or pepper hit shows
    out = corrupt(imgs, "impulse_noise", severity, np.random.default_rng(0))
    changed = out != imgs
    assert abs(changed.mean() - amount) < 0.01
    assert set(np.unique(out[changed])) <= {0, 255}


@pytest.mark.parametrize("severity", [1, 3, 5])
def test_rotate_keeps_mass_and_centre(severity):
    img = blob((7, 3))
    out = corrupt(np.stack([img] * 4), "rotate", severity, np.random.default_rng(0))
    for o in out:
        assert abs(o.sum() / img.sum() - 1) < 0.03
        np.testing.assert_allclose(centre_of_mass(o), centre_of_mass(img), atol=0.2)
        assert not np.array_equal(o, img)


@pytest.mark.parametrize("severity,factor", [(1, 0.9), (3, 0.7), (5, 0.5)])
def test_scale_shrinks_content_about_the_centre(severity, factor):
    img = blob((10, 6))
    out = corrupt(img[None], "scale", severity, np.random.default_rng(0))[0]
    assert abs(out.sum() / img.sum() - factor**2) < 0.05
    np.testing.assert_allclose(centre_of_mass(out), centre_of_mass(img), atol=0.2)


def test_shear_directions_mirror_each_other():
    img = blob((10, 6))  # symmetric about column 13.5, so shearing by -c is the mirror image of +c
    outs = corrupt(np.stack([img] * 12), "shear", 4, np.random.default_rng(0))
    kinds = {o.tobytes(): o for o in outs}
    assert len(kinds) == 2  # one image per shear direction
    a, b = kinds.values()
    assert np.abs(a.astype(int) - b[:, ::-1]).max() <= 1


@pytest.mark.parametrize("severity", [1, 5])
def test_motion_blur_kernel_is_normalised(severity):
    flat = np.full((3, 28, 28), 140, dtype=np.uint8)
    assert np.array_equal(corrupt(flat, "motion_blur", severity, np.random.default_rng(0)), flat)


def test_canny_edges_are_binary():
    out = corrupt(shapes(4), "canny_edges", 1, np.random.default_rng(0))
    assert set(np.unique(out)) == {0, 255}


def test_lines_only_brighten():
    imgs = shapes(8)
    for name in ("dotted_line", "zigzag"):
        out = corrupt(imgs, name, 1, np.random.default_rng(0))
        assert np.all(out >= imgs)
    dotted = corrupt(np.zeros((8, 28, 28), np.uint8), "dotted_line", 1, np.random.default_rng(0))
    gaps = (np.arange(28) // 2) % 2 == 0
    assert not dotted[..., gaps].any() and dotted[..., ~gaps].any()
