"""Backward warping by a displacement field: ``out(x) = image(x + d(x))``.

Conventions (docs/maths.md §3 and §6): positions and displacements are in pixels,
array-axis order (row, col[, ...]); ``warp(moving, d)`` makes ``fixed(x) ≈ moving(x + d(x))``
(``skimage.registration.optical_flow_tvl1``'s convention, and MONAI ``Warp``'s). Boundaries
use SciPy's names (:mod:`._sampling`); the engine is ``torch.nn.functional.grid_sample``.
"""

from __future__ import annotations

import torch

from ._numerics import compute_dtype
from ._padding import check_padding
from ._sampling import INTERPOLATIONS, WARP_PADDINGS, sample_displaced
from ._validation import check_batches, check_choice, check_displacement, check_image


def check_warp_modes(interpolation: str, padding: str, spatial_dims: int) -> str:
    """Validate a warp's interpolation and padding; returns the padding (SciPy's name)."""
    check_choice(interpolation, "interpolation", INTERPOLATIONS)
    padding = check_padding(padding, WARP_PADDINGS)
    if interpolation == "cubic" and spatial_dims != 2:
        raise ValueError(
            f"interpolation='cubic' is only available in 2D (grid_sample has no tricubic); "
            f"got a {spatial_dims}D image, use interpolation='linear'"
        )
    return padding


def warp(
    image: torch.Tensor,
    displacement: torch.Tensor,
    *,
    interpolation: str = "linear",
    padding: str = "nearest",
) -> torch.Tensor:
    """Backward-warp ``image`` by a displacement field: ``out(x) = image(x + d(x))``.

    Parameters
    ----------
    image : Tensor, shape ``(N, C, *S)`` with ``len(S)`` 2 or 3
        Floating point; float16/bfloat16 are computed in float32.
    displacement : Tensor, shape ``(N or 1, D, *S)``, ``D = len(S)``
        In pixels, array-axis order: ``displacement[:, 0]`` moves along rows (axis 0 of
        ``S``), ``displacement[:, -1]`` along columns. A batch of 1 is applied to every
        image of the batch; an image batch of 1 is warped by every field of the batch.
    interpolation : {"nearest", "linear", "cubic"}
        "linear" is bilinear/trilinear. "cubic" (2D only) is ``grid_sample``'s bicubic,
        the Keys convolution kernel with ``a = -0.75`` (not SciPy's B-spline ``order=3``).
    padding : {"nearest", "grid-constant", "mirror", "reflect"}
        Values outside the image, with SciPy's names: the edge pixel repeated (default),
        zero pixels interpolated with the edge ones, mirrored about the edge pixels'
        centers, or about their outer borders (half-sample symmetric).

    Returns
    -------
    Tensor, shape ``(max(N, N_d), C, *S)``, ``image``'s dtype, on its device.
    Differentiable with respect to ``image`` and ``displacement`` (the displacement
    gradient is zero for "nearest" interpolation).
    """
    check_image(image, "image")
    spatial = tuple(image.shape[2:])
    check_displacement(displacement, spatial, like=image)
    check_batches(image.shape[0], displacement.shape[0], "image", "displacement")
    padding = check_warp_modes(interpolation, padding, len(spatial))

    dtype = torch.promote_types(compute_dtype(image.dtype), compute_dtype(displacement.dtype))
    out = sample_displaced(
        image.to(dtype), displacement.to(dtype), interpolation=interpolation, padding=padding
    )
    return out.to(image.dtype)
