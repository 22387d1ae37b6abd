"""``register_stack``: align every frame of a ``(T, *S)`` stack (drift correction).

Frames are processed in batches on the device, never one by one. Translation (the
default) takes the fast route of :mod:`.drift`: a batched phase correlation for the
integer-pixel guess, then batched Gauss–Newton to sub-pixel accuracy. Other models run the
generic optimiser with the frames as the batch, started from the phase-correlation shift.

References: ``"first"`` (frame 0), an int (that frame), ``"mean"`` (align to the first
frame, average the aligned frames, align again to that average) and ``"previous"`` (each
frame to the one before, transforms chained, which follows slow changes of appearance at
the price of accumulating error).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from . import _inputs, _ops
from .api import build_schedule, level_iterations
from .drift import clip_unit, phase_correlation, refine_translation, select_shifts
from .metrics import METRICS, get_loss
from .models import LINEAR_MODELS, MODELS, DenseModel, LinearModel
from .optimise import Progress, optimise
from .pyramid import auto_levels, build_pyramid, gaussian_blur, level_shapes
from .transforms import AffineTransform, DisplacementTransform

REFERENCES = ("first", "previous", "mean")


@dataclass
class StackRegistrationResult:
    """What :func:`register_stack` returns.

    transforms : one transform per frame, mapping reference coordinates to the frame's
    warped : the aligned stack, float32 NumPy ``(T, *S)``
    loss_history : mean loss per iteration (all batches)
    """

    transforms: list
    warped: np.ndarray
    loss_history: list = field(default_factory=list)
    stopped: bool = False
    reference: object = "first"
    model: str = "translation"
    device: str = "cpu"
    seconds: float = 0.0

    @property
    def shifts(self) -> np.ndarray:
        """``(T, D)`` translations (array order, pixels), for linear models."""
        return np.stack([t.translation for t in self.transforms])


class _Stop(Exception):
    pass


def _batches(total: int, size: int):
    for start in range(0, total, size):
        yield slice(start, min(total, start + size))


def _auto_batch(shape, metric, dense, device, total) -> int:
    free = _inputs.available_memory(device)
    per = _inputs.estimate_bytes(1, shape, metric, dense)
    if free is None:
        return min(total, 64)
    fit = int(0.5 * free // max(per, 1))
    if fit < 1:
        _inputs.check_memory(1, shape, metric, dense, device)  # raises with the figures
    return max(1, min(total, fit))


def _halve(x: torch.Tensor) -> torch.Tensor:
    """2× box downsampling over the spatial axes (pixel-centre convention: shifts halve)."""
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


def _translation_shifts(frames, refs, batch, callback, history, state, iterations,
                        full_iterations=1, previous=False):
    """Phase correlation + Gauss–Newton, batch by batch; ``refs`` ``(1 or T, 1, *S)``.

    Each frame's phase-correlation peak is kept only where it matches better than a zero
    shift (or, with ``previous``, the previous pair's shift): a spurious peak, e.g. from hot
    pixels, is not followed.

    Frames with every side ≥ 256 are first solved at half resolution (a quarter of the
    pixels; the box average also halves the noise), then polished by ``full_iterations``
    Gauss–Newton steps at full resolution, which is where the last hundredths of a pixel
    come from.
    """
    out = []
    halve = min(frames.shape[2:]) >= 256
    for sl in _batches(frames.shape[0], batch):
        f = frames[sl]
        r = refs if refs.shape[0] == 1 else refs[sl]
        fc, rc = (_halve(f), _halve(r)) if halve else (f, r)
        init = phase_correlation(fc, rc)
        last = out[-1][-1] / (2.0 if halve else 1.0) if out else None
        alternatives = _start_candidates(init, previous, last)

        def report(iteration, loss, shifts, sl=sl, scale=2.0 if halve else 1.0):
            history.append(float(loss.mean()))
            if callback is None:
                return False
            return bool(callback(0, iteration, float(loss.mean()), sl, shifts * scale))

        shifts, _, stopped = refine_translation(fc, rc, init, iterations=iterations,
                                                callback=report, alternatives=alternatives)
        if halve and not stopped and full_iterations:
            shifts, _, stopped = refine_translation(
                f, r, 2 * shifts, iterations=full_iterations,
                callback=lambda i, loss, s, sl=sl: report(i, loss, s / 2, sl))
        elif halve:
            shifts = 2 * shifts
        out.append(shifts)
        if stopped:
            state["stopped"] = True
            # Frames not reached keep the identity.
            rest = frames.shape[0] - sl.stop
            if rest:
                out.append(torch.zeros(rest, shifts.shape[1], dtype=shifts.dtype,
                                       device=shifts.device))
            break
    return torch.cat(out)


def _shift_matrices(shifts: torch.Tensor) -> torch.Tensor:
    n, d = shifts.shape
    m = torch.eye(d + 1, dtype=torch.float64).repeat(n, 1, 1)
    m[:, :d, d] = shifts.double().cpu()
    return m


def _optimise_frames(frames, refs, model, metric, schedule, levels, batch, grid_spacing,
                     steps, callback, history, state, init_mats, ref_mask=None):
    """Generic optimiser on batches of frames; returns a list of models.

    ``ref_mask`` ``(1, 1, *S)``: where the reference may be matched (None: everywhere).
    """
    shape = tuple(frames.shape[2:])
    shapes = level_shapes(shape, levels)
    weights = [None] * levels if ref_mask is None else [
        (w > 0.5).to(frames.dtype) for w in build_pyramid(ref_mask, shapes)]
    loss_fn = get_loss(metric)
    transforms = []
    for sl in _batches(frames.shape[0], batch):
        f = frames[sl]
        r = refs if refs.shape[0] == 1 else refs[sl]
        n = f.shape[0]
        if model in LINEAR_MODELS:
            mdl = LinearModel(model, shape, shape, n, init=init_mats[sl], device=f.device)
        else:
            mdl = DenseModel(model, shape, n, grid_spacing=grid_spacing, steps=steps,
                             device=f.device)
        loop = optimise(mdl, build_pyramid(r, shapes), build_pyramid(f, shapes),
                        weights, loss_fn, schedule, history)
        signal = None
        while True:
            try:
                progress = loop.send(signal)
            except StopIteration as done:
                stopped = done.value[0]
                break
            signal = bool(callback(progress.level, progress.iteration, progress.loss, sl,
                                   progress)) if callback is not None else None
        transforms.append(mdl)
        if stopped:
            state["stopped"] = True
            break
    return transforms


def register_stack(stack, *, reference="first", model="translation", metric="lncc",
                   levels="auto", iterations=None, lr=None, tol=1e-4, window=None,
                   grid_spacing=8.0, regularisation=None, steps=7, batch_size="auto",
                   device="auto", callback=None, report_every=5,
                   full_resolution=None) -> StackRegistrationResult:
    """Align every frame of ``stack`` to a reference (drift correction of a time-lapse).

    Parameters
    ----------
    stack : array-like or torch.Tensor, shape ``(T, H, W)`` or ``(T, D, H, W)``
        Any numeric dtype and range; not modified.
    reference : "first", "previous", "mean" or int
    model : {"translation", "rigid", "similarity", "affine", "deformable", "diffeomorphic"}
        "translation" uses phase correlation and Gauss–Newton (``metric`` is then not used:
        the refinement is least squares on locally normalised intensities).
    batch_size : "auto" or int
        Frames per batch on the device (auto: as many as half the free memory holds).
    callback : callable(info) -> bool, optional
        Called with a :class:`~.optimise.Progress`-like snapshot (``level``, ``iteration``,
        ``loss``; ``frames``, the slice of frames in the current batch); True stops.
    Other knobs as in :func:`~.api.register`.

    Returns
    -------
    StackRegistrationResult
        ``.transforms`` (one per frame), ``.warped`` ``(T, *S)`` float32, ``.shifts``.
    """
    start = time.perf_counter()
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(map(repr, MODELS))}, got {model!r}")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(map(repr, METRICS))}, got "
                         f"{metric!r}")
    raw = _inputs.to_tensor(stack, "stack", leading=1)
    total = raw.shape[0]
    if isinstance(reference, (int, np.integer)) and not isinstance(reference, bool):
        if not -total <= int(reference) < total:
            raise ValueError(f"reference index {reference} is out of range for {total} frames")
        ref_index = int(reference) % total
    elif reference in REFERENCES:
        ref_index = 0
    else:
        raise ValueError(f"reference must be 'first', 'previous', 'mean' or a frame index, "
                         f"got {reference!r}")
    if total < 2 and reference == "previous":
        raise ValueError("reference='previous' needs at least 2 frames")
    dev = _inputs.resolve_device(device)
    shape = tuple(raw.shape[1:])
    dense = model not in LINEAR_MODELS
    batch = (_auto_batch(shape, metric, dense, dev, total) if batch_size == "auto"
             else int(batch_size))
    if batch < 1:
        raise ValueError(f"batch_size must be 'auto' or a positive int, got {batch_size!r}")
    raw_dev = raw.to(dev)
    frames = _inputs.normalise(raw_dev, "stack")[:, None]  # one range for the whole stack
    for t in range(total):
        if float(frames[t].max() - frames[t].min()) <= 0:
            raise ValueError(f"frame {t} of stack is constant; there is nothing to align it by")
    # The shift estimates (phase correlation, Gauss–Newton) see the frames clipped to the
    # robust range, so that hot or saturated pixels cannot dominate them.
    clipped = clip_unit(frames)

    history: list[float] = []
    state = {"stopped": False}
    report = None
    if callback is not None:
        def report(level, iteration, loss, sl, snapshot):
            info = snapshot if isinstance(snapshot, Progress) else _ShiftProgress(
                level, iteration, loss, snapshot)
            info.frames = sl
            return callback(info)

    if reference == "previous":
        moving, refs = frames[1:], frames[:-1]
        moving_c, refs_c = clipped[1:], clipped[:-1]
    else:
        moving, refs = frames, frames[ref_index : ref_index + 1]
        moving_c, refs_c = clipped, clipped[ref_index : ref_index + 1]
    ref_mask = None
    if reference == "mean" and model != "translation":
        # The reference is the mean of the frames after drift correction, so that it is
        # sharp; the model is then fitted against it.
        drift = _translation_shifts(clipped, refs_c, batch, None, [], {}, 10)
        mats = _shift_matrices(drift).to(frames)
        refs = _ops.warp_affine(frames, mats, padding="border").mean(dim=0, keepdim=True)
        # Only where every frame contributed is the mean a real image (not edge smear).
        covered = _ops.warp_affine(torch.ones_like(frames[:1]), mats, padding="zeros")
        ref_mask = (covered.amin(dim=0, keepdim=True) > 0.999).to(frames.dtype)

    if model == "translation":
        its = 10 if iterations is None else int(iterations)
        shifts = _translation_shifts(moving_c, refs_c, batch, report, history, state, its,
                                     previous=reference == "previous")
        if reference == "mean" and not state["stopped"]:
            aligned = _ops.warp_affine(clipped, _shift_matrices(shifts).to(clipped),
                                       padding="border")
            mean = aligned.mean(dim=0, keepdim=True)
            shifts = _refine_to(clipped, mean, shifts, batch, report, history, state, its)
        if reference == "previous":
            shifts = torch.cat([shifts.new_zeros(1, shifts.shape[1]),
                                torch.cumsum(shifts, dim=0)])
        mats = _shift_matrices(shifts)
        transforms = [AffineTransform(m.numpy(), "translation") for m in mats]
    else:
        levels_n = auto_levels(shape) if levels in ("auto", None) else int(levels)
        its = level_iterations(iterations, model, shape, levels_n, full_resolution)
        schedule = build_schedule(model, lr, its, tol, regularisation, report_every,
                                  metric, window)
        # The same light blur as register(): less noise on the gradient, less bias from
        # bilinear interpolation.
        moving, refs = gaussian_blur(moving, 1.0), gaussian_blur(refs, 1.0)
        init = None
        if model in LINEAR_MODELS:
            # Phase-correlation guesses on the clipped frames, each kept only where it
            # matches better than zero (or than the previous pair's guess), as in
            # register()'s initial_shift_matrix.
            guesses, last = [], None
            for sl in _batches(moving.shape[0], batch):
                mc = moving_c[sl]
                rc = refs_c if refs_c.shape[0] == 1 else refs_c[sl]
                guess = phase_correlation(gaussian_blur(mc, 1.0), gaussian_blur(rc, 1.0))
                guess = select_shifts(mc, rc, [guess, *_start_candidates(
                    guess, reference == "previous", last)])
                guesses.append(guess)
                last = guess[-1]
            init = _shift_matrices(torch.cat(guesses))
        models = _optimise_frames(moving, refs, model, metric, schedule, levels_n, batch,
                                  grid_spacing, steps, report, history, state, init,
                                  ref_mask)
        transforms = [t for mdl in models for t in mdl.transforms()]
        transforms += [_identity(model, shape)] * (moving.shape[0] - len(transforms))
        if reference == "previous":
            transforms = _chain(transforms, model, shape)
    warped = _warp_stack(raw_dev, transforms, batch)
    return StackRegistrationResult(transforms=transforms, warped=warped, loss_history=history,
                                   stopped=state["stopped"], reference=reference, model=model,
                                   device=str(dev), seconds=time.perf_counter() - start)


class _ShiftProgress:
    """A snapshot of the translation route, shaped like :class:`~.optimise.Progress`."""

    def __init__(self, level, iteration, loss, shifts):
        self.level, self.levels, self.iteration, self.loss = level, 1, iteration, loss
        self._shifts = shifts.detach().clone()

    @property
    def transforms(self):
        return [AffineTransform(m.numpy(), "translation") for m in _shift_matrices(self._shifts)]

    @property
    def transform(self):
        return self.transforms[0]


def _refine_to(frames, mean, shifts, batch, report, history, state, iterations):
    out = []
    for sl in _batches(frames.shape[0], batch):
        def cb(iteration, loss, s, sl=sl):
            history.append(float(loss.mean()))
            return bool(report(0, iteration, float(loss.mean()), sl, s)) if report else False
        s, _, stopped = refine_translation(frames[sl], mean, shifts[sl], iterations=iterations,
                                           callback=cb)
        out.append(s)
        if stopped:
            state["stopped"] = True
            out.append(shifts[sl.stop:])
            break
    return torch.cat(out)


def _identity(model, shape):
    d = len(shape)
    if model in LINEAR_MODELS:
        return AffineTransform(np.eye(d + 1), model)
    return DisplacementTransform(np.zeros((d, *shape), np.float32))


def _chain(pairwise, model, shape):
    """Transforms of frame t−1 → t (pairwise) to reference (frame 0) → frame t."""
    d = len(shape)
    out = [_identity(model, shape)]
    if model in LINEAR_MODELS:
        for p in pairwise:
            out.append(AffineTransform(p.matrix @ out[-1].matrix, model))
        return out
    # Dense: d_t(x) = d_{t-1}(x) + p_t(x + d_{t-1}(x)).
    current = torch.zeros(1, d, *shape)
    for p in pairwise:
        pt = torch.as_tensor(p.to_displacement(shape))[None]
        current = current + _ops.warp(pt, current, padding="border")
        out.append(DisplacementTransform(current[0].numpy()))
    return out


def _warp_stack(raw, transforms, batch) -> np.ndarray:
    """Resample every raw frame with its transform, in batches on the device."""
    frames = raw[:, None]
    outs = []
    for sl in _batches(frames.shape[0], batch):
        ts = transforms[sl]
        if isinstance(ts[0], AffineTransform):
            mats = torch.as_tensor(np.stack([t.matrix for t in ts])).to(frames)
            outs.append(_ops.warp_affine(frames[sl], mats, padding="zeros"))
        else:
            shape = tuple(frames.shape[2:])
            disp = torch.as_tensor(np.stack([t.to_displacement(shape) for t in ts])).to(frames)
            outs.append(_ops.warp(frames[sl], disp, padding="zeros"))
    return torch.cat(outs)[:, 0].cpu().numpy()
