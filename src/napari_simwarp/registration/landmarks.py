"""Linear transforms from point pairs (landmarks), by least squares (docs/maths.md §12).

A landmark pair is a point ``x`` of the fixed image and the point ``y`` of the moving
image that shows the same structure. :func:`fit_landmarks` finds the transform
``y ≈ A x + t`` (fixed → moving, the direction of every transform of the package) of a
chosen model that fits the pairs best in the least-squares sense:

- ``"translation"``: ``A = I``, ``t`` the mean of ``y − x``;
- ``"rigid"``: ``A`` a rotation (no reflection), Umeyama's closed form;
- ``"similarity"``: ``A`` a rotation times a scale, Umeyama's closed form;
- ``"affine"``: ``A`` any matrix, linear least squares.

Points are arrays of shape ``(n, D)`` in array-axis order. Without grids they are pixel
positions; with grids (:class:`~.grid.Grid`, napari's ``scale`` and ``translate``) they are
physical positions (napari's world coordinates) and the fit happens in physical space, so
a rigid fit is rigid for the sample even when the voxels are anisotropic. The result is
an :class:`~.transforms.AffineTransform` carrying the grids; its ``matrix`` is in pixels.

:func:`read_bigwarp_landmarks` and :func:`write_bigwarp_landmarks` (from
:mod:`napari_simwarp.io.transform_files.bigwarp`) read and write BigWarp's landmark table
(Fiji), whose points these functions take as they are.
"""

from __future__ import annotations

import numpy as np

from ..io.transform_files.bigwarp import (
    as_point_pairs,
    read_bigwarp_landmarks,
    write_bigwarp_landmarks,
)
from ._names import LINEAR_MODELS
from .grid import Grid, unit_grid
from .transforms import AffineTransform

__all__ = ["fit_landmarks", "landmark_errors", "read_bigwarp_landmarks", "write_bigwarp_landmarks"]

#: the fewest pairs that determine each model, per dimension (2-D, 3-D)
MIN_POINTS = {
    "translation": {2: 1, 3: 1},
    "rigid": {2: 2, 3: 3},
    "similarity": {2: 2, 3: 3},
    "affine": {2: 3, 3: 4},
}


def _check_pairs(fixed_points, moving_points, model: str) -> tuple[np.ndarray, np.ndarray]:
    if model not in LINEAR_MODELS:
        raise ValueError(f"model must be one of {', '.join(LINEAR_MODELS)}, got {model!r}")
    x, y = as_point_pairs(fixed_points, moving_points)
    n, d = x.shape
    need = MIN_POINTS[model][d]
    if n < need:
        raise ValueError(f"a {d}-D {model} transform needs at least {need} point pairs, got {n}")
    # The points must also span enough directions: collinear points leave a 2-D affine
    # (and any 3-D rotation about their line) undetermined.
    spread = np.linalg.matrix_rank(x - x.mean(axis=0), tol=1e-9 * max(1.0, np.abs(x).max()))
    needed_rank = {"translation": 0, "rigid": d - 1, "similarity": d - 1, "affine": d}[model]
    if spread < needed_rank:
        shape = {0: "all the same", 1: "on one line", 2: "in one plane"}[spread]
        raise ValueError(
            f"the fixed points are {shape}: they do not determine a {d}-D {model} "
            f"transform (it needs points spanning {needed_rank} directions)"
        )
    return x, y


def _umeyama(x: np.ndarray, y: np.ndarray, scale: bool) -> np.ndarray:
    """Rotation (times a scale when ``scale``) and shift that best map ``x`` onto ``y``:
    homogeneous ``(D + 1, D + 1)``. Umeyama (1991), the SVD of the cross-covariance, with
    the reflection removed."""
    d = x.shape[1]
    mx, my = x.mean(axis=0), y.mean(axis=0)
    xc, yc = x - mx, y - my
    u, s, vt = np.linalg.svd(yc.T @ xc / len(x))
    sign = np.ones(d)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        sign[-1] = -1.0
    rotation = u @ np.diag(sign) @ vt
    c = 1.0
    if scale:
        variance = (xc**2).sum() / len(x)
        c = float((s * sign).sum() / variance)
    out = np.eye(d + 1)
    out[:d, :d] = c * rotation
    out[:d, d] = my - c * rotation @ mx
    return out


def _least_squares(x: np.ndarray, y: np.ndarray, model: str) -> np.ndarray:
    """The homogeneous fixed → moving matrix of ``model`` fitting ``y ≈ A x + t``."""
    d = x.shape[1]
    if model == "translation":
        out = np.eye(d + 1)
        out[:d, d] = (y - x).mean(axis=0)
        return out
    if model in ("rigid", "similarity"):
        return _umeyama(x, y, scale=model == "similarity")
    design = np.hstack([x, np.ones((len(x), 1))])
    solution, *_ = np.linalg.lstsq(design, y, rcond=None)  # (D + 1, D)
    out = np.eye(d + 1)
    out[:d, :] = solution.T
    return out


def fit_landmarks(
    fixed_points,
    moving_points,
    model: str = "affine",
    *,
    fixed_grid: Grid | None = None,
    moving_grid: Grid | None = None,
) -> AffineTransform:
    """The least-squares linear transform that maps fixed points onto moving points.

    Parameters
    ----------
    fixed_points, moving_points : array-like, shape ``(n, D)``, D = 2 or 3
        Pair ``i`` is ``fixed_points[i]`` in the fixed image and ``moving_points[i]`` in
        the moving image, array-axis order (row, column[, ...] or plane, row, column).
        Pixels when no grids are given; physical coordinates (napari's world
        coordinates) when grids are given. Never modified.
    model : {"translation", "rigid", "similarity", "affine"}
        At least 1, 2 (3 in 3-D), 2 (3 in 3-D) and 3 (4 in 3-D) pairs, not all on one line
        (in one plane) where that leaves the model undetermined.
    fixed_grid, moving_grid : Grid, optional
        The images' pixel size and origin (array order); the fit is then made in
        physical space (a rigid fit is a rotation of the sample) and the points are read
        as physical coordinates. A missing grid is the unit grid.

    Returns
    -------
    AffineTransform
        ``kind=model``; ``matrix`` maps fixed pixels to moving pixels (what
        ``scipy.ndimage.affine_transform`` takes), ``physical_matrix`` fixed physical to
        moving physical coordinates; it carries the grids.
    """
    x, y = _check_pairs(fixed_points, moving_points, model)
    d = x.shape[1]
    for grid, name in ((fixed_grid, "fixed_grid"), (moving_grid, "moving_grid")):
        if grid is not None and (not isinstance(grid, Grid) or grid.ndim != d):
            raise ValueError(f"{name} must be a Grid of {d} axes (as the points), got {grid!r}")
    physical = _least_squares(x, y, model)
    fixed, moving = fixed_grid or unit_grid(d), moving_grid or unit_grid(d)
    matrix = moving.to_pixels() @ physical @ fixed.to_physical()
    return AffineTransform(matrix, kind=model).with_grids(fixed_grid, moving_grid)


def landmark_errors(transform: AffineTransform, fixed_points, moving_points) -> np.ndarray:
    """Distance from each mapped fixed point to its moving point, ``(n,)``.

    In the units of the points: physical where the transform carries grids (the points
    read as in :func:`fit_landmarks`), pixels otherwise.
    """
    x, y = as_point_pairs(fixed_points, moving_points)
    if x.shape[1] != transform.ndim:
        raise ValueError(
            f"fixed_points and moving_points must both have shape (n, {transform.ndim}), "
            f"got {x.shape} and {y.shape}"
        )
    m = transform.physical_matrix
    mapped = x @ m[:-1, :-1].T + m[:-1, -1]
    return np.linalg.norm(mapped - y, axis=1)
