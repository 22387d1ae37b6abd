"""Pixel coordinate grids and their conversion to ``grid_sample``'s normalised grids.

Coordinates in this package are in pixels and in array-axis order: ``coords[:, 0]`` is
the row (``y`` in 2D, ``z`` in 3D), ``coords[:, -1]`` the column. A pixel's centre is at
its integer index. ``torch.nn.functional.grid_sample`` wants the reverse order
``(x, y[, z])`` in the last axis, normalised to ``[-1, 1]``; with ``align_corners=True``
(the only setting used here) pixel ``p`` of an axis of length ``n`` is ``2 p / (n - 1) - 1``,
so ``-1`` and ``1`` are the centres of the first and last pixels.

An axis of length 1 has no such scale; ``grid_sample`` reads pixel 0 of it whatever the
normalised coordinate, so these helpers send it to 0 with scale 0 (no division by zero,
and a zero gradient with respect to that coordinate, which is the right derivative of a
sample that is constant along the axis). Zero padding along such an axis needs more
than a coordinate: see ``napari_simwarp.ops.warp``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


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


def normalising_scale(shape: Sequence[int]) -> list[tuple[float, float]]:
    """``(scale, offset)`` per axis such that ``normalised = scale * pixel + offset``.

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
        Normalised to ``[-1, 1]`` inside the input, last axis in ``(x, y[, z])`` order, for
        ``grid_sample(..., align_corners=True)``. Differentiable with respect to ``coords``.
    """
    d = coords.shape[1]
    if len(shape) != d:
        raise ValueError(f"coords has {d} components but shape has {len(shape)} axes")
    components = [coords[:, axis] * scale + offset
                  for axis, (scale, offset) in enumerate(normalising_scale(shape))]
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
    Tensor, shape ``(N, *S, D)``, normalised, ``(x, y[, z])`` order, ``displacement``'s dtype.
    Differentiable with respect to ``displacement``.
    """
    d = displacement.shape[1]
    out_shape = displacement.shape[2:]
    origin = [0.0] * d if origin is None else list(origin)
    components = []
    for axis, (scale, offset) in enumerate(normalising_scale(shape)):
        view = [1] * d
        view[axis] = out_shape[axis]
        positions = torch.arange(out_shape[axis], dtype=displacement.dtype, device=displacement.device)
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
    """A pixel-space affine as the normalised ``theta`` that ``F.affine_grid`` takes.

    Parameters
    ----------
    matrix : Tensor, shape ``(M, D + 1, D + 1)``
        Homogeneous, array-axis order, output pixels to input pixels.
    in_shape, out_shape : sequence of int
        Spatial shapes (``D`` ints) of the sampled tensor and of the output.

    Returns
    -------
    Tensor, shape ``(M, D, D + 1)``: ``theta = R · N_in · matrix · N_out⁻¹ · R`` with ``R``
    the axis reversal and ``N`` the pixel-to-normalised maps (``align_corners=True``);
    ``N_out⁻¹`` is ``p = (u + 1)(n - 1) / 2``, defined also for ``n == 1``. Differentiable
    with respect to ``matrix``.
    """
    d = matrix.shape[-1] - 1
    kw = dict(dtype=matrix.dtype, device=matrix.device)
    normalise = torch.eye(d + 1, **kw)
    for axis, (scale, offset) in enumerate(normalising_scale(in_shape)):
        normalise[axis, axis], normalise[axis, d] = scale, offset
    denormalise = torch.eye(d + 1, **kw)
    for axis, n in enumerate(out_shape):
        denormalise[axis, axis] = denormalise[axis, d] = (n - 1) / 2.0
    reverse = torch.eye(d + 1, **kw)
    reverse[:d, :d] = torch.eye(d, **kw).flip(0)
    # affine_grid feeds normalised output positions in (x, y[, z]) order: reverse them
    # to array-axis order, to pixels, through the matrix, to normalised, and back.
    theta = reverse @ normalise @ matrix @ denormalise @ reverse
    return theta[:, :d]


def grid_to_pixel(grid: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Inverse of :func:`pixel_to_grid` (axes of length 1 come back as pixel 0).

    Parameters
    ----------
    grid : Tensor, shape ``(N, *S_out, D)``, normalised, ``(x, y[, z])`` order.
    shape : sequence of int
        The spatial shape ``D`` ints of the sampled tensor.

    Returns
    -------
    Tensor, shape ``(N, D, *S_out)``: pixel coordinates in array-axis order.
    """
    d = grid.shape[-1]
    coords = grid.flip(-1).movedim(-1, 1)
    half = torch.tensor([(n - 1) / 2.0 for n in shape], dtype=grid.dtype, device=grid.device)
    return (coords + 1.0) * half.view((1, d) + (1,) * (coords.dim() - 2))
