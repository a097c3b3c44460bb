"""LayerCFL's rotation clusters (docs/algorithms/partitions.md#layercfls-partitions-dominant-and-rotation): the images of client group c rotated by
c * 360 / K degrees. Multiples of 90 degrees are exact (``np.rot90``); other angles are resampled by
scipy (bilinear, same size, zeros outside). Only the clients' data (training and local test splits)
is rotated; the global test set is not, so a cluster model's ``accuracy`` is its 0-degree accuracy:
read ``local_accuracy`` for rotated groups."""

from __future__ import annotations

import numpy as np


def group_angle(group: int, groups: int) -> float:
    return group * 360.0 / groups


def rotate(x: np.ndarray, degrees: float) -> np.ndarray:
    """Images (..., H, W) rotated counter-clockwise by ``degrees``, same shape and dtype."""
    quarter, rest = divmod(float(degrees), 90.0)
    if rest == 0.0:
        return np.ascontiguousarray(np.rot90(x, k=int(quarter) % 4, axes=(-2, -1)))
    from scipy import ndimage  # imported where used (start-up time)

    out = ndimage.rotate(
        x.astype(np.float32), degrees, axes=(-1, -2), reshape=False, order=1, mode="constant"
    )
    if np.issubdtype(x.dtype, np.integer):
        info = np.iinfo(x.dtype)
        out = np.clip(np.rint(out), info.min, info.max)
    return out.astype(x.dtype)


def rotated_arrays(
    x: np.ndarray, y: np.ndarray, parts: list[np.ndarray], groups: np.ndarray, num_groups: int
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Each client's samples copied, rotated by its group's angle, laid out client after client.
    Returns (x, y, each client's range of positions)."""
    xs, ys, ranges, start = [], [], [], 0
    for idx, g in zip(parts, groups, strict=True):
        xs.append(rotate(x[idx], group_angle(int(g), num_groups)))
        ys.append(y[idx])
        ranges.append(np.arange(start, start + len(idx), dtype=np.int64))
        start += len(idx)
    return np.concatenate(xs), np.concatenate(ys), ranges
