"""Backward warping by a displacement field or an affine matrix, on ``grid_sample``.

Conventions (SPEC §6): positions and displacements are in pixels, array-axis order
(row, col[, ...]); a displacement ``d`` warps as ``out(x) = image(x + d(x))``, so that
``fixed(x) ≈ moving(x + d(x))`` (``skimage.registration.optical_flow_tvl1``'s
convention, and MONAI ``Warp``'s); an affine is the homogeneous matrix in array-axis order
that maps output coordinates to input coordinates (``scipy.ndimage.affine_transform``'s).

Boundary modes are ``grid_sample``'s with ``align_corners=True`` (pixel centres at the
integer positions); their SciPy equivalents for ``map_coordinates``/``affine_transform``:

========== ================ =========================================================
padding    SciPy ``mode``   outside the image
========== ================ =========================================================
"zeros"    "grid-constant"  zero-valued pixels, interpolated with the edge pixels
"border"   "nearest"        the edge pixel repeated
"reflection" "mirror"       mirrored about the edge pixels' centres (``c b | a b c | b a``)
========== ================ =========================================================

(SciPy's ``"constant"`` is *not* "zeros": it returns ``cval`` for any position outside
``[0, n - 1]`` instead of interpolating towards it; SciPy's ``"reflect"`` is half-sample
symmetric, which is ``grid_sample``'s reflection with ``align_corners=False``.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ._grid import affine_to_theta, displacement_to_grid, identity_grid, pixel_to_grid
from ._validation import check_choice, check_image, check_same_device, compute_dtype

INTERPOLATIONS = ("nearest", "linear", "cubic")
PADDINGS = ("zeros", "border", "reflection")
_GRID_SAMPLE_MODE = {"nearest": "nearest", "linear": "bilinear", "cubic": "bicubic"}


# --------------------------------------------------------------------------- checks


def _check_modes(interpolation: str, padding: str, spatial_dims: int) -> None:
    check_choice(interpolation, "interpolation", INTERPOLATIONS)
    check_choice(padding, "padding", PADDINGS)
    if interpolation == "cubic" and spatial_dims != 2:
        raise ValueError(
            f"interpolation='cubic' is only available in 2D (grid_sample has no tricubic); "
            f"got a {spatial_dims}D image, use interpolation='linear'"
        )


def _check_batches(n_image: int, n_other: int, name: str) -> None:
    if n_other != n_image and 1 not in (n_other, n_image):
        raise ValueError(
            f"{name}'s batch size ({n_other}) must be 1 or match image's ({n_image})"
        )


def check_displacement(
    displacement, name: str, spatial_shape: Sequence[int], *, like: torch.Tensor | None = None
) -> torch.Tensor:
    """Check that ``displacement`` is a floating ``(N, D, *S)`` field matching ``spatial_shape``.

    Parameters
    ----------
    displacement : object
        The value to check.
    name : str
        The argument's name, used in error messages.
    spatial_shape : sequence of int
        The expected ``S`` (``D = len(S)`` is the expected channel count).
    like : Tensor, optional
        A tensor it must share a device with (named "image" in the message).

    Returns
    -------
    Tensor: ``displacement`` itself.
    """
    d = len(spatial_shape)
    check_image(displacement, name)
    if displacement.dim() != d + 2:
        raise ValueError(
            f"{name} must be (N, {d}, *S) with {d} spatial axes like the image, got shape "
            f"{tuple(displacement.shape)}"
        )
    if displacement.shape[1] != d:
        raise ValueError(
            f"{name} must have {d} channels (one displacement component per spatial axis, "
            f"array-axis order), got {displacement.shape[1]} in shape {tuple(displacement.shape)}"
        )
    if tuple(displacement.shape[2:]) != tuple(spatial_shape):
        raise ValueError(
            f"{name}'s spatial shape {tuple(displacement.shape[2:])} must match "
            f"{tuple(spatial_shape)}"
        )
    if like is not None:
        check_same_device(like, displacement, "image", name)
    return displacement


def _as_matrix(matrix, image: torch.Tensor) -> torch.Tensor:
    """Validate an affine and return it as ``(M, D + 1, D + 1)`` (homogeneous, batched)."""
    if not isinstance(matrix, torch.Tensor):
        if isinstance(matrix, (np.ndarray, list, tuple)):
            array = np.asarray(matrix)
            if array.dtype.kind not in "fiu" or array.dtype == bool:
                raise TypeError(f"matrix must be real and numeric, got dtype {array.dtype}")
            matrix = torch.as_tensor(array.astype(np.float64), device=image.device)
        else:
            raise TypeError(f"matrix must be a torch.Tensor, got {type(matrix).__name__}")
    check_image(matrix, "matrix", ndim=(2, 3))
    check_same_device(image, matrix, "image", "matrix")
    d = image.dim() - 2
    rows, cols = matrix.shape[-2:]
    if cols != d + 1 or rows not in (d, d + 1):
        raise ValueError(
            f"matrix must be ({d + 1}, {d + 1}) homogeneous (or ({d}, {d + 1})), optionally "
            f"batched, for a {d}D image; got shape {tuple(matrix.shape)}"
        )
    if not bool(torch.isfinite(matrix).all()):
        raise ValueError("matrix must be finite, got NaN or infinite entries")
    batched = matrix if matrix.dim() == 3 else matrix.unsqueeze(0)
    if rows == d + 1:
        last = batched[:, d].detach().to(torch.float64)
        expected = torch.zeros_like(last)
        expected[:, d] = 1.0
        if not torch.allclose(last, expected, atol=1e-6, rtol=0.0):
            raise ValueError(
                f"matrix's last row must be (0, ..., 0, 1) (an affine, not a projective "
                f"transform), got {last.tolist()}"
            )
    return batched


# --------------------------------------------------------------------------- sampling


def _pad_singleton_axes(image: torch.Tensor, padding: str):
    """Zero-pad every spatial axis of length 1 by one pixel each side (for "zeros" only).

    ``grid_sample`` with ``align_corners=True`` reads pixel 0 of a length-1 axis at any
    position, which is right for "border"/"reflection" but not for "zeros", where a
    sample half a pixel off must be half as bright. Real zero pixels around it restore that.

    Returns
    -------
    (Tensor, list of float)
        The (possibly) padded image and, per spatial axis, the pixel of the padded image
        where the original pixel 0 now sits (1.0 on padded axes, else 0.0).
    """
    single = [n == 1 for n in image.shape[2:]]
    if padding != "zeros" or not any(single):
        return image, [0.0] * len(single)
    pad = []
    for s in reversed(single):
        pad += [1, 1] if s else [0, 0]
    return F.pad(image, pad), [1.0 if s else 0.0 for s in single]


def _grid_sample(image: torch.Tensor, grid: torch.Tensor, interpolation: str,
                 padding: str) -> torch.Tensor:
    """``grid_sample`` with batch broadcasting: either batch may be 1.

    image ``(N, C, *S)``, grid ``(N or 1, *S_out, D)`` (or image batch 1 and any grid
    batch); returns ``(max(N, N_grid), C, *S_out)``.
    """
    n, c = image.shape[:2]
    mode = _GRID_SAMPLE_MODE[interpolation]
    if grid.shape[0] == 1 and n > 1:
        # One field for the whole batch: fold the batch into channels, one pass.
        folded = image.reshape(1, n * c, *image.shape[2:])
        out = F.grid_sample(folded, grid, mode=mode, padding_mode=padding, align_corners=True)
        return out.reshape(n, c, *out.shape[2:])
    if n == 1 and grid.shape[0] > 1:
        image = image.expand(grid.shape[0], *image.shape[1:])
    return F.grid_sample(image, grid, mode=mode, padding_mode=padding, align_corners=True)


def sample(
    image: torch.Tensor, coords: torch.Tensor, *, interpolation: str = "linear",
    padding: str = "border",
) -> torch.Tensor:
    """Sample ``image`` at absolute pixel positions (no input checks).

    Parameters
    ----------
    image : Tensor, shape ``(N, C, *S)``
        In its compute dtype (float32 or float64).
    coords : Tensor, shape ``(N or 1, D, *S_out)``
        Positions in pixels, array-axis order; any floating dtype (the grid is made in
        ``coords``' dtype, then cast to ``image``'s). ``image`` may also have batch 1
        against a larger ``coords`` batch.

    Returns
    -------
    Tensor, shape ``(max(N, N_coords), C, *S_out)``, ``image``'s dtype.
    """
    image, origin = _pad_singleton_axes(image, padding)
    if any(origin):
        shift = torch.tensor(origin, dtype=coords.dtype, device=coords.device)
        coords = coords + shift.view((1, -1) + (1,) * (coords.dim() - 2))
    grid = pixel_to_grid(coords, image.shape[2:]).to(image.dtype)
    return _grid_sample(image, grid, interpolation, padding)


def sample_displaced(
    image: torch.Tensor, displacement: torch.Tensor, *, interpolation: str = "linear",
    padding: str = "border",
) -> torch.Tensor:
    """``image(x + d(x))`` (no input checks): :func:`warp`'s engine.

    Parameters
    ----------
    image : Tensor, shape ``(N, C, *S)``, in its compute dtype.
    displacement : Tensor, shape ``(N or 1, D, *S)``, pixels, array-axis order, any
        floating dtype (the grid is made in its dtype, then cast to ``image``'s).

    Returns
    -------
    Tensor, shape ``(max(N, N_d), C, *S)``, ``image``'s dtype.
    """
    padded, origin = _pad_singleton_axes(image, padding)
    grid = displacement_to_grid(displacement, padded.shape[2:], origin=origin)
    return _grid_sample(padded, grid.to(image.dtype), interpolation, padding)


# --------------------------------------------------------------------------- public


def warp(
    image: torch.Tensor, displacement: torch.Tensor, *, interpolation: str = "linear",
    padding: str = "border",
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
    padding : {"zeros", "border", "reflection"}
        Values outside the image: zero pixels (SciPy "grid-constant"), the edge pixel
        repeated (SciPy "nearest"), or mirrored about the edge pixels (SciPy "mirror").

    Returns
    -------
    Tensor, shape ``(max(N, N_d), C, *S)``, ``image``'s dtype, on its device.
    Differentiable with respect to ``image`` and ``displacement`` (the displacement
    gradient is zero for "nearest").
    """
    check_image(image, "image")
    spatial = tuple(image.shape[2:])
    check_displacement(displacement, "displacement", spatial, like=image)
    _check_batches(image.shape[0], displacement.shape[0], "displacement")
    _check_modes(interpolation, padding, len(spatial))

    dtype = torch.promote_types(compute_dtype(image.dtype), compute_dtype(displacement.dtype))
    out = sample_displaced(image.to(dtype), displacement.to(dtype), interpolation=interpolation,
                           padding=padding)
    return out.to(image.dtype)


def affine_coordinates(matrix: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Input positions ``A x + t`` of every output pixel ``x`` (no input checks).

    Parameters
    ----------
    matrix : Tensor, shape ``(M, D + 1, D + 1)`` or ``(M, D, D + 1)``
        Array-axis order, output coordinates to input coordinates.
    shape : sequence of int
        The output's spatial shape ``S_out`` (``D`` ints).

    Returns
    -------
    Tensor, shape ``(M, D, *S_out)`` in pixels, ``matrix``'s dtype. Differentiable with
    respect to ``matrix``.
    """
    d = len(shape)
    grid = identity_grid(shape, dtype=matrix.dtype, device=matrix.device)[0]  # (D, *S_out)
    linear, shift = matrix[:, :d, :d], matrix[:, :d, d]
    coords = torch.einsum("mij,j...->mi...", linear, grid)
    return coords + shift.view(shift.shape + (1,) * d)


def warp_affine(
    image: torch.Tensor, matrix, *, output_shape: Sequence[int] | None = None,
    interpolation: str = "linear", padding: str = "zeros",
) -> torch.Tensor:
    """Backward-warp ``image`` by an affine: ``out(x) = image(A x + t)``.

    The same as ``scipy.ndimage.affine_transform(image, matrix, output_shape=...)`` per
    image and channel (with ``mode="grid-constant"`` for ``padding="zeros"``).

    Parameters
    ----------
    image : Tensor, shape ``(N, C, *S)`` with ``len(S)`` 2 or 3
        Floating point; float16/bfloat16 are computed in float32.
    matrix : Tensor or array, shape ``(D + 1, D + 1)`` or ``(M, D + 1, D + 1)``
        Homogeneous, array-axis order, mapping output coordinates (pixels) to input
        coordinates; the last row must be ``(0, ..., 0, 1)``. ``(D, D + 1)`` (no last
        row) is also accepted. ``M`` is 1 or ``N`` (or anything when ``N == 1``).
        Must be finite. Differentiable when it is a tensor that requires grad.
    output_shape : sequence of int, optional
        The output's spatial shape ``S_out`` (default ``S``).
    interpolation : {"nearest", "linear", "cubic"}
        As in :func:`warp` ("cubic" is 2D only).
    padding : {"zeros", "border", "reflection"}
        As in :func:`warp`; the default "zeros" is SciPy's "grid-constant".

    Returns
    -------
    Tensor, shape ``(max(N, M), C, *S_out)``, ``image``'s dtype, on its device.
    """
    check_image(image, "image")
    d = image.dim() - 2
    spatial = tuple(image.shape[2:])
    _check_modes(interpolation, padding, d)
    batched = _as_matrix(matrix, image)
    _check_batches(image.shape[0], batched.shape[0], "matrix")
    out_shape = _check_output_shape(output_shape, spatial)

    dtype = compute_dtype(image.dtype)
    theta_dtype = torch.promote_types(dtype, compute_dtype(batched.dtype))
    out = _sample_affine(image.to(dtype), homogeneous(batched.to(theta_dtype)), out_shape,
                         interpolation, padding)
    return out.to(image.dtype)


def homogeneous(matrix: torch.Tensor) -> torch.Tensor:
    """``(M, D, D + 1)`` or ``(M, D + 1, D + 1)`` to ``(M, D + 1, D + 1)`` (last row ``0…0 1``)."""
    d = matrix.shape[-1] - 1
    if matrix.shape[-2] == d + 1:
        return matrix
    last = torch.zeros(matrix.shape[0], 1, d + 1, dtype=matrix.dtype, device=matrix.device)
    last[..., d] = 1.0
    return torch.cat([matrix, last], dim=1)


def _sample_affine(image: torch.Tensor, matrix: torch.Tensor, out_shape: tuple[int, ...],
                   interpolation: str, padding: str) -> torch.Tensor:
    """``image(A x + t)`` over an ``out_shape`` grid through ``F.affine_grid`` (no checks).

    ``affine_grid`` builds the normalised grid with one small matmul per point, cheaper
    than building pixel coordinates and normalising them.
    """
    padded, origin = _pad_singleton_axes(image, padding)
    if any(origin):
        # Input pixel p of the original image is pixel p + origin of the padded one.
        shift = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
        shift[:-1, -1] = torch.tensor(origin, dtype=matrix.dtype, device=matrix.device)
        matrix = shift @ matrix
    theta = affine_to_theta(matrix, padded.shape[2:], out_shape).to(image.dtype)
    size = (theta.shape[0], 1) + tuple(out_shape)
    grid = F.affine_grid(theta, size, align_corners=True)
    return _grid_sample(padded, grid, interpolation, padding)


def _check_output_shape(output_shape, spatial: tuple[int, ...]) -> tuple[int, ...]:
    if output_shape is None:
        return spatial
    try:
        shape = tuple(int(n) for n in output_shape)
    except TypeError:
        raise TypeError(f"output_shape must be a sequence of ints, got {output_shape!r}") from None
    if len(shape) != len(spatial) or any(n <= 0 for n in shape):
        raise ValueError(
            f"output_shape must be {len(spatial)} positive ints (the output's spatial shape), "
            f"got {output_shape!r}"
        )
    return shape
