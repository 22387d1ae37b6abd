"""register_stack's optimizer route: any model by the generic optimizer
(:func:`~.optimize.optimize`) with the frames of a batch as its pairs, started from the
phase-correlation shift, run as :func:`~.pair.register` runs a pair (one
:class:`~.plan.RunOptions`: its pre-blur, levels, schedule and models)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ops import compose
from . import _inputs
from ._batches import batches
from ._driver import drive, relay
from ._names import LINEAR_MODELS
from ._stack_batches import (
    StackProgress,
    _batch_done,
    _identity,
    _read_pairs,
    _reference_frame,
    _shift_matrices,
    _start_candidates,
)
from ._stack_translation import _aligned_mean, _translation_passes
from .drift import clip_unit, phase_correlation, select_shifts
from .grid import Grid
from .optimize import optimize
from .plan import TRANSLATION_ROUTE_ITERATIONS, RunOptions, build_model
from .pyramid import build_pyramid, gaussian_blur, level_shapes
from .transforms import AffineTransform, DisplacementTransform


def _mean_reference(runner, total, batch, value_range):
    """The mean of the drift-corrected frames and where every frame covers it (see
    :func:`_aligned_mean`), for the optimizer route: the frames are aligned as the
    translation route aligns them to a mean (to the first frame, then to the mean of
    those), so that the mean is as sharp as translations can make it."""
    state = {"stopped": False}
    drift = drive(
        _translation_passes(
            runner, total, batch, value_range, "mean", 0, TRANSLATION_ROUTE_ITERATIONS, [], state
        )
    )
    return _aligned_mean(runner, total, batch, drift, value_range, clipped=False)


def _phase_guess(mc, rc, previous: bool, lead: bool) -> torch.Tensor:
    """Initial shifts ``(n, D)`` of one batch from phase correlation of the clipped frames
    (with ``lead``, the first pair is the one before the batch: its guess is offered to the
    batch's first frame, and it is dropped).

    Each guess is kept only where it matches better than zero (or than the previous
    pair's guess), as ``register`` checks its candidates (:mod:`.search`).
    """
    guess = -phase_correlation(gaussian_blur(rc, 1.0), gaussian_blur(mc, 1.0))
    last = None
    if lead:
        last, guess, mc, rc = guess[0], guess[1:], mc[1:], rc[1:]
    return select_shifts(mc, rc, [guess, *_start_candidates(guess, previous, last)])


@dataclass(frozen=True)
class _OptimizerSettings:
    """What every batch of the optimizer route shares (sent with each task)."""

    options: RunOptions
    shape: tuple
    schedule: object
    levels: int
    grid: Grid
    previous: bool


def _make_model(s: _OptimizerSettings, n: int, init, device):
    return build_model(s.options, n, shape=s.shape, fixed_grid=s.grid, device=device, init=init)


def _optimizer_job(src, sl, history, value_range, ref, mean_mask, s: _OptimizerSettings):
    """The generic optimizer on batch ``sl`` of moving frames (a job returning
    ``(transforms, stopped)``).

    The frames and their references are blurred as register() blurs them (the pre-blur of
    the run's options: less noise on the gradient, less bias from bilinear
    interpolation); linear models start from the phase-correlation guesses.
    ``mean_mask``: ``(mean, mask)`` to match every frame to (where the mask is set; ``ref``
    then only gives the guesses), or None. Every frame and the reference lie on
    ``s.grid``; the pyramid follows its anisotropy.
    """
    f, r, lead = _read_pairs(src, sl, value_range, ref, s.previous, clipped=False)
    init = None
    if not s.options.dense:
        init = _shift_matrices(_phase_guess(clip_unit(f), clip_unit(r), s.previous, lead))
    if lead:
        f, r = f[1:], r[1:]
    mean, mask = (None, None) if mean_mask is None else mean_mask
    refs = r if mean is None else mean
    shapes = level_shapes(s.shape, s.levels, s.grid.spacing)
    weights = (
        [None] * s.levels
        if mask is None
        else [(w > 0.5).to(mask.dtype) for w in build_pyramid(mask, shapes)]
    )
    mdl = _make_model(s, f.shape[0], init, f.device)
    sigma = s.options.blur_sigmas(s.grid.spacing)

    def convert(progress):
        return StackProgress(
            progress.level,
            progress.levels,
            progress.iteration,
            progress.pending_loss,  # read only if someone looks (no host sync here)
            sl,
            lambda: progress.transforms,
        )

    stopped, _ = yield from relay(
        optimize(
            mdl,
            build_pyramid(gaussian_blur(refs, sigma), shapes),
            build_pyramid(gaussian_blur(f, sigma), shapes),
            weights,
            s.schedule,
            history,
            spacing=s.grid.spacing,
        ),
        convert,
    )
    return mdl.transforms(), stopped


def _optimizer_route(
    runner, value_range, reference, ref_index, batch, history, state, *, grid, options
):
    """Any model by the generic optimizer (a generator returning one transform per frame)."""
    src = runner.src
    shape = src.frame_shape
    previous = reference == "previous"
    total = src.total - previous
    mean_mask = None
    if reference == "mean":
        mean_mask = _mean_reference(runner, src.total, batch, value_range)
    levels = options.level_count(shape, grid.spacing)
    _inputs.check_levels(options.model, shape, levels, grid.spacing)
    settings = _OptimizerSettings(
        options=options,
        shape=shape,
        schedule=options.schedule(shape, levels, min(grid.spacing)),
        levels=levels,
        grid=grid,
        previous=previous,
    )
    # the reference frame gives the linear models' starting guesses (also for "mean")
    index = 0 if mean_mask is not None else ref_index
    ref = None if previous else runner.value(_reference_frame, index, value_range, False)
    parts = yield from runner.map(
        _optimizer_job,
        total,
        batch,
        value_range,
        ref,
        mean_mask,
        settings,
        history=history,
        state=state,
        progress=_batch_done(lambda transforms: transforms),
    )
    transforms = []
    for part, sl in zip(parts, batches(total, batch)):
        transforms += part or [_identity(options.model, shape, grid)] * (sl.stop - sl.start)
    del parts  # the batches' lists: _chain frees each pair's field as it goes
    if previous:
        transforms = _chain(transforms, options.model, shape, grid)
    return transforms


def _chain(pairwise, model, shape, grid: Grid):
    """Transforms of frame t−1 → t (pairwise) to reference (frame 0) → frame t.

    Linear: the matrices multiply (pixel matrices of one grid compose as the physical
    ones do). Dense: ``d_t = compose(p_t, d_{t−1})``, i.e.
    ``d_t(x) = d_{t−1}(x) + p_t(x + d_{t−1}(x))``.
    """
    out = [_identity(model, shape, grid)]
    if model in LINEAR_MODELS:
        for p in pairwise:
            out.append(AffineTransform(p.matrix @ out[-1].matrix, model).with_grids(grid, grid))
        return out
    current = torch.zeros(1, len(shape), *shape)
    for i, p in enumerate(pairwise):
        pairwise[i] = None  # each pair's field freed once chained: T fields held, not 2T
        current = compose(torch.as_tensor(p.to_displacement(shape))[None], current)
        out.append(DisplacementTransform(current[0].numpy()).with_grids(grid, grid))
    return out
