"""Registration losses by name: each maps (fixed, warped, weight) to one loss per image.

All losses are "lower is better" and about 0 at a perfect match:
``ncc``: 1 − global ZNCC; ``lncc``: 1 − mean local NCC; ``ssim``: 1 − mean SSIM;
``mse``: mean squared difference (of images normalised to about [0, 1]).

``weight`` (``(N, 1, *S)``, 0..1, no gradient) combines the user's fixed-image mask with
the pixels whose sample fell inside the moving image, so that the border (where the warp
has to invent values) never pulls the transform.
"""

from __future__ import annotations

import torch

from . import _ops

from ._names import METRICS

_EPS = 1e-8


def _weighted_mean(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """Mean over everything but the batch axis, ``x`` ``(N, C, *S)`` → ``(N,)``."""
    dims = tuple(range(1, x.dim()))
    if weight is None:
        return x.mean(dim=dims)
    w = weight.expand_as(x)
    return (x * w).sum(dim=dims) / w.sum(dim=dims).clamp_min(_EPS)


def mse_loss(fixed, warped, weight=None, **_):
    return _weighted_mean((warped - fixed) ** 2, weight)


def ncc_loss(fixed, warped, weight=None, **_):
    # Weighted global ZNCC per (N, C); the op's unweighted form is the weight=None case.
    if weight is None:
        return 1.0 - _ops_ncc(_batched(fixed, warped), warped).mean(dim=1)
    fixed = _batched(fixed, warped)
    dims = tuple(range(2, fixed.dim()))
    w = weight.expand_as(fixed)
    wsum = w.sum(dim=dims, keepdim=True).clamp_min(_EPS)
    fa = fixed - (w * fixed).sum(dim=dims, keepdim=True) / wsum
    wb = warped - (w * warped).sum(dim=dims, keepdim=True) / wsum
    cov = (w * fa * wb).sum(dim=dims)
    var = (w * fa * fa).sum(dim=dims) * (w * wb * wb).sum(dim=dims)
    return 1.0 - (cov / torch.sqrt(var + _EPS)).mean(dim=1)


def _ops_ncc(a, b):
    """Global ZNCC per (N, C) from ``ops.ncc``, shape ``(N, C)``."""
    return _ops.ncc(a, b).reshape(a.shape[0], a.shape[1])


def _crop_like(weight, shape):
    """Centre-crop ``weight`` to a (possibly smaller, "valid") map's spatial shape."""
    if weight is None or tuple(weight.shape[2:]) == tuple(shape):
        return weight
    sl = [slice(None), slice(None)]
    for n, m in zip(weight.shape[2:], shape):
        start = (n - m) // 2
        sl.append(slice(start, start + m))
    return weight[tuple(sl)]


def _batched(fixed, warped):
    """``fixed`` broadcast to ``warped``'s batch (one reference for many moving images)."""
    return fixed if fixed.shape == warped.shape else fixed.expand_as(warped)


def lncc_loss(fixed, warped, weight=None, *, window=9, **_):
    window = min(window, *[n if n % 2 else n - 1 for n in fixed.shape[2:]])
    cc = _ops.local_ncc(_batched(fixed, warped), warped, window, reduction="none")
    return 1.0 - _weighted_mean(cc, _crop_like(weight, cc.shape[2:]))


def ssim_loss(fixed, warped, weight=None, *, window=11, **_):
    window = min(window, *[n if n % 2 else n - 1 for n in fixed.shape[2:]])
    s = _ops.ssim(_batched(fixed, warped), warped, window=window, data_range=1.0, reduction="none")
    return 1.0 - _weighted_mean(s, _crop_like(weight, s.shape[2:]))


LOSSES = {"ncc": ncc_loss, "lncc": lncc_loss, "ssim": ssim_loss, "mse": mse_loss}


def get_loss(name: str):
    """The loss function for a metric name; a ValueError names the choices."""
    if name not in LOSSES:
        raise ValueError(f"metric must be one of {', '.join(map(repr, METRICS))}, got {name!r}")
    return LOSSES[name]
