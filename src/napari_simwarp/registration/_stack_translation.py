"""register_stack's translation route: a batched phase correlation for the integer-pixel
guess, then batched Gauss–Newton to sub-pixel accuracy (:mod:`.drift`), per batch of
frames; a "mean" reference aligns twice (to the first frame, then to the mean)."""

from __future__ import annotations

import torch

from ..ops import warp_affine
from ._driver import relay
from ._stack_batches import (
    StackProgress,
    _batch_done,
    _halve,
    _joined,
    _read,
    _read_pairs,
    _reference_frame,
    _shift_matrices,
    _start_candidates,
)
from .drift import phase_correlation, refine_translation_iter
from .transforms import AffineTransform


def _translations(shifts: torch.Tensor) -> list:
    return [AffineTransform(m.numpy(), "translation") for m in _shift_matrices(shifts)]


def _shift_progress(sl: slice, scale: float, history: list):
    """A converter of :class:`~.drift.TranslationStep` s of batch ``sl`` to StackProgress."""

    def convert(step):
        loss = float(step.loss.mean())
        history.append(loss)
        shifts = (step.shifts * scale).detach().clone()
        return StackProgress(0, 1, step.iteration, loss, sl, lambda: _translations(shifts))

    return convert


def _translation_job(src, sl, history, value_range, ref, iterations, previous, full_iterations=1):
    """Phase correlation + Gauss–Newton of batch ``sl`` of moving frames (a job: a
    generator yielding :class:`StackProgress`, returning ``(shifts (n, D), stopped)``).

    Each frame's phase-correlation peak is kept only where it matches better than a zero
    shift (or, with ``previous``, the previous pair's guess): a spurious peak, e.g. from
    hot pixels, is not followed.

    Frames with every side ≥ 256 are first solved at half resolution (a quarter of the
    pixels; the box average also halves the noise), then polished by ``full_iterations``
    Gauss–Newton steps at full resolution, which is where the last hundredths of a pixel
    come from.
    """
    f, r, lead = _read_pairs(src, sl, value_range, ref, previous, clipped=True)
    halve = min(f.shape[2:]) >= 256
    scale = 2.0 if halve else 1.0
    fc, rc = (_halve(f), _halve(r)) if halve else (f, r)
    init = -phase_correlation(rc, fc)
    last = None
    if lead:
        last, init, f, r, fc, rc = init[0], init[1:], f[1:], r[1:], fc[1:], rc[1:]
    alternatives = _start_candidates(init, previous, last)
    shifts, _, stopped = yield from relay(
        refine_translation_iter(fc, rc, init, iterations=iterations, alternatives=alternatives),
        _shift_progress(sl, scale, history),
    )
    shifts = shifts * scale
    if halve and not stopped and full_iterations:
        shifts, _, stopped = yield from relay(
            refine_translation_iter(f, r, shifts, iterations=full_iterations),
            _shift_progress(sl, 1.0, history),
        )
    return shifts, stopped


def _refine_job(src, sl, history, value_range, shifts, mean_mask, iterations):
    """Gauss–Newton of batch ``sl`` from ``shifts[sl]`` against one mean reference, where
    its mask says it is a real image (a job)."""
    mean, mask = mean_mask
    frames = _read(src, sl, value_range, clipped=True)
    refined, _, stopped = yield from relay(
        refine_translation_iter(
            frames,
            mean,
            shifts[sl].to(frames.device),
            iterations=iterations,
            reference_mask=mask,
        ),
        _shift_progress(sl, 1.0, history),
    )
    return refined, stopped


def _mean_part(src, sl, shifts, value_range, clipped):
    """Batch ``sl``'s share of an aligned mean (a job): the sum of its frames aligned by
    ``shifts[sl]`` and where all of them cover, each ``(1, 1, *S)``."""
    frames = _read(src, sl, value_range, clipped)
    m = _shift_matrices(shifts[sl]).to(frames)
    moved = warp_affine(frames, m, padding="nearest").sum(dim=0, keepdim=True)
    cover = warp_affine(torch.ones_like(frames[:1]), m, padding="grid-constant")
    return moved, cover.amin(dim=0, keepdim=True)


def _add_mean_parts(a, b):
    return a[0] + b[0], torch.minimum(a[1], b[1])


def _mean_of(src, parts, total):
    """``(mean, mask)`` from the summed parts: only where every frame contributed is the
    mean a real image (not edge smear), so it is matched there only."""
    total_sum, covered = parts
    return total_sum / total, (covered > 0.999).to(total_sum.dtype)


def _aligned_mean(runner, total, batch, shifts, value_range, clipped):
    """The mean of the frames aligned by ``shifts`` and where every frame covers it,
    ``(mean (1, 1, *S), mask (1, 1, *S))``, summed batch by batch (a runner's value)."""
    parts = runner.reduce(_mean_part, _add_mean_parts, total, batch, shifts, value_range, clipped)
    return runner.value(_mean_of, parts, total)


def _translation_passes(
    runner, total, batch, value_range, reference, ref_index, its, history, state
):
    """Per-frame shifts ``(T or T - 1, D)`` on the CPU (a generator): to the reference
    frame, or (``"previous"``) each frame to the one before, or (``"mean"``) to the first
    frame, then again to the mean of the frames so aligned."""
    previous = reference == "previous"
    moving = total - previous
    ref = None if previous else runner.value(_reference_frame, ref_index, value_range, True)
    parts = yield from runner.map(
        _translation_job,
        moving,
        batch,
        value_range,
        ref,
        its,
        previous,
        history=history,
        state=state,
        progress=_batch_done(_translations),
    )
    d = len(runner.src.frame_shape)
    shifts = _joined(parts, moving, batch, lambda sl: torch.zeros(sl.stop - sl.start, d))
    if reference == "mean" and not state["stopped"]:
        mean_mask = _aligned_mean(runner, total, batch, shifts, value_range, clipped=True)
        parts = yield from runner.map(
            _refine_job,
            total,
            batch,
            value_range,
            shifts,
            mean_mask,
            its,
            history=history,
            state=state,
            progress=_batch_done(_translations),
        )
        first = shifts  # frames a stop leaves unrefined keep their first shifts
        shifts = _joined(parts, total, batch, lambda sl: first[sl])
    return shifts


def _translation_route(
    runner, value_range, reference, ref_index, batch, iterations, history, state, grid
):
    """Per-frame translations (a generator returning one AffineTransform per frame, on
    ``grid``); ``iterations``: of each Gauss–Newton pass."""
    shifts = yield from _translation_passes(
        runner, runner.src.total, batch, value_range, reference, ref_index, iterations,
        history, state,
    )  # fmt: skip
    if reference == "previous":
        shifts = torch.cat([shifts.new_zeros(1, shifts.shape[1]), torch.cumsum(shifts, dim=0)])
    return [
        AffineTransform(m.numpy(), "translation").with_grids(grid, grid)
        for m in _shift_matrices(shifts)
    ]
