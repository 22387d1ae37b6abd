"""Inversion of a displacement field by fixed-point iteration (docs/maths.md §8.2)."""

from __future__ import annotations

import torch

from ._numerics import compute_dtype
from ._validation import check_field
from .compose import resample_field


def invert(d: torch.Tensor, *, iterations: int = 20, tolerance: float = 1e-4) -> torch.Tensor:
    """The inverse displacement ``e`` with ``φ_e = φ_d⁻¹``, by fixed-point iteration.

    ``φ_d(φ_e(x)) = x`` means ``e(x) = -d(x + e(x))``; iterating
    ``e ← -d(x + e(x))`` from ``e = -d`` converges when the map ``e ↦ -d(x + e)`` is a
    contraction, i.e. when ``d``'s Jacobian ``∇d`` has norm below 1 everywhere. A positive
    ``det(I + ∇d)`` is not enough: a rotation by θ has determinant 1 but ``‖∇d‖ =
    2 sin(θ/2)``, above 1 past 60°, where the iteration does not converge (docs/maths.md
    §8.2); folding fields have no inverse at all.
    The result satisfies ``compose(d, e) ≈ 0`` (``warp(warp(image, d), e) ≈ image``) and,
    up to interpolation error, ``compose(e, d) ≈ 0``.

    Parameters
    ----------
    d : Tensor, shape ``(N, D, *S)``
        Pixels, array-axis order.
    iterations : int
        Most fixed-point steps.
    tolerance : float
        Stop once no component changes by more than this many pixels in a step
        (checking it synchronizes with the device once per step); 0 runs every step.

    Returns
    -------
    Tensor, shape ``(N, D, *S)``, ``d``'s dtype. Differentiable (through the steps taken).
    """
    check_field(d, "d")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be a positive int, got {iterations!r}")
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
    field = d.to(compute_dtype(d.dtype))
    inverse = -field
    for _ in range(iterations):
        updated = -resample_field(field, inverse)
        change = (updated - inverse).abs().max() if tolerance > 0 else None
        inverse = updated
        if change is not None and float(change) <= tolerance:
            break
    return inverse.to(d.dtype)
