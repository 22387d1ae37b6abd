"""Multi-resolution pyramids whose levels share one normalized coordinate frame.

Every level covers the same field of view (pixel-center convention, as
``F.interpolate(..., align_corners=False)`` and ``F.grid_sample(..., align_corners=False)``
use it), so a transform held in full-resolution pixels converts to any level exactly:
a pixel ``x`` of a level of shape ``s`` is the normalized point ``u = (2x + 1) / s - 1``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..ops._padding import pad_spatial
from ..ops._reference import correlate
from ..ops._windows import gaussian_kernel1d


def auto_levels(shape, min_size: int | None = None, max_levels: int = 5) -> int:
    """How many levels keep the coarsest level's smallest side at least ``min_size``
    (32 in 2-D, 16 in 3-D by default)."""
    if min_size is None:
        min_size = 32 if len(shape) == 2 else 16
    levels = 1
    smallest = min(shape)
    while levels < max_levels and smallest / 2**levels >= min_size:
        levels += 1
    return levels


def level_shapes(shape, levels: int) -> list[tuple[int, ...]]:
    """Spatial shapes from coarsest to finest; each halves the next (rounded, at least 1)."""
    return [tuple(max(1, round(n / 2**k)) for n in shape) for k in reversed(range(levels))]


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of ``(N, C, *S)`` over every spatial axis (edge-replicated).

    Taps ``exp(-t²/2σ²)`` out to ``3σ`` (at most the axis length - 1), normalized; axes of
    length 1 are left alone. The window pass is the operators' ``correlate`` primitive.
    """
    if sigma <= 0:
        return x
    taps, pads = [], []
    for n in x.shape[2:]:
        radius = min(max(1, math.ceil(3 * sigma)), n - 1)
        taps.append(gaussian_kernel1d(2 * radius + 1, sigma) if radius > 0 else [1.0])
        pads.append((radius, radius))
    return correlate(pad_spatial(x, pads, mode="nearest"), taps)


def resize(x: torch.Tensor, shape) -> torch.Tensor:
    """Resample ``(N, C, *S)`` to ``(N, C, *shape)`` over the same field of view."""
    if tuple(x.shape[2:]) == tuple(shape):
        return x
    mode = "bilinear" if x.dim() == 4 else "trilinear"
    return F.interpolate(x, size=tuple(shape), mode=mode, align_corners=False)


def build_pyramid(x: torch.Tensor, shapes) -> list[torch.Tensor]:
    """Images for each shape in ``shapes`` (coarse → fine), anti-aliased before shrinking.

    Each level blurs the finer one with σ = 0.5 · (shrink factor) pixels before resampling
    (the usual choice for a factor-2 pyramid: enough to stop aliasing, little loss of
    detail), so coarse levels see a smooth, low-noise image.
    """
    out = [x]
    current = x
    for shape in reversed(list(shapes)[:-1]):
        factor = max(c / s for c, s in zip(current.shape[2:], shape))
        current = resize(gaussian_blur(current, 0.5 * factor), shape)
        out.append(current)
    return out[::-1]
