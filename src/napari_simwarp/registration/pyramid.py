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


def shrink_factors(spacing, level: int, unit: float | None = None) -> tuple[float, ...]:
    """How much each axis shrinks ``level`` levels above the finest (per axis, >= 1).

    A level's target pixel size is ``unit · 2^level`` (``unit``: the finest pixel size,
    by default ``min(spacing)``); an axis shrinks only once the target exceeds its own
    pixel size. The finest axes of an anisotropic volume are thus halved first, until the
    voxels are near-isotropic, then all together: the rule of ANTs and elastix. With equal
    spacings every axis halves at every level.
    """
    unit = min(spacing) if unit is None else unit
    return tuple(max(1.0, 2.0**level * unit / s) for s in spacing)


def auto_levels(shape, min_size: int | None = None, max_levels: int = 5, spacing=None) -> int:
    """How many levels keep every shrunk axis of the coarsest level at least ``min_size``
    pixels (32 in 2-D, 16 in 3-D by default); ``spacing`` (per axis) as in
    :func:`shrink_factors`. An axis that never shrinks (a short z of a thick-sliced
    volume) does not limit the pyramid."""
    if min_size is None:
        min_size = 32 if len(shape) == 2 else 16
    spacing = (1.0,) * len(shape) if spacing is None else tuple(spacing)
    levels = 1
    while levels < max_levels:
        factors = shrink_factors(spacing, levels)
        if any(f > 1 and n / f < min_size for n, f in zip(shape, factors)):
            break
        levels += 1
    return levels


def level_shapes(shape, levels: int, spacing=None, unit=None) -> list[tuple[int, ...]]:
    """Spatial shapes from coarsest to finest: axis ``a`` of the level ``k`` steps above
    the finest is ``round(n_a / f_a)`` (at least 1), ``f`` from :func:`shrink_factors`
    (every axis halves per level without ``spacing``)."""
    spacing = (1.0,) * len(shape) if spacing is None else tuple(spacing)
    out = []
    for k in reversed(range(levels)):
        factors = shrink_factors(spacing, k, unit)
        out.append(tuple(max(1, round(n / f)) for n, f in zip(shape, factors)))
    return out


def level_anisotropy(spacing, full_shape, shape) -> tuple[float, ...]:
    """Each axis's nominal pixel size at a pyramid level of ``shape``, over the level's
    finest (>= 1 per axis; all 1 for an isotropic level).

    Nominal: from :func:`shrink_factors` at the level whose finest axis shrank by the
    power of two nearest ``full / level`` size, so the rounding of level shapes (a 50-px
    axis becomes 13 px, not 12.5) does not make an isotropic level look anisotropic.
    """
    unit = min(spacing)
    finest = min(range(len(spacing)), key=lambda a: spacing[a])
    level = max(0, round(math.log2(full_shape[finest] / shape[finest])))
    target = unit * 2.0**level
    return tuple(max(1.0, s / target) for s in spacing)


def gaussian_blur(x: torch.Tensor, sigma) -> torch.Tensor:
    """Separable Gaussian blur of ``(N, C, *S)`` over every spatial axis (edge-replicated).

    ``sigma`` is one value or one per spatial axis (pixels); taps ``exp(-t²/2σ²)`` out to
    ``3σ`` (at most the axis length - 1), normalized. Axes of length 1 or ``σ <= 0`` are
    left alone. The window pass is the operators' ``correlate`` primitive.
    """
    spatial = x.shape[2:]
    sigmas = [float(sigma)] * len(spatial) if isinstance(sigma, (int, float)) else list(sigma)
    if all(s <= 0 for s in sigmas):
        return x
    taps, pads = [], []
    for n, s in zip(spatial, sigmas):
        radius = min(max(1, math.ceil(3 * s)), n - 1) if s > 0 else 0
        taps.append(gaussian_kernel1d(2 * radius + 1, s) if radius > 0 else [1.0])
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

    Each level blurs the finer one with σ = 0.5 · (shrink factor) pixels along each axis
    that shrinks (the usual choice for a factor-2 pyramid: enough to stop aliasing, little
    loss of detail), so coarse levels see a smooth, low-noise image; an axis that keeps its
    size is not blurred.
    """
    out = [x]
    current = x
    for shape in reversed(list(shapes)[:-1]):
        factors = [c / s for c, s in zip(current.shape[2:], shape)]
        sigmas = [0.5 * f if f > 1 else 0.0 for f in factors]
        current = resize(gaussian_blur(current, sigmas), shape)
        out.append(current)
    return out[::-1]
