"""Multi-resolution pyramids whose levels share one normalised coordinate frame.

Every level covers the same field of view (pixel-centre convention, as
``F.interpolate(..., align_corners=False)`` and ``F.grid_sample(..., align_corners=False)``
use it), so a transform held in full-resolution pixels converts to any level exactly:
a pixel ``x`` of a level of shape ``s`` is the normalised point ``u = (2x + 1) / s - 1``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def auto_levels(shape, min_size: int | None = None, max_levels: int = 5) -> int:
    """How many levels keep the coarsest level's smallest side at least ``min_size``
    (32 in 2-D, 16 in 3-D by default)."""
    if min_size is None:
        min_size = 32 if len(shape) == 2 else 16
    levels = 1
    smallest = min(shape)
    while levels < max_levels and smallest / 2 ** levels >= min_size:
        levels += 1
    return levels


def level_shapes(shape, levels: int) -> list[tuple[int, ...]]:
    """Spatial shapes from coarsest to finest; each halves the next (rounded, at least 1)."""
    return [tuple(max(1, int(round(n / 2**k))) for n in shape) for k in reversed(range(levels))]


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of ``(N, C, *S)`` over every spatial axis (edge-replicated).

    Taps are applied as shifted multiply-adds over views rather than ``conv2d``: on CPU,
    single-channel convolutions run several times slower than a few fused adds.
    """
    if sigma <= 0:
        return x
    d = x.dim() - 2
    out = x
    for axis in range(d):
        dim = 2 + axis
        n = out.shape[dim]
        if n == 1:
            continue
        radius = min(max(1, int(math.ceil(3 * sigma))), n - 1)
        taps = [math.exp(-0.5 * (t / sigma) ** 2) for t in range(-radius, radius + 1)]
        total = math.fsum(taps)
        first = out.narrow(dim, 0, 1).expand(*out.shape[:dim], radius, *out.shape[dim + 1:])
        last = out.narrow(dim, n - 1, 1).expand_as(first)
        padded = torch.cat([first, out, last], dim=dim)
        acc = padded.narrow(dim, 0, n) * (taps[0] / total)
        for j in range(1, len(taps)):
            acc.add_(padded.narrow(dim, j, n), alpha=taps[j] / total)
        out = acc
    return out


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
