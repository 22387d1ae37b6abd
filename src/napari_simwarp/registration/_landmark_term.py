"""Landmarks in a registration run: the starting transform and the soft constraint
(docs/maths.md §12.1).

``landmarks = (fixed_points, moving_points)``, each ``(n, D)`` in its image's *physical*
coordinates, array-axis order (napari's world coordinates of points drawn on layers whose
``scale``/``translate`` are the images' spacing/origin; pixel coordinates with the default
unit grids), the convention of :func:`~.landmarks.fit_landmarks` with grids.

- :func:`initial_transform` is the least-squares fit of the run's model (a dense model
  starts from the affine fit, as its initial displacement).
- :func:`penalty` is ``weight · mean_i |T(x_i) − y_i|² / u²`` per pair (``u``: the fixed
  image's finest pixel size), differentiable through a linear model's matrix or a dense
  model's displacement sampled at the fixed points.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..io.transform_files.bigwarp import as_point_pairs
from ..ops import affine_to_displacement
from . import _options
from ._names import LINEAR_MODELS
from .landmarks import _check_pairs, fit_landmarks
from .models import LinearModel


def check(landmarks, weight, model: str, ndim: int, init) -> tuple | None:
    """Checked ``(fixed_points, moving_points, weight)`` (new float64 arrays), or None.

    The points must determine the model (dense models: an affine). ``init`` and
    landmarks together are accepted only with ``weight > 0``: init then starts the run and
    the landmarks only constrain it (with weight 0 they would do nothing).
    """
    weight = _options.non_negative(weight, "landmark_weight")
    if landmarks is None:
        if weight > 0:
            raise ValueError(
                "landmark_weight > 0 needs landmarks=(fixed_points, moving_points), got none"
            )
        return None
    if isinstance(landmarks, (str, bytes)) or not hasattr(landmarks, "__len__"):
        raise TypeError(
            f"landmarks must be a pair (fixed_points, moving_points) of (n, {ndim}) arrays, "
            f"got {type(landmarks).__name__}"
        )
    if len(landmarks) != 2:
        raise ValueError(
            f"landmarks must be a pair (fixed_points, moving_points) of (n, {ndim}) arrays, "
            f"got {len(landmarks)} items"
        )
    fit_model = model if model in LINEAR_MODELS else "affine"
    try:
        x, _ = as_point_pairs(landmarks[0], landmarks[1])
        if x.shape[1] != ndim:
            raise ValueError(
                f"the points are {x.shape[1]}-D, the images {ndim}-D; expected two "
                f"(n, {ndim}) arrays in array-axis order"
            )
        x, y = _check_pairs(landmarks[0], landmarks[1], fit_model)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"landmarks: {exc}") from None
    if init is not None and weight == 0:
        raise ValueError(
            "init and landmarks were both given with landmark_weight=0: the landmarks would "
            "be unused. Give one of them, or landmark_weight > 0 to start from init and keep "
            "the landmarks as a soft constraint"
        )
    return x, y, weight


def initial_transform(x, y, model: str, fixed_grid, moving_grid, shape):
    """The run's ``init``: the least-squares :class:`~.transforms.AffineTransform` for a
    linear model; for a dense one the affine fit as a displacement ``(D, *shape)`` in the
    dense model's frame (fixed pixels → fixed-grid pixels of the moving image, which a
    dense run first resamples onto the fixed grid: ``G_f⁻¹ · P · G_f``)."""
    if model in LINEAR_MODELS:
        return fit_landmarks(x, y, model, fixed_grid=fixed_grid, moving_grid=moving_grid)
    fit = fit_landmarks(x, y, "affine", fixed_grid=fixed_grid, moving_grid=moving_grid)
    frame = fixed_grid.to_pixels() @ fit.physical_matrix @ fixed_grid.to_physical()
    d = affine_to_displacement(torch.as_tensor(frame), tuple(shape))
    return d[0].to(torch.float32).numpy()


def penalty(mdl, x, y, weight: float, fixed_grid, moving_grid, full_shape):
    """``penalty(level_shape) -> (N,)``: the landmark term of ``mdl`` at a pyramid level.

    ``x``, ``y``: ``(n, D)`` physical fixed and moving points. The distance is physical,
    counted in the fixed image's finest pixel size, so a weight means the same thing
    whatever the units of the spacings.
    """
    unit = min(fixed_grid.spacing)
    d = x.shape[1]
    # Fixed points in full-resolution fixed pixels (homogeneous, float64).
    p = np.hstack([x, np.ones((len(x), 1))]) @ fixed_grid.to_pixels().T
    if isinstance(mdl, LinearModel):
        wide = mdl.wide
        p_t = torch.as_tensor(p, dtype=wide, device=mdl.shift.device)
        y_t = torch.as_tensor(y, dtype=wide, device=mdl.shift.device)
        to_phys = torch.as_tensor(moving_grid.to_physical(), dtype=wide, device=p_t.device)

        def linear(shape):
            mapped = (to_phys @ mdl.matrix() @ p_t.T)[:, :d].transpose(1, 2)  # (N, n, D)
            return _mean_square(mapped - y_t, unit, weight)

        return linear

    device = mdl.device
    dtype = mdl.dtype
    # The dense model maps fixed pixel q to fixed-grid pixel q + d(q) of the (resampled)
    # moving image: physical G_f (q + d(q)).
    to_phys = torch.as_tensor(fixed_grid.to_physical(), dtype=torch.float64, device=device)
    q = torch.as_tensor(p[:, :d], dtype=torch.float64, device=device)
    y_t = torch.as_tensor(y, dtype=torch.float64, device=device)
    full = torch.as_tensor(full_shape, dtype=torch.float64, device=device)
    # align_corners=False: full-resolution pixel q sits at (2q + 1) / N − 1 at every level
    # (the convention of the pyramid's resize), grid_sample's last axis first.
    where = ((2 * q + 1) / full - 1).flip(-1).to(dtype)
    where = where.view(1, len(x), *([1] * (d - 1)), d)

    def dense(shape):
        field = mdl.displacement(tuple(shape))  # (N, D, *shape), level pixels
        n = field.shape[0]
        scale = torch.tensor([f / s for f, s in zip(full_shape, shape)], dtype=field.dtype)
        field = field * scale.to(field.device).view(1, d, *([1] * d))
        grid = where.expand(n, *where.shape[1:])
        mode = "bilinear"
        at = F.grid_sample(field, grid, mode=mode, padding_mode="border", align_corners=False)
        at = at.reshape(n, d, len(x)).transpose(1, 2).double()  # (N, n, D) full pixels
        moved = q + at
        mapped = moved @ to_phys[:d, :d].T + to_phys[:d, d]
        return _mean_square(mapped - y_t, unit, weight)

    return dense


def _mean_square(diff: torch.Tensor, unit: float, weight: float) -> torch.Tensor:
    """``weight · mean_i |diff_i|² / unit²`` per pair: ``(N,)`` (the dtype of ``diff``)."""
    return weight * (diff * diff).sum(-1).mean(-1) / unit**2
