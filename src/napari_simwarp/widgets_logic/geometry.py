"""Applying a run's transforms to other layers, and showing a linear one through napari's
``affine`` without resampling. No Qt, no napari.
"""

from __future__ import annotations

import numpy as np

from ..registration.grid import Grid


def layer_grid(layer, role: str, skip: int = 0) -> Grid:
    """Where a napari layer's pixels are: its ``scale`` and ``translate`` as a
    :class:`~napari_simwarp.registration.grid.Grid` (the first ``skip`` axes, a time axis,
    left out).

    Registration places images by pixel size and origin only; a layer that napari also
    rotates, shears, flips or transforms by its ``affine`` is refused with a message
    that says so, never silently registered as if it were not.
    """
    name = getattr(layer, "name", role)
    ndim = len(layer.scale)
    placed = []
    affine = getattr(layer, "affine", None)
    if affine is not None and not np.allclose(np.asarray(affine.affine_matrix), np.eye(ndim + 1)):
        placed.append("an affine")
    rotate = getattr(layer, "rotate", None)
    if rotate is not None and not np.allclose(np.asarray(rotate), np.eye(ndim)):
        placed.append("a rotation")
    shear = getattr(layer, "shear", None)
    if shear is not None and not np.allclose(np.asarray(shear), 0):
        placed.append("a shear")
    scale = np.asarray(layer.scale, np.float64)[skip:]
    if np.any(scale <= 0):
        placed.append(f"a flip (scale {tuple(float(s) for s in scale)})")
    if placed:
        raise ValueError(
            f"the {role} layer {name!r} is placed with {' and '.join(placed)}; registration "
            "uses each layer's scale and translate only. Reset it (layer.affine, rotate and "
            "shear to identity, a positive scale) or resample the layer first."
        )
    return Grid.make(ndim - skip, scale, np.asarray(layer.translate, np.float64)[skip:], name=role)


def for_moving_grid(transform, grid: Grid):
    """``transform`` for a moving image placed on ``grid`` (another layer of the moving
    image's world: a label layer at another resolution, say). Linear transforms are
    re-expressed through their physical matrix; a dense one must keep its own grid."""
    fixed_grid, moving_grid = transform.grids()
    if grid == moving_grid:
        return transform
    physical = getattr(transform, "physical_matrix", None)
    if physical is None:
        raise ValueError(
            "this layer's scale or translate differs from the moving layer's; a dense "
            "transform applies only to layers on the moving layer's grid"
        )
    matrix = grid.to_pixels() @ physical @ fixed_grid.to_physical()
    return type(transform)(matrix, transform.kind).with_grids(fixed_grid, grid)


def apply_transforms(transforms, data, labels: bool = False, output_shape=None) -> np.ndarray:
    """Resample another layer's ``data`` with a run's transform(s).

    One transform: ``data`` is ``(*C, *S)`` (leading axes resampled alike). One per
    frame: ``data`` is ``(T, *S)`` with T frames. Labels use nearest-neighbor (order 0)
    and keep their dtype.
    """
    arr = np.asarray(data)
    order = 0 if labels else 1
    if len(transforms) == 1:
        return transforms[0].apply(arr, order=order, output_shape=output_shape)
    if arr.shape[0] != len(transforms):
        raise ValueError(
            f"the layer must have one frame per transform ({len(transforms)}), "
            f"got shape {arr.shape}"
        )
    return np.stack([t.apply(frame, order=order) for t, frame in zip(transforms, arr)])


def _scale_translate(scale, translate) -> np.ndarray:
    """Homogeneous matrix of ``x ↦ diag(scale) x + translate``."""
    scale = np.asarray(scale, np.float64)
    out = np.eye(len(scale) + 1)
    out[:-1, :-1] = np.diag(scale)
    out[:-1, -1] = np.asarray(translate, np.float64)
    return out


def layer_affine(transform, fixed_geometry=None, moving_geometry=None) -> np.ndarray:
    """The affine to give the moving layer so it shows aligned without resampling.

    The transform's matrix ``M`` maps fixed to moving data coordinates. napari applies a
    layer's ``affine`` after its own scale and translate (``world = A · T_moving · q``),
    and the fixed layer shows data ``p`` at ``T_fixed · p``; so moving data ``q``, which
    belongs at fixed data ``M⁻¹ q``, needs ``A = T_fixed · M⁻¹ · T_moving⁻¹``.

    ``fixed_geometry`` / ``moving_geometry``: ``(scale, translate)`` of the layers (identity
    when None).
    """
    matrix = getattr(transform, "matrix", None)
    if matrix is None:
        raise ValueError(
            "only linear models (translation, rigid, similarity, affine) can be "
            "shown through the layer's affine; apply the transform instead"
        )
    inverse = np.linalg.inv(np.asarray(matrix, np.float64))
    d = inverse.shape[0] - 1
    t_fixed = _scale_translate(*fixed_geometry) if fixed_geometry else np.eye(d + 1)
    t_moving = _scale_translate(*moving_geometry) if moving_geometry else np.eye(d + 1)
    return t_fixed @ inverse @ np.linalg.inv(t_moving)
