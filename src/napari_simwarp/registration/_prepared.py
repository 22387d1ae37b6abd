"""Image pairs made ready for a run: checked, normalized, pre-blurred, pyramids built.

:func:`prepare_pairs` turns ``N`` pairs of one shape (a fixed image may be shared by every
moving image: a template against many samples) into a :class:`PreparedPairs`, whose
pyramids are batched ``(N or 1, 1, *s)`` tensors that the optimizer runs at once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from .._devices import resolve_device
from ..ops._sampling import affine_grid, grid_inside, grid_sample
from . import _inputs
from .grid import Grid
from .plan import RunOptions
from .pyramid import build_pyramid, gaussian_blur, level_shapes


@dataclass(frozen=True)
class PreparedPairs:
    """What a run over ``count`` pairs needs. Levels are coarse → fine.

    fixed : per level ``(N or 1, 1, *s)``, normalized and pre-blurred (1: one fixed image
        shared by every pair)
    moving : per level ``(N or 1, 1, *s_m)``, likewise (on the fixed grid when
        ``resampled``)
    weights : per level ``(N or 1, 1, *s)`` masks of the fixed pixels the loss counts, or
        None entries (every pixel)
    moving_raw : ``(N or 1, 1, *S_m)`` the moving images as given (float32, float64 kept)
    shape, moving_shape : full-resolution spatial shapes
    fixed_grid, moving_grid : pixel sizes and origins
    resampled : a dense run whose moving image was resampled onto the fixed grid
    device, levels, count : where the run is, its pyramid levels, its pairs (``N``)
    """

    fixed: list
    moving: list
    weights: list
    moving_raw: torch.Tensor
    shape: tuple
    moving_shape: tuple
    fixed_grid: Grid
    moving_grid: Grid
    resampled: bool
    device: torch.device
    levels: int
    count: int = 1

    def pair(self, i: int) -> PreparedPairs:
        """Pair ``i`` alone (views of the batched tensors)."""

        def one(t):
            return None if t is None else t[min(i, t.shape[0] - 1)][None]

        return replace(
            self,
            fixed=[one(t) for t in self.fixed],
            moving=[one(t) for t in self.moving],
            weights=[one(t) for t in self.weights],
            moving_raw=one(self.moving_raw),
            count=1,
        )


def _names(name: str, n: int, batched: bool) -> list[str]:
    return [f"{name}[{i}]" for i in range(n)] if batched else [name]


def _tensors(images: list, name: str, batched: bool) -> list[torch.Tensor]:
    """Each image as a tensor, all of one shape (checked, named by position)."""
    out = [_inputs.to_tensor(x, n) for x, n in zip(images, _names(name, len(images), batched))]
    first = tuple(out[0].shape)
    for i, t in enumerate(out[1:], 1):
        if tuple(t.shape) != first:
            raise ValueError(
                f"the images of {name} must all have one shape: {name}[0] has shape "
                f"{first}, {name}[{i}] {tuple(t.shape)}; register pairs of other shapes "
                "in runs of their own"
            )
    return out


def _prepare_mask(mask, shape, device, name: str = "mask"):
    """A mask as ``(1, 1, *S)`` float32 on ``device``: 1 where it is non-zero."""
    if mask is None:
        return None
    m = mask.detach() if isinstance(mask, torch.Tensor) else torch.as_tensor(np.asarray(mask))
    if tuple(m.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have the fixed image's shape {tuple(shape)}, got {tuple(m.shape)}"
        )
    if m.is_complex():
        raise TypeError(f"{name} must hold real numbers or booleans, got {m.dtype}")
    if m.is_floating_point() and not bool(torch.isfinite(m).all()):
        raise ValueError(
            f"{name} contains NaN or infinite values; expected non-zero where the "
            "fixed image should be matched and 0 elsewhere"
        )
    # "Non-zero where the fixed image should be matched", whatever the dtype: a float mask
    # of 0.3 (a PNG read as grey levels) must select, not silently fall under a threshold.
    m = (m != 0).to(torch.float32)
    if float(m.sum()) <= 0:
        raise ValueError(f"{name} selects no pixel (it is 0 everywhere)")
    return m.to(device)[None, None]


def onto_grid(image: torch.Tensor, matrix, shape) -> tuple[torch.Tensor, torch.Tensor]:
    """``image`` ``(N, 1, *S)`` sampled at ``matrix`` (fixed pixels → its pixels, ``(D+1,
    D+1)``) over ``shape``, edge-repeated, and ``(1, 1, *shape)`` 1 where a sample fell
    inside it."""
    # In the image's dtype on its device (no float64 arithmetic on an accelerator): the
    # normalized positions of float32 are within 1e-4 px of float64's up to 2048 px.
    mat = torch.as_tensor(matrix, dtype=image.dtype, device=image.device)[None]
    grid = affine_grid(mat, image.shape[2:], shape)
    out = grid_sample(image, grid, "linear", "nearest")
    return out, grid_inside(grid, image.shape[2:]).to(torch.float32)


def prepare_pairs(
    fixed: list,
    moving: list,
    options: RunOptions,
    masks: list | None,
    device,
    grids,
    *,
    batched: bool = False,
) -> PreparedPairs:
    """Validate, normalize and build pyramids for ``N`` pairs.

    ``fixed`` and ``moving``: lists of images, each of length ``N`` or 1 (one image for
    every pair); ``masks``: None or a list likewise. ``grids`` is ``(fixed_spacing,
    fixed_origin, moving_spacing, moving_origin)`` as the user gave them, one for every
    pair. ``batched``: name the images by position in errors ("fixed[2]").

    Each image is rescaled to its own robust range and blurred by ``options.pre_blur``
    (in the fixed image's finest pixels). The fixed pyramid follows the fixed grid's
    anisotropy (:func:`~.pyramid.shrink_factors`) and the moving one is built to the same
    pixel sizes. A dense model needs both images on one grid: the moving images are then
    resampled onto the fixed grid through the grids alone (physical identity) and the
    pixels they do not cover are left out of the loss; the model composes that resampling
    back into its transforms.
    """
    fs = _tensors(fixed, "fixed", batched)
    ms = _tensors(moving, "moving", batched)
    f, m = fs[0], ms[0]
    if f.dim() != m.dim():
        hint = (
            "; a list of images is a batch of pairs (numpy.stack a list of planes for one volume)"
            if batched
            else ""
        )
        raise ValueError(
            f"fixed and moving must have the same dimensionality, got "
            f"{f.dim()}-D {tuple(f.shape)} and {m.dim()}-D {tuple(m.shape)}{hint}"
        )
    count = max(len(fs), len(ms))
    model = options.model
    _inputs.check_axes_for_model(model, f.shape, "fixed")
    _inputs.check_axes_for_model(model, m.shape, "moving")
    fixed_spacing, fixed_origin, moving_spacing, moving_origin = grids
    fixed_grid = Grid.make(f.dim(), fixed_spacing, fixed_origin, name="fixed")
    moving_grid = Grid.make(m.dim(), moving_spacing, moving_origin, name="moving")
    dev = resolve_device(device)
    dense = options.dense
    _inputs.check_memory(
        count,
        f.shape,
        options.metric,
        dense,
        dev,
        advice="crop or downsample the images, choose metric='mse' or 'ncc', or another device",
    )
    shape, moving_shape = tuple(f.shape), tuple(m.shape)
    levels = options.level_count(shape, fixed_grid.spacing)
    _inputs.check_levels(model, shape, levels, fixed_grid.spacing)
    mask_names = _names("mask", len(masks or []), batched)
    wmasks = [_prepare_mask(w, shape, dev, n) for w, n in zip(masks or [], mask_names)]
    if any(w is not None for w in wmasks):  # a None among masks: every pixel counts
        full = torch.ones(1, 1, *shape, device=dev)
        wmask = torch.cat([full if w is None else w for w in wmasks])
    else:
        wmask = None
    # A light blur of both images takes pixel noise off the gradient and makes bilinear
    # interpolation (exact only for piecewise-linear images) far less biased.
    unit_sigmas = options.blur_sigmas(fixed_grid.spacing)
    moving_sigmas = [options.pre_blur * min(fixed_grid.spacing) / s for s in moving_grid.spacing]
    fn = gaussian_blur(_normalized(fs, "fixed", dev, batched), unit_sigmas)
    mn = gaussian_blur(_normalized(ms, "moving", dev, batched), moving_sigmas)
    fshapes = level_shapes(shape, levels, fixed_grid.spacing)
    resampled = dense and (shape != moving_shape or fixed_grid != moving_grid)
    if resampled:
        onto_fixed = moving_grid.to_pixels() @ fixed_grid.to_physical()
        mn, covered = onto_grid(mn, onto_fixed, shape)
        if float(covered.sum()) == 0:
            raise ValueError(
                "fixed and moving do not overlap in physical space (check fixed_origin, "
                "moving_origin and the spacings); a dense model needs them to overlap"
            )
        wmask = covered if wmask is None else wmask * covered
        mshapes = fshapes
    else:
        mshapes = level_shapes(moving_shape, levels, moving_grid.spacing, min(fixed_grid.spacing))
    weights = (
        [None] * levels
        if wmask is None
        else [(w > 0.5).to(torch.float32) for w in build_pyramid(wmask, fshapes)]
    )
    return PreparedPairs(
        fixed=build_pyramid(fn, fshapes),
        moving=build_pyramid(mn, mshapes),
        weights=weights,
        moving_raw=torch.stack(ms)[:, None].to(dev),
        shape=shape,
        moving_shape=moving_shape,
        fixed_grid=fixed_grid,
        moving_grid=moving_grid,
        resampled=resampled,
        device=dev,
        levels=levels,
        count=count,
    )


def _normalized(images, name: str, device, batched: bool) -> torch.Tensor:
    """``(n, 1, *S)`` float32 on ``device``: each image rescaled to its own robust range
    where it is (a NumPy input on the host: float64 data is rescaled there, not on the
    device), then moved."""
    names = _names(name, len(images), batched)
    out = [_inputs.normalize(t, n).to(device) for t, n in zip(images, names)]
    return torch.stack(out)[:, None]
