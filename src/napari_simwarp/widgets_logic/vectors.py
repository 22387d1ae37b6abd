"""Dense fields as napari Vectors data.

napari's Vectors layer takes ``(n, 2, D)`` arrays: for each vector its start position and
its projection, both in array-axis order. Dense fields are subsampled on a regular grid
before display (a 512² field is 262 144 arrows).
"""

from __future__ import annotations

import numpy as np


def field_to_vectors(
    field: np.ndarray, spacing: int = 16, scale: float = 1.0, offset: np.ndarray | None = None
) -> np.ndarray:
    """A ``(D, *S)`` field sampled every ``spacing`` pixels → ``(n, 2, D)`` float32.

    Positions are the grid points (centered in their cell); projections are
    ``scale · field`` there. ``offset`` (length D) is added to every position.
    """
    field = np.asarray(field)
    d = field.shape[0]
    if field.ndim != d + 1:
        raise ValueError(f"field must be (D, *S) with D spatial axes, got shape {field.shape}")
    positions = grid_positions(field.shape[1:], spacing)
    idx = tuple(positions.T)
    pos = positions.astype(np.float32)
    if offset is not None:
        pos = pos + np.asarray(offset, np.float32)
    vec = np.stack([c[idx] for c in field], axis=1).astype(np.float32) * float(scale)
    return np.stack([pos, vec], axis=1)


def grid_positions(shape, spacing: int = 16) -> np.ndarray:
    """The arrows' positions ``(n, D)`` int: every ``spacing`` pixels along each axis of
    ``shape``, centered in their cell."""
    spacing = max(int(spacing), 1)
    axes = [np.arange(min(spacing // 2, n - 1), n, spacing) for n in shape]
    grid = np.meshgrid(*axes, indexing="ij")
    return np.stack([g.ravel() for g in grid], axis=1)


def auto_spacing(shape, target: int = 20) -> int:
    """A grid spacing giving about ``target`` arrows along the longest axis (≥ 1).

    20 per axis (400 arrows in 2-D) stays readable on screen, and napari draws a Vectors
    layer's thumbnail with a Python loop per arrow (up to 1024) at every data change.
    """
    return max(1, round(max(shape) / target))


def normalized_scale(field: np.ndarray, length: float) -> float:
    """The factor that makes the longest vector of ``field`` ``length`` long (1 if zero)."""
    norm = float(np.sqrt((np.asarray(field, np.float64) ** 2).sum(axis=0)).max())
    return length / norm if norm > 0 else 1.0


def shifts_to_vectors(shifts: np.ndarray, shape) -> np.ndarray:
    """Per-frame translations ``(T, D)`` → one arrow per frame at the frame center.

    Returns ``(T, 2, D + 1)``: position ``(t, *center)``, projection ``(0, *shift)``, so
    each frame of a time-lapse shows its own drift arrow.
    """
    shifts = np.asarray(shifts, np.float32)
    t = shifts.shape[0]
    center = (np.asarray(shape, np.float32) - 1) / 2
    pos = np.concatenate(
        [np.arange(t, dtype=np.float32)[:, None], np.broadcast_to(center, (t, len(center)))], axis=1
    )
    vec = np.concatenate([np.zeros((t, 1), np.float32), shifts], axis=1)
    return np.stack([pos, vec], axis=1)
