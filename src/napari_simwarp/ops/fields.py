"""Operations on displacement fields: composition, inversion, exponentiation, Jacobians.

A displacement ``d`` is a tensor ``(N, D, *S)`` in pixels, array-axis order, standing for
the coordinate map ``φ_d(x) = x + d(x)`` that a backward warp samples through:
``warp(image, d)(x) = image(φ_d(x))`` (SPEC §6). Every function here is differentiable
(built from :func:`napari_simwarp.ops.warp` and elementwise torch), works in 2D and 3D,
computes float16/bfloat16 in float32 and returns the input's dtype. Displacements are
resampled with linear interpolation and "border" padding, which extends a field by its
edge values rather than by zero motion.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._validation import check_image, check_same_device, compute_dtype
from .warp import _as_matrix, affine_coordinates, check_displacement, sample_displaced


def _check_field(d, name: str) -> torch.Tensor:
    """Check a ``(N, D, *S)`` field with ``D = len(S)`` in {2, 3}; return it."""
    check_image(d, name)
    return check_displacement(d, name, tuple(d.shape[2:]))


def _resample(field: torch.Tensor, displacement: torch.Tensor) -> torch.Tensor:
    """``field(x + displacement(x))``, both ``(N or 1, D, *S)`` in the same compute dtype."""
    return sample_displaced(field, displacement, interpolation="linear", padding="border")


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
    _check_field(d1, "d1")
    check_displacement(d2, "d2", tuple(d1.shape[2:]), like=None)
    check_same_device(d1, d2, "d1", "d2")
    if d1.shape[0] != d2.shape[0] and 1 not in (d1.shape[0], d2.shape[0]):
        raise ValueError(f"d1 and d2 batch sizes must match or be 1, got {d1.shape[0]} and {d2.shape[0]}")
    dtype = torch.promote_types(compute_dtype(d1.dtype), compute_dtype(d2.dtype))
    a, b = d1.to(dtype), d2.to(dtype)
    return (b + _resample(a, b)).to(d1.dtype)


def invert(d: torch.Tensor, *, iterations: int = 20, tolerance: float = 1e-4) -> torch.Tensor:
    """The inverse displacement ``e`` with ``φ_e = φ_d⁻¹``, by fixed-point iteration.

    ``φ_d(φ_e(x)) = x`` means ``e(x) = -d(x + e(x))``; iterating
    ``e ← -d(x + e(x))`` from ``e = -d`` converges when the map ``e ↦ -d(x + e)`` is a
    contraction, i.e. when ``d``'s Jacobian ``∇d`` has norm below 1 (a field whose
    ``det(I + ∇d)`` stays well inside ``(0, 2)``; folding fields have no inverse).
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
        (checking it synchronises with the device once per step); 0 runs every step.

    Returns
    -------
    Tensor, shape ``(N, D, *S)``, ``d``'s dtype. Differentiable (through the steps taken).
    """
    _check_field(d, "d")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be a positive int, got {iterations!r}")
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
    field = d.to(compute_dtype(d.dtype))
    inverse = -field
    for _ in range(iterations):
        updated = -_resample(field, inverse)
        change = (updated - inverse).abs().max() if tolerance > 0 else None
        inverse = updated
        if change is not None and float(change) <= tolerance:
            break
    return inverse.to(d.dtype)


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
    _check_field(v, "v")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")
    u = v.to(compute_dtype(v.dtype)) / (2**steps)
    for _ in range(steps):
        u = u + _resample(u, u)
    return u.to(v.dtype)


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
    _check_field(d, "d")
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


def affine_to_displacement(matrix, shape: Sequence[int], *, dtype=None, device=None) -> torch.Tensor:
    """The displacement field of an affine: ``d(x) = A x + t - x``.

    ``warp(image, affine_to_displacement(matrix, S))`` equals
    ``warp_affine(image, matrix)`` (same padding and interpolation).

    Parameters
    ----------
    matrix : Tensor or array, shape ``(D + 1, D + 1)`` or ``(M, D + 1, D + 1)``
        Homogeneous, array-axis order, output (fixed) coordinates to input (moving)
        coordinates, as ``scipy.ndimage.affine_transform`` takes it; ``(D, D + 1)`` is
        also accepted. Must be finite.
    shape : sequence of int
        The field's spatial shape ``S`` (``D`` ints, 2 or 3).
    dtype : torch.dtype, optional
        The result's dtype (default: ``matrix``'s; computed in float32 at least).
    device : torch.device, optional
        Where to build the field (default: a tensor ``matrix``'s device, else CPU).

    Returns
    -------
    Tensor, shape ``(M, D, *S)`` (``M = 1`` for an unbatched matrix).
    Differentiable with respect to ``matrix``.
    """
    try:
        spatial = tuple(int(n) for n in shape)
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints, got {shape!r}") from None
    if len(spatial) not in (2, 3) or any(n <= 0 for n in spatial):
        raise ValueError(f"shape must be 2 or 3 positive ints, got {shape!r}")
    if isinstance(matrix, torch.Tensor) and device is not None:
        matrix = matrix.to(device)
    if device is None:
        device = matrix.device if isinstance(matrix, torch.Tensor) else torch.device("cpu")
    # _as_matrix validates against an image's dimensions and device: a stand-in suffices.
    like = torch.empty((1, 1) + (1,) * len(spatial), device=device)
    batched = _as_matrix(matrix, like)
    out_dtype = dtype if dtype is not None else batched.dtype
    work = batched.to(compute_dtype(batched.dtype))
    # A x + t - x = (A - I) x + t: one pass over the grid instead of subtracting one.
    d = len(spatial)
    identity = torch.zeros_like(work)
    identity[:, :d, :d] = torch.eye(d, dtype=work.dtype, device=work.device)
    return affine_coordinates(work - identity, spatial).to(out_dtype)
