"""Exponential of a stationary velocity field by scaling and squaring (docs/maths.md §8.3)."""

from __future__ import annotations

import torch

from ._numerics import compute_dtype
from ._validation import check_field
from .compose import resample_field

#: most squarings: 2**30 sub-steps already make the first one ~1e-9 of ``v``, below
#: float32's resolution of a pixel position; more change nothing but the risk of
#: underflow (and ``2**steps`` overflows a float beyond 1023)
MAX_STEPS = 30


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
    steps : int in ``[0, MAX_STEPS]``
        Squarings (0 returns ``v``); 7 is the usual choice (``2**7 = 128`` sub-steps).

    Returns
    -------
    Tensor, shape ``(N, D, *S)``, ``v``'s dtype. Differentiable with respect to ``v``.
    """
    check_field(v, "v")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be an int in [0, {MAX_STEPS}], got {steps!r}")
    return scaling_and_squaring(v, steps)


def scaling_and_squaring(v: torch.Tensor, steps: int) -> torch.Tensor:
    """:func:`integrate_velocity` without its input checks (the registration loop's: the
    finite check reads a value back to the host, a sync per iteration on a GPU; the
    model's own field needs none)."""
    u = v.to(compute_dtype(v.dtype)) / (2**steps)
    for _ in range(steps):
        u = u + resample_field(u, u)
    return u.to(v.dtype)
