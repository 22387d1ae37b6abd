"""Backward warping by an affine: ``out(x) = image(A x + t)``, as SciPy's ``affine_transform``.

The matrix is homogeneous, in array-axis order, and maps output (fixed) coordinates to
input (moving) coordinates: the matrix ``scipy.ndimage.affine_transform`` takes
(docs/maths.md §6.1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ._numerics import compute_dtype
from ._sampling import homogeneous, sample_affine
from ._validation import check_batches, check_image, check_matrix
from .warp import check_warp_modes


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


#: outputs up to this many bytes (with their grid) are made without asking the device
#: how much memory is free (a GPU's answer waits on its queue)
CHECKED_BYTES = 256 * 2**20


def _check_fits(image: torch.Tensor, batch: int, out_shape, dtype: torch.dtype) -> None:
    """Refuse, before allocating, an output that cannot fit in the memory free now on the
    image's device: the result ``(batch, C, *out_shape)`` and the sampling grid
    ``(batch, *out_shape, D)``, in the compute ``dtype`` (a typo in ``output_shape`` would
    otherwise reach the allocator, or swap the machine to a halt)."""
    from .._devices import available_memory

    points = math.prod(out_shape)
    need = points * dtype.itemsize * batch * (image.shape[1] + len(out_shape))
    if dtype != image.dtype:  # the result is cast back to the image's dtype
        need += points * image.dtype.itemsize * batch * image.shape[1]
    if need <= CHECKED_BYTES:  # no query (on a GPU, a host sync) for ordinary outputs
        return
    free = available_memory(image.device)
    if free is not None and need > free:
        raise MemoryError(
            f"output_shape {tuple(out_shape)} needs about {need / 2**30:.1f} GiB (the "
            f"{batch} × {image.shape[1]} warped images and their sampling grid), more than "
            f"the {free / 2**30:.1f} GiB free on {image.device}; check output_shape, or warp "
            "in tiles (Transform.apply(..., chunks=...))"
        )


def warp_affine(
    image: torch.Tensor,
    matrix,
    *,
    output_shape: Sequence[int] | None = None,
    interpolation: str = "linear",
    padding: str = "grid-constant",
) -> torch.Tensor:
    """Backward-warp ``image`` by an affine: ``out(x) = image(A x + t)``.

    The same as ``scipy.ndimage.affine_transform(image, matrix, output_shape=...,
    mode=padding)`` per image and channel, with ``order=1`` for "linear".

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
        As in :func:`~napari_simwarp.ops.warp` ("cubic" is 2D only).
    padding : {"grid-constant", "nearest", "mirror", "reflect"}
        As in :func:`~napari_simwarp.ops.warp`; the default is zero pixels outside.

    Returns
    -------
    Tensor, shape ``(max(N, M), C, *S_out)``, ``image``'s dtype, on its device. An output
    that cannot fit in the memory free on the device is refused (MemoryError naming
    ``output_shape``) before anything is allocated.
    """
    check_image(image, "image")
    d = image.dim() - 2
    spatial = tuple(image.shape[2:])
    padding = check_warp_modes(interpolation, padding, d)
    batched = check_matrix(matrix, image)
    check_batches(image.shape[0], batched.shape[0], "image", "matrix")
    out_shape = _check_output_shape(output_shape, spatial)

    dtype = compute_dtype(image.dtype)
    theta_dtype = torch.promote_types(dtype, compute_dtype(batched.dtype))
    _check_fits(image, max(image.shape[0], batched.shape[0]), out_shape, dtype)
    out = sample_affine(
        image.to(dtype), homogeneous(batched.to(theta_dtype)), out_shape, interpolation, padding
    )
    return out.to(image.dtype)
