"""Exponential of a stationary velocity field by scaling and squaring (docs/maths.md §8.3)."""

from __future__ import annotations

import torch

from ._numerics import compute_dtype
from ._validation import check_field
from .compose import resample_field


def integrate_velocity(v: torch.Tensor, steps: int = 7) -> torch.Tensor:
    """The displacement of the flow of a stationary velocity field, by scaling and squaring.

    ``φ = exp(v)``: start from ``u = v / 2**steps`` (a displacement small enough to be
    its own exponential to first order) and compose it with itself ``steps`` times,
    ``u ← compose(u, u)``. For a smooth ``v`` the result is a diffeomorphism: its
    Jacobian determinant stays positive. A constant ``v`` integrates to itself.

    Parameters
    ----------
    v : Tensor, shape ``(N, D, *S)``
        Velocity in pixels per unit time, array-axis order.
    steps : int
        Squarings (0 returns ``v``); 7 is the usual choice (``2**7 = 128`` sub-steps).

    Returns
    -------
    Tensor, shape ``(N, D, *S)``, ``v``'s dtype. Differentiable with respect to ``v``.
    """
    check_field(v, "v")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")
    u = v.to(compute_dtype(v.dtype)) / (2**steps)
    for _ in range(steps):
        u = u + resample_field(u, u)
    return u.to(v.dtype)
