"""Coordinates and sampling: pixel grids, ``grid_sample``'s normalized grids, resampling.

Used by the warping operators and by the registration models, so that both sample an
image through the same code (docs/maths.md §3 and §7).

Coordinates are in pixels and in array-axis order: ``coords[:, 0]`` is the row (``y`` in
2D, ``z`` in 3D), ``coords[:, -1]`` the column. A pixel's center is at its integer index.
``torch.nn.functional.grid_sample`` wants the reverse order ``(x, y[, z])`` in the last
axis, normalized to ``[-1, 1]``; with ``align_corners=True`` (the setting used here, bar
one case below) pixel ``p`` of an axis of length ``n`` is ``2 p / (n - 1) - 1``, so ``-1``
and ``1`` are the centers of the first and last pixels.

An axis of length 1 has no such scale; ``grid_sample`` reads pixel 0 of it whatever the
normalized coordinate, so these helpers send it to 0 with scale 0 (no division by zero,
and a zero gradient with respect to that coordinate, which is the right derivative of a
sample that is constant along the axis). Zero padding along such an axis needs more
than a coordinate: see :func:`_pad_singleton_axes`.

Boundaries use SciPy's names (``map_coordinates``/``affine_transform`` modes):

================ ======================================== ===============================
padding          outside the image                        ``grid_sample``
================ ======================================== ===============================
"grid-constant"  zero pixels, interpolated with the edge  "zeros", ``align_corners=True``
"nearest"        the edge pixel repeated                  "border"
"mirror"         mirrored about the edge pixels' centers  "reflection", ``True``
"reflect"        mirrored about the edge pixels' borders  "reflection", ``False``
================ ======================================== ===============================

(SciPy's "constant" is *not* "grid-constant": it returns ``cval`` for any position
outside ``[0, n - 1]`` instead of interpolating towards it.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

#: interpolation orders of the warps, by name.
INTERPOLATIONS = ("nearest", "linear", "cubic")
#: boundaries of the warps (SciPy's names).
WARP_PADDINGS = ("grid-constant", "nearest", "mirror", "reflect")

_GRID_SAMPLE_MODE = {"nearest": "nearest", "linear": "bilinear", "cubic": "bicubic"}
_GRID_SAMPLE_PADDING = {
    "grid-constant": "zeros",
    "nearest": "border",
    "mirror": "reflection",
    "reflect": "reflection",
}


def identity_grid(shape: Sequence[int], *, dtype=None, device=None) -> torch.Tensor:
    """Every pixel's own coordinates, in pixels and array-axis order.

    Parameters
    ----------
    shape : sequence of int
        Spatial shape ``S`` (array-axis order), any number of axes.

    Returns
    -------
    Tensor, shape ``(1, len(S), *S)``
        ``grid[0, i, p_0, ..., p_{D-1}] = p_i``; add a displacement ``(N, D, *S)`` to get
        the sample positions of a backward warp.
    """
    axes = [torch.arange(n, dtype=dtype, device=device) for n in shape]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=0).unsqueeze(0)


def normalizing_scale(shape: Sequence[int]) -> list[tuple[float, float]]:
    """``(scale, offset)`` per axis such that ``normalized = scale * pixel + offset``.

    ``(2 / (n - 1), -1)`` for ``n > 1`` (``align_corners=True``); ``(0, 0)`` for ``n == 1``.
    """
    return [(2.0 / (n - 1), -1.0) if n > 1 else (0.0, 0.0) for n in shape]


def pixel_to_grid(coords: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Pixel coordinates in array-axis order to a ``grid_sample`` grid.

    Parameters
    ----------
    coords : Tensor, shape ``(N, D, *S_out)``
        Sample positions in pixels of an input whose spatial shape is ``shape``;
        ``coords[:, i]`` is the position along input axis ``i``.
    shape : sequence of int
        The spatial shape of the tensor that will be sampled (``D`` ints).

    Returns
    -------
    Tensor, shape ``(N, *S_out, D)``
        Normalized to ``[-1, 1]`` inside the input, last axis in ``(x, y[, z])`` order, for
        ``grid_sample(..., align_corners=True)``. Differentiable with respect to ``coords``.
    """
    d = coords.shape[1]
    if len(shape) != d:
        raise ValueError(f"coords has {d} components but shape has {len(shape)} axes")
    components = [
        coords[:, axis] * scale + offset
        for axis, (scale, offset) in enumerate(normalizing_scale(shape))
    ]
    # Planes stacked in (x, y[, z]) order on dim 1, moved last as a view (see
    # displacement_to_grid for why not an interleaved stack).
    return torch.stack(components[::-1], dim=1).movedim(1, -1)


def displacement_to_grid(
    displacement: torch.Tensor, shape: Sequence[int], *, origin: Sequence[float] | None = None
) -> torch.Tensor:
    """The ``grid_sample`` grid of the positions ``x + d(x)``, without an identity grid.

    Equal to ``pixel_to_grid(identity_grid(S) + displacement, shape)`` but in one fused
    pass per component: the identity enters as a broadcast ``arange`` per axis, which
    saves building and adding a full ``(1, D, *S)`` coordinate tensor (at 2048² that is
    most of a warp's time on a CPU).

    Parameters
    ----------
    displacement : Tensor, shape ``(N, D, *S)``
        Pixels, array-axis order; ``x`` runs over the pixels of ``S``.
    shape : sequence of int
        Spatial shape of the tensor that will be sampled (``D`` ints; usually ``S``).
    origin : sequence of float, optional
        Added to ``x`` per axis (default 0): the pixel of the sampled tensor that output
        pixel 0 sits on (1 after padding an axis by one pixel in front).

    Returns
    -------
    Tensor, shape ``(N, *S, D)``, normalized, ``(x, y[, z])`` order, ``displacement``'s dtype.
    Differentiable with respect to ``displacement``.
    """
    d = displacement.shape[1]
    out_shape = displacement.shape[2:]
    origin = [0.0] * d if origin is None else list(origin)
    components = []
    for axis, (scale, offset) in enumerate(normalizing_scale(shape)):
        view = [1] * d
        view[axis] = out_shape[axis]
        positions = torch.arange(
            out_shape[axis], dtype=displacement.dtype, device=displacement.device
        )
        base = ((positions + origin[axis]) * scale + offset).view(1, *view)
        # One fused broadcast kernel per component: base + scale * d.
        components.append(torch.add(base, displacement[:, axis], alpha=scale))
    # Stack the planes in (x, y[, z]) order along dim 1 (contiguous block copies) and
    # move that axis last as a view: grid_sample reads a strided grid as fast as a
    # contiguous one, whereas stacking into an interleaved last axis costs as much as
    # the sampling itself on a CPU.
    return torch.stack(components[::-1], dim=1).movedim(1, -1)


def affine_to_theta(
    matrix: torch.Tensor, in_shape: Sequence[int], out_shape: Sequence[int]
) -> torch.Tensor:
    """A pixel-space affine as the normalized ``theta`` that ``F.affine_grid`` takes.

    Parameters
    ----------
    matrix : Tensor, shape ``(M, D + 1, D + 1)``
        Homogeneous, array-axis order, output pixels to input pixels.
    in_shape, out_shape : sequence of int
        Spatial shapes (``D`` ints) of the sampled tensor and of the output.

    Returns
    -------
    Tensor, shape ``(M, D, D + 1)``: ``theta = R · N_in · matrix · N_out⁻¹ · R`` with ``R``
    the axis reversal and ``N`` the pixel-to-normalized maps (``align_corners=True``);
    ``N_out⁻¹`` is ``p = (u + 1)(n - 1) / 2``, defined also for ``n == 1``. Differentiable
    with respect to ``matrix``.
    """
    d = matrix.shape[-1] - 1
    kw = dict(dtype=matrix.dtype, device=matrix.device)
    normalize = torch.eye(d + 1, **kw)
    for axis, (scale, offset) in enumerate(normalizing_scale(in_shape)):
        normalize[axis, axis], normalize[axis, d] = scale, offset
    denormalize = torch.eye(d + 1, **kw)
    for axis, n in enumerate(out_shape):
        denormalize[axis, axis] = denormalize[axis, d] = (n - 1) / 2.0
    reverse = torch.eye(d + 1, **kw)
    reverse[:d, :d] = torch.eye(d, **kw).flip(0)
    # affine_grid feeds normalized output positions in (x, y[, z]) order: reverse them
    # to array-axis order, to pixels, through the matrix, to normalized, and back.
    theta = reverse @ normalize @ matrix @ denormalize @ reverse
    return theta[:, :d]


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
    if padding != "grid-constant" or not any(single):
        return image, [0.0] * len(single)
    pad = []
    for s in reversed(single):
        pad += [1, 1] if s else [0, 0]
    return F.pad(image, pad), [1.0 if s else 0.0 for s in single]


def grid_sample(
    image: torch.Tensor, grid: torch.Tensor, interpolation: str, padding: str
) -> torch.Tensor:
    """``grid_sample`` with SciPy's boundary names and batch broadcasting.

    Parameters
    ----------
    image : Tensor, shape ``(N, C, *S)``
    grid : Tensor, shape ``(N or 1, *S_out, D)``, normalized for ``align_corners=True``
        (or any batch when ``N == 1``).
    interpolation : one of :data:`INTERPOLATIONS`
    padding : one of :data:`WARP_PADDINGS`; "grid-constant" expects axes of length 1 to
        have been padded by :func:`_pad_singleton_axes`.

    Returns
    -------
    Tensor, shape ``(max(N, N_grid), C, *S_out)``.
    """
    n, c = image.shape[:2]
    mode = _GRID_SAMPLE_MODE[interpolation]
    align_corners = padding != "reflect"
    if not align_corners:
        # The same pixel positions in align_corners=False units: u · (n - 1) / n.
        scale = torch.tensor(
            [(m - 1) / m for m in reversed(image.shape[2:])], dtype=grid.dtype, device=grid.device
        )
        grid = grid * scale
    options = dict(
        mode=mode, padding_mode=_GRID_SAMPLE_PADDING[padding], align_corners=align_corners
    )
    if grid.shape[0] == 1 and n > 1:
        # One field for the whole batch: fold the batch into channels, one pass.
        folded = image.reshape(1, n * c, *image.shape[2:])
        out = F.grid_sample(folded, grid, **options)
        return out.reshape(n, c, *out.shape[2:])
    if n == 1 and grid.shape[0] > 1:
        image = image.expand(grid.shape[0], *image.shape[1:])
    return F.grid_sample(image, grid, **options)


def sample_displaced(
    image: torch.Tensor,
    displacement: torch.Tensor,
    *,
    interpolation: str = "linear",
    padding: str = "nearest",
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
    return grid_sample(padded, grid.to(image.dtype), interpolation, padding)


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


def homogeneous(matrix: torch.Tensor) -> torch.Tensor:
    """``(M, D, D + 1)`` or ``(M, D + 1, D + 1)`` to ``(M, D + 1, D + 1)`` (last row ``0…0 1``)."""
    d = matrix.shape[-1] - 1
    if matrix.shape[-2] == d + 1:
        return matrix
    last = torch.zeros(matrix.shape[0], 1, d + 1, dtype=matrix.dtype, device=matrix.device)
    last[..., d] = 1.0
    return torch.cat([matrix, last], dim=1)


#: grids of fewer points are built by ``F.affine_grid`` (its single call beats the
#: per-axis loop's dozen small ones below ~32k points: 0.1 against 0.3 ms at 2 × 64²)
SMALL_GRID = 1 << 15


def affine_grid(
    matrix: torch.Tensor, in_shape: Sequence[int], out_shape: Sequence[int], dtype=None
) -> torch.Tensor:
    """The normalized sampling grid of a pixel affine, ``F.affine_grid``'s.

    ``matrix`` ``(M, D + 1, D + 1)`` maps output pixels to input pixels (array-axis order);
    returns ``(M, *out_shape, D)`` for ``grid_sample(..., align_corners=True)`` on an input
    of spatial ``in_shape``, in ``dtype`` (default: ``matrix``'s). Each component is a sum
    of per-axis terms, worked out on the axes' coordinates in ``matrix``'s dtype, so the
    whole grid costs one addition and one write per point (``F.affine_grid`` multiplies a
    homogeneous base grid, 4× the time at 2048², in the matrix's dtype, often float64).
    Differentiable with respect to ``matrix``.
    """
    theta = affine_to_theta(matrix, in_shape, out_shape)  # components and inputs in x, y, z
    d, m = len(out_shape), theta.shape[0]
    dtype = theta.dtype if dtype is None else dtype
    if m * math.prod(out_shape) < SMALL_GRID:
        size = (m, 1) + tuple(out_shape)
        return F.affine_grid(theta, size, align_corners=True).to(dtype)
    grid = torch.empty((m, *out_shape, d), dtype=dtype, device=theta.device)
    for k in range(d):
        # terms along the two last array axes (small), then the first: one full-size sum
        term = theta[:, k, d].view(m, *[1] * d).to(dtype)
        for axis in reversed(range(d)):
            n = out_shape[axis]
            # F.affine_grid's normalized coordinates: linspace(-1, 1), 0 for an axis of 1
            u = (
                torch.linspace(-1.0, 1.0, n, dtype=theta.dtype, device=theta.device)
                if n > 1
                else torch.zeros(1, dtype=theta.dtype, device=theta.device)
            )
            shape = [m] + [1] * d
            shape[1 + axis] = n
            term = term + (theta[:, k, d - 1 - axis, None] * u).view(shape).to(dtype)
        grid[..., k] = term
    return grid


def sample_affine(
    image: torch.Tensor,
    matrix: torch.Tensor,
    out_shape: Sequence[int],
    interpolation: str,
    padding: str,
) -> torch.Tensor:
    """``image(A x + t)`` over an ``out_shape`` grid (no checks): :func:`warp_affine`'s engine.

    ``image`` ``(N, C, *S)`` in its compute dtype, ``matrix`` ``(M, D + 1, D + 1)``;
    returns ``(max(N, M), C, *out_shape)``.
    """
    padded, origin = _pad_singleton_axes(image, padding)
    if any(origin):
        # Input pixel p of the original image is pixel p + origin of the padded one.
        shift = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
        shift[:-1, -1] = torch.tensor(origin, dtype=matrix.dtype, device=matrix.device)
        matrix = shift @ matrix
    grid = affine_grid(matrix, padded.shape[2:], out_shape, image.dtype)
    return grid_sample(padded, grid, interpolation, padding)


def grid_inside(grid: torch.Tensor, shape: Sequence[int], margin: float = 0.5) -> torch.Tensor:
    """1 where a normalized grid ``(N, *S_out, D)`` samples within ``margin`` pixels of the
    image of spatial ``shape`` (``[-margin, n - 1 + margin]`` per axis), as ``(N, 1, *S_out)``.
    """
    limits = torch.tensor(
        [1.0 + 2.0 * margin / (n - 1) if n > 1 else float("inf") for n in reversed(list(shape))],
        dtype=grid.dtype,
        device=grid.device,
    )
    inside = (grid.abs() <= limits).all(dim=-1)
    return inside.unsqueeze(1).to(grid.dtype)


def level_to_full(
    full_shape: Sequence[int], level_shape: Sequence[int], dtype=torch.float64, device=None
) -> torch.Tensor:
    """Homogeneous ``(D + 1, D + 1)`` map from a pyramid level's pixels to full-resolution ones.

    Every level covers the same field of view (pixel-center convention), so pixel ``p`` of
    a level ``n`` wide is pixel ``(p + 0.5) · N / n - 0.5`` of the full image ``N`` wide.
    """
    d = len(full_shape)
    out = torch.eye(d + 1, dtype=dtype, device=device)
    for axis, (big, small) in enumerate(zip(full_shape, level_shape)):
        factor = big / small
        out[axis, axis] = factor
        out[axis, d] = 0.5 * factor - 0.5
    return out


def level_matrix(
    matrix: torch.Tensor,
    moving_full: Sequence[int],
    moving_level: Sequence[int],
    fixed_full: Sequence[int],
    fixed_level: Sequence[int],
) -> torch.Tensor:
    """A full-resolution fixed → moving pixel matrix ``(M, D + 1, D + 1)`` at one level.

    ``L_moving⁻¹ · matrix · L_fixed`` with ``L`` from :func:`level_to_full`: the same
    transform, between the pixels of a coarser fixed level and a coarser moving level.
    """
    kw = dict(dtype=matrix.dtype, device=matrix.device)
    to_full = level_to_full(fixed_full, fixed_level, **kw)
    from_full = torch.linalg.inv(level_to_full(moving_full, moving_level, **kw))
    return from_full @ matrix @ to_full
