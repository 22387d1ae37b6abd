"""What every route of register_stack shares: its progress snapshots, the frames of a batch
as the estimates read them, and small conversions (shift matrices, identities)."""

from __future__ import annotations

import numpy as np
import torch

from ._batches import batches
from ._names import LINEAR_MODELS
from .drift import clip_unit
from .grid import Grid
from .optimize import Progress
from .transforms import AffineTransform, DisplacementTransform


class StackProgress(Progress):
    """One snapshot of a stack run: a :class:`~.optimize.Progress` of one batch of frames.

    ``frames`` is the slice of the batch being aligned (indices of the moving frames: with
    ``reference="previous"`` moving frame ``i`` is stack frame ``i + 1``), and
    ``transforms`` that batch's best transforms so far. A run here gives one per
    iteration; a run on a ``dask.distributed`` cluster one per finished batch (in the
    order they finish), with that batch's final transforms and loss.
    """

    def __init__(self, level, levels, iteration, loss, frames: slice, make_transforms):
        super().__init__(level, levels, iteration, loss, make_transforms)
        self.frames = frames

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, frames={self.frames.start}:{self.frames.stop})"


def _halve(x: torch.Tensor) -> torch.Tensor:
    """2× box downsampling over the spatial axes (pixel-center convention: shifts halve)."""
    pool = torch.nn.functional.avg_pool2d if x.dim() == 4 else torch.nn.functional.avg_pool3d
    return pool(x, 2)


def _start_candidates(init, previous, last):
    """Starting points checked against the phase-correlation guess ``init``: zero and, for
    ``reference="previous"`` (consecutive pairs), the guess of the pair before (``last``:
    the final shift of the previous batch, or None)."""
    zero = torch.zeros_like(init)
    if not previous:
        return [zero]
    before = zero[:1] if last is None else last.reshape(1, -1).to(init)
    return [zero, torch.cat([before, init[:-1]])]


def _shift_matrices(shifts: torch.Tensor) -> torch.Tensor:
    n, d = shifts.shape
    m = torch.eye(d + 1, dtype=torch.float64).repeat(n, 1, 1)
    m[:, :d, d] = shifts.double().cpu()
    return m


def _identity(model, shape, grid: Grid):
    d = len(shape)
    if model in LINEAR_MODELS:
        return AffineTransform(np.eye(d + 1), model).with_grids(grid, grid)
    return DisplacementTransform(np.zeros((d, *shape), np.float32)).with_grids(grid, grid)


# -- reading batches ----------------------------------------------------------------------


def _read(src, sl, value_range, clipped: bool) -> torch.Tensor:
    """Frames ``sl`` normalized to the stack's ``value_range`` (``(n, 1, *S)``), and
    clipped to ``[0, 1]`` when ``clipped`` (what the shift estimates see)."""
    frames = src.normalized(sl, value_range)
    return clip_unit(frames) if clipped else frames


def _reference_frame(src, index, value_range, clipped: bool) -> torch.Tensor:
    """The reference frame ``index`` as :func:`_read` reads it, ``(1, 1, *S)``: read once
    and shared by every batch."""
    return _read(src, slice(index, index + 1), value_range, clipped)


def _read_pairs(src, sl, value_range, ref, previous: bool, clipped: bool):
    """Batch ``sl``'s moving frames ``(n, 1, *S)`` and references ``(1 or n, 1, *S)``, and
    whether a lead pair comes first.

    With ``previous``, moving frame ``i`` is stack frame ``i + 1`` and its reference frame
    ``i``; the pair before the batch is read too, when there is one (``lead``): its
    phase-correlation guess is the starting point the batch's first frame is offered, as
    every other frame is offered its predecessor's, so that a batch needs nothing from the
    batches before it (batches run in any order, or at once on a cluster). Otherwise the
    references are ``ref``, the reference frame.
    """
    if previous:
        first = max(sl.start - 1, 0)
        x = _read(src, slice(first, sl.stop + 1), value_range, clipped)
        return x[1:], x[:-1], first < sl.start
    return _read(src, sl, value_range, clipped), ref, False


def _joined(parts, total, batch, missing) -> torch.Tensor:
    """The per-batch tensors ``parts`` joined on the CPU; ``missing(sl)`` for the batches a
    stop left without a result (None)."""
    return torch.cat(
        [
            missing(sl) if part is None else part.cpu()
            for part, sl in zip(parts, batches(total, batch))
        ]
    )


def _batch_done(to_transforms):
    """A converter of a finished batch (its slice, result and loss history) into the one
    :class:`StackProgress` a cluster run yields for it."""

    def progress(sl, result, losses):
        loss = losses[-1] if losses else float("nan")
        return StackProgress(0, 1, len(losses), loss, sl, lambda: to_transforms(result))

    return progress
