"""Splatting written the plain way (index_add per corner, gradients by autograd): an
independent oracle for the hand-written forward and backward of ``ops.splat``."""

from __future__ import annotations

import itertools
import math

import torch


def splat_plain(image, displacement, normalize=True, eps=1e-6):
    """Straightforward splatting with plain autograd, for tests and benchmarks.

    ``index_add`` into flat buffers per corner, with the gradient left to autograd (no
    custom Function). image ``(N, C, *S)``, displacement ``(N, D, *S)``; returns
    ``(out (N, C, *S), den (N, 1, *S))``.
    """
    n, c, *spatial = image.shape
    size = math.prod(spatial)
    grids = torch.meshgrid(
        *[torch.arange(s, device=image.device, dtype=image.dtype) for s in spatial], indexing="ij"
    )
    positions = [(displacement[:, k] + grids[k]).reshape(n, size) for k in range(len(spatial))]
    floors = [torch.floor(p) for p in positions]
    fracs = [p - f for p, f in zip(positions, floors)]
    batch = torch.arange(n, device=image.device).view(n, 1) * size
    values = image.reshape(n, c, size).permute(0, 2, 1).reshape(n * size, c)
    num = image.new_zeros(n * size + 1, c)
    den = image.new_zeros(n * size + 1)
    for bits in itertools.product((0, 1), repeat=len(spatial)):
        weight = torch.ones_like(fracs[0])
        flat = torch.zeros_like(batch).expand(n, size)
        inside = torch.ones_like(fracs[0], dtype=torch.bool)
        for k, b in enumerate(bits):
            weight = weight * (fracs[k] if b else 1 - fracs[k])
            coord = floors[k] + b
            inside = inside & (coord >= 0) & (coord <= spatial[k] - 1)
            flat = flat + coord.clamp(0, spatial[k] - 1).long() * math.prod(spatial[k + 1 :])
        index = torch.where(inside, flat + batch, n * size).reshape(-1)
        num = num.index_add(0, index, values * weight.reshape(-1, 1))
        den = den.index_add(0, index, weight.reshape(-1))
    num = num[:-1].reshape(n, size, c).permute(0, 2, 1).reshape(image.shape)
    den = den[:-1].reshape(n, 1, *spatial)
    landed = den > eps
    if normalize:
        out = torch.where(landed, num / torch.where(landed, den, torch.ones_like(den)), 0.0)
    else:
        out = torch.where(landed, num, 0.0)
    return out, den
