"""Jacobian determinant of the map ``x ↦ x + d(x)`` (docs/maths.md §8.4)."""

from __future__ import annotations

import torch

from ._numerics import compute_dtype
from ._validation import check_field


def _partial(component: torch.Tensor, axis: int) -> torch.Tensor:
    """``∂component/∂x_axis`` on ``(N, *S)``: central differences, one-sided at the edges."""
    dim = axis + 1
    if component.shape[dim] == 1:
        return torch.zeros_like(component)
    return torch.gradient(component, dim=dim)[0]


def jacobian_determinant(d: torch.Tensor) -> torch.Tensor:
    """``det(I + ∇d)``: the local volume change of the map ``x ↦ x + d(x)``.

    Positive everywhere for an invertible (non-folding) map; below 1 where the warp
    shrinks the sampled region. Derivatives are central differences (one-sided at the
    edges; zero along axes of length 1), exact for affine fields.

    Parameters
    ----------
    d : Tensor, shape ``(N, D, *S)``
        Pixels, array-axis order.

    Returns
    -------
    Tensor, shape ``(N, 1, *S)``, ``d``'s dtype. Differentiable with respect to ``d``.
    """
    check_field(d, "d")
    field = d.to(compute_dtype(d.dtype))
    dims = field.shape[1]
    # J[i][j] = δ_ij + ∂d_i/∂x_j, as (N, *S) maps.
    jac = [
        [_partial(field[:, i], j) + (1.0 if i == j else 0.0) for j in range(dims)]
        for i in range(dims)
    ]
    if dims == 2:
        det = jac[0][0] * jac[1][1] - jac[0][1] * jac[1][0]
    else:
        det = (
            jac[0][0] * (jac[1][1] * jac[2][2] - jac[1][2] * jac[2][1])
            - jac[0][1] * (jac[1][0] * jac[2][2] - jac[1][2] * jac[2][0])
            + jac[0][2] * (jac[1][0] * jac[2][1] - jac[1][1] * jac[2][0])
        )
    return det.unsqueeze(1).to(d.dtype)
