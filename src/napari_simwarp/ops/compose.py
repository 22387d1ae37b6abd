"""Composition of displacement fields (docs/maths.md §8.1)."""

from __future__ import annotations

import torch

from ._numerics import compute_dtype
from ._sampling import sample_displaced
from ._validation import check_displacement, check_field


def compose(d1: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
    """The displacement of warping by ``d1`` and then warping the result by ``d2``.

    With ``y = x + d2(x)``, the composite maps ``x ↦ y + d1(y)``; that is
    ``compose(d1, d2)(x) = d2(x) + d1(x + d2(x))`` and ``φ_compose = φ_d1 ∘ φ_d2``.
    It is the field for which ``warp(image, compose(d1, d2)) ≈ warp(warp(image, d1), d2)``
    (one resampling instead of two). In registration: if ``d1`` aligns ``moving`` to
    ``fixed`` coarsely and ``d2`` aligns ``fixed`` to ``warp(moving, d1)``, then
    ``compose(d1, d2)`` aligns ``moving`` to ``fixed``. ``d1(x + d2(x))`` is interpolated
    linearly, with ``d1``'s edge values beyond the border.

    Parameters
    ----------
    d1 : Tensor, shape ``(N or 1, D, *S)``
        Applied to the image first. Pixels, array-axis order.
    d2 : Tensor, shape ``(N or 1, D, *S)``
        Applied second. Either batch may be 1 and is then shared by the other's.

    Returns
    -------
    Tensor, shape ``(max(N1, N2), D, *S)``, ``d1``'s dtype.
    """
    check_field(d1, "d1")
    check_displacement(d2, tuple(d1.shape[2:]), name="d2", like=d1, like_name="d1")
    if d1.shape[0] != d2.shape[0] and 1 not in (d1.shape[0], d2.shape[0]):
        raise ValueError(
            f"d1 and d2 batch sizes must match or be 1, got {d1.shape[0]} and {d2.shape[0]}"
        )
    dtype = torch.promote_types(compute_dtype(d1.dtype), compute_dtype(d2.dtype))
    a, b = d1.to(dtype), d2.to(dtype)
    return (b + resample_field(a, b)).to(d1.dtype)


def resample_field(field: torch.Tensor, displacement: torch.Tensor) -> torch.Tensor:
    """``field(x + displacement(x))``, both ``(N or 1, D, *S)`` in one compute dtype.

    Linear interpolation with the edge values beyond the border ("nearest"): a field is
    extended by its edge values rather than by zero motion.
    """
    return sample_displaced(field, displacement, interpolation="linear", padding="nearest")
