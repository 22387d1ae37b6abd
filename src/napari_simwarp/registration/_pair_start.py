"""Where a pair's run starts: the user's ``init`` checked and carried into the model's
frame, and, for linear models without one, the phase-correlation shift and the search of
:mod:`.search` (docs/maths.md §6)."""

from __future__ import annotations

import numpy as np
import torch

from ..ops import affine_to_displacement
from ..ops._sampling import level_matrix
from . import _options, search
from ._prepared import PreparedPairs, onto_grid
from .drift import phase_correlation
from .plan import RunOptions, build_model
from .transforms import AffineTransform, DisplacementTransform


def model_for(prep: PreparedPairs, options: RunOptions, starts: list):
    """The model of a run over ``prep``'s pairs, started from ``starts`` (one user ``init``
    per pair, or one for all; None entries: the grids' identity), each checked: a finite
    matrix or an AffineTransform for linear models; a finite displacement of the fixed
    image's shape or a Transform for dense ones."""
    grids = (prep.fixed_grid, prep.moving_grid)
    ndim = len(prep.shape)
    if options.dense:
        if prep.resampled:
            starts = [_init_onto_resampled(s, prep) for s in starts]
        fields = [_options.init_field(s, prep.shape) for s in starts]
        init = _stacked(fields, np.zeros((ndim, *prep.shape), np.float32))
    else:
        matrices = [_options.init_matrix(s, ndim, grids) for s in starts]
        # a pair given no start among others starts at the grids' identity
        init = _stacked(matrices, prep.moving_grid.to_pixels() @ prep.fixed_grid.to_physical())
    return build_model(
        options,
        prep.count,
        shape=prep.shape,
        fixed_grid=prep.fixed_grid,
        moving_grid=prep.moving_grid,
        moving_shape=prep.moving_shape,
        device=prep.device,
        init=init,
        resampled=prep.resampled,
    )


def _stacked(values: list, identity: np.ndarray):
    """``values`` (arrays or None) as one ``(n, ...)`` array, a None among arrays filled
    with ``identity``; None when all are None (the model's own identity)."""
    given = [v for v in values if v is not None]
    if not given:
        return None
    return np.stack([identity if v is None else v for v in values]).astype(given[0].dtype)


def _init_onto_resampled(init, prep: PreparedPairs):
    """A dense run's ``init`` in the frame of its field when the moving image was resampled
    onto the fixed grid: the field maps fixed pixels into that copy, so positions in the
    moving image's own pixels (a linear init's matrix M, or ``x + d(x)`` of a field from a
    run on the same two grids) are carried there by G_f⁻¹ · G_m.

    Returns a displacement ``(D, *S)`` in fixed pixels, or ``init`` unchanged when it is
    already in that frame (an array, a field of the field of view, None).
    """
    fixed_grid, moving_grid, shape = prep.fixed_grid, prep.moving_grid, prep.shape
    onto_resampled = fixed_grid.to_pixels() @ moving_grid.to_physical()
    if isinstance(init, AffineTransform):
        pixels = _options.init_matrix(init, len(shape), (fixed_grid, moving_grid))
        frame = onto_resampled @ pixels
        return affine_to_displacement(torch.as_tensor(frame), shape)[0].float().numpy()
    if isinstance(init, DisplacementTransform) and init.moving_shape is not None:
        if init.moving_shape != tuple(prep.moving_shape) or init.shape != tuple(shape):
            raise ValueError(
                f"init maps a fixed image of shape {init.shape} into a moving image of shape "
                f"{init.moving_shape}; this pair has shapes {tuple(shape)} and "
                f"{tuple(prep.moving_shape)}"
            )
        d = init.to_displacement(shape)
        axes = np.meshgrid(*(np.arange(n, dtype=np.float64) for n in shape), indexing="ij")
        positions = np.stack(axes) + d  # (D, *S) in the moving image's pixels
        linear, offset = onto_resampled[:-1, :-1], onto_resampled[:-1, -1]
        moved = np.tensordot(linear, positions, axes=1) + offset.reshape(-1, *[1] * len(shape))
        return (moved - np.stack(axes)).astype(np.float32)
    return init


def shift_guess(prep: PreparedPairs, start: np.ndarray) -> np.ndarray:
    """The phase-correlation translation guess of one pair (``prep.count == 1``), a
    full-resolution pixel matrix ``(D+1, D+1)`` after ``start`` (the grids' identity, the
    same). Gradient descent from the identity can lock onto a wrong local minimum when the
    shift is a sizeable part of the image; the phase-correlation peak finds large shifts
    outright, also between images of different extents (a crop and its whole).

    Computed on the finest pyramid level at most 256 pixels a side (cheap), with the
    moving level resampled to the fixed level's pixel size over its own extent. The small
    matrices are float64 on the host; the device only resamples and correlates.
    """
    level = next(
        i for i in reversed(range(len(prep.fixed))) if max(prep.fixed[i].shape[2:]) <= 256 or i == 0
    )
    f, m = prep.fixed[level], prep.moving[level]
    f_shape, m_shape = tuple(f.shape[2:]), tuple(m.shape[2:])
    start_t = torch.as_tensor(start, dtype=torch.float64)[None]
    at_level = level_matrix(start_t, prep.moving_shape, m_shape, prep.shape, f_shape)[0]
    d = len(f_shape)
    # At the identity, fixed level pixel p sits on moving level pixel a·p + b (diagonal a
    # for two grids without rotation); R(r) = m(a·r) puts the moving level on the fixed
    # level's pixel size, where fixed(p) ≈ R(p + b/a).
    a = torch.diagonal(at_level[:d, :d]).clamp_min(1e-12)
    b = at_level[:d, d]
    r_shape = tuple(max(1, round(n / float(k))) for n, k in zip(m_shape, a))
    scale_r = torch.eye(d + 1, dtype=torch.float64)
    scale_r[:d, :d] = torch.diag(a)
    resampled, _ = onto_grid(m, scale_r, r_shape)
    s = phase_correlation(f, resampled)[0].cpu().double()
    delta = -s - b / a  # fixed level pixels
    scale = torch.tensor([n / k for n, k in zip(prep.shape, f_shape)], dtype=torch.float64)
    step = torch.eye(d + 1, dtype=torch.float64)
    step[:d, d] = delta * scale
    return (start_t[0] @ step).numpy()


def searched_starts(
    prep: PreparedPairs, options: RunOptions, model, schedule, unset: list[bool]
) -> list | None:
    """Each pair's starting pixel matrix ``(D+1, D+1)``: for the pairs ``unset`` marks,
    the best of :func:`~.search.initial_guess`'s candidates (rotations up to 30° and shifts
    up to a quarter of the image, the shift guess among them); for the others, and where
    the model's start is best, the model's start. None when no pair moved."""
    # float64 host copies of the model's start (its device matrices are float32 on GPUs)
    starts = list(model.left_host @ model.right_host)  # (N, D+1, D+1), new arrays
    moved = False
    for i in range(prep.count):
        if not unset[i]:
            continue
        one = prep.pair(i)
        guess = search.initial_guess(
            one, starts[i], schedule, options.model, shift_guess(one, starts[i])
        )
        if guess is not None:
            starts[i], moved = guess, True
    return starts if moved else None
