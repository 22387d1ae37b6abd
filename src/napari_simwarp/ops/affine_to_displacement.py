"""The displacement field of an affine: ``d(x) = A x + t - x`` (docs/maths.md §8.5)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._numerics import compute_dtype
from ._sampling import affine_coordinates
from ._validation import check_matrix


def affine_to_displacement(
    matrix, shape: Sequence[int], *, dtype=None, device=None
) -> torch.Tensor:
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
    # check_matrix validates against an image's dimensions and device: a stand-in suffices.
    like = torch.empty((1, 1) + (1,) * len(spatial), device=device)
    batched = check_matrix(matrix, like)
    out_dtype = dtype if dtype is not None else batched.dtype
    work = batched.to(compute_dtype(batched.dtype))
    # A x + t - x = (A - I) x + t: one pass over the grid instead of subtracting one.
    d = len(spatial)
    identity = torch.zeros_like(work)
    identity[:, :d, :d] = torch.eye(d, dtype=work.dtype, device=work.device)
    return affine_coordinates(work - identity, spatial).to(out_dtype)
