"""``register_stack``: align every frame of a ``(T, *S)`` stack (drift correction).

Frames are processed in batches on the device, never one by one. Translation (the
default) takes the fast route of :mod:`.drift`: a batched phase correlation for the
integer-pixel guess, then batched Gauss–Newton to sub-pixel accuracy. Other models run the
generic optimizer with the frames as the batch, started from the phase-correlation shift.

References: ``"first"`` (frame 0), an int (that frame), ``"mean"`` (align to the first
frame, average the aligned frames, align again to that average) and ``"previous"`` (each
frame to the one before, transforms chained, which follows slow changes of appearance at
the price of accumulating error).

:func:`register_stack_iter` is the run as a generator (progress out, a stop signal in,
the result returned); :func:`register_stack` drives it with an optional callback.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .._devices import available_memory, resolve_device
from ..ops import compose, warp, warp_affine
from ..ops._validation import check_choice
from . import _inputs, _options
from ._driver import drive, relay
from ._names import LINEAR_MODELS, METRICS, MODELS
from .drift import clip_unit, phase_correlation, refine_translation_iter, select_shifts
from .models import DenseModel, LinearModel
from .optimize import Progress, RunResult, level_iterations, make_schedule, optimize
from .pyramid import auto_levels, build_pyramid, gaussian_blur, level_shapes
from .quality import emit, masked_zncc, problems
from .transforms import AffineTransform, DisplacementTransform

REFERENCES = ("first", "previous", "mean")


@dataclass(kw_only=True)
class StackRegistrationResult(RunResult):
    """What :func:`register_stack` returns.

    transforms : one transform per frame, mapping reference coordinates to the frame's
    warped : the aligned stack, NumPy ``(T, *S)`` (float64 for float64 input, else float32)
    reference : the reference asked for
    frame_similarity : ``(T,)`` ZNCC of each aligned frame with the aligned reference over
        the pixels they share
    (and the fields of :class:`~.optimize.RunResult`)
    """

    transforms: list
    warped: np.ndarray
    reference: object = "first"
    frame_similarity: np.ndarray | None = None

    @property
    def shifts(self) -> np.ndarray:
        """``(T, D)`` translations (array order, pixels), for linear models."""
        return np.stack([t.translation for t in self.transforms])


class StackProgress(Progress):
    """One snapshot of a stack run: a :class:`~.optimize.Progress` of one batch of frames.

    ``frames`` is the slice of the batch being aligned (indices of the moving frames: with
    ``reference="previous"`` moving frame ``i`` is stack frame ``i + 1``), and
    ``transforms`` that batch's best transforms so far.
    """

    def __init__(self, level, levels, iteration, loss, frames: slice, make_transforms):
        super().__init__(level, levels, iteration, loss, make_transforms)
        self.frames = frames

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, frames={self.frames.start}:{self.frames.stop})"


def register_stack(
    stack,
    *,
    reference="first",
    model="translation",
    metric="lncc",
    levels="auto",
    iterations=None,
    lr=None,
    tol=1e-4,
    window=None,
    grid_spacing=8.0,
    regularization=None,
    steps=7,
    batch_size="auto",
    device="auto",
    callback=None,
    report_every=5,
    full_resolution=None,
) -> StackRegistrationResult:
    """Align every frame of ``stack`` to a reference (drift correction of a time-lapse).

    Parameters
    ----------
    stack : array-like or torch.Tensor, shape ``(T, H, W)`` or ``(T, D, H, W)``
        Any numeric dtype and range; not modified.
    reference : "first", "previous", "mean" or int
    model : {"translation", "rigid", "similarity", "affine", "deformable", "diffeomorphic"}
        "translation" uses phase correlation and Gauss–Newton (``metric`` is then not used:
        the refinement is least squares on locally normalized intensities).
    batch_size : "auto" or int
        Frames per batch on the device (auto: as many as half the free memory holds).
    callback : callable(StackProgress) -> bool, optional
        Called with each :class:`StackProgress`; returning True stops the run within one
        iteration (frames not reached keep the identity).
    Other options as in :func:`~.register.register`.

    Returns
    -------
    StackRegistrationResult
        ``.transforms`` (one per frame), ``.warped`` ``(T, *S)`` float32, ``.shifts``.
    """
    run = register_stack_iter(
        stack,
        reference=reference,
        model=model,
        metric=metric,
        levels=levels,
        iterations=iterations,
        lr=lr,
        tol=tol,
        window=window,
        grid_spacing=grid_spacing,
        regularization=regularization,
        steps=steps,
        batch_size=batch_size,
        device=device,
        report_every=report_every,
        full_resolution=full_resolution,
    )
    return drive(run, callback)


def register_stack_iter(
    stack,
    *,
    reference="first",
    model="translation",
    metric="lncc",
    levels="auto",
    iterations=None,
    lr=None,
    tol=1e-4,
    window=None,
    grid_spacing=8.0,
    regularization=None,
    steps=7,
    batch_size="auto",
    device="auto",
    report_every=5,
    full_resolution=None,
):
    """Generator form of :func:`register_stack`: yields :class:`StackProgress` snapshots.

    Send a true value (``gen.send(True)``) to stop within one iteration; the generator
    then returns (``StopIteration.value``) the :class:`StackRegistrationResult`.
    """
    start = time.perf_counter()
    check_choice(model, "model", MODELS)
    check_choice(metric, "metric", METRICS)
    levels = _options.levels(levels)
    grid_spacing = _options.positive(grid_spacing, "grid_spacing")
    steps = _options.steps(steps)
    raw = _inputs.to_tensor(stack, "stack", leading=1)
    ref_index = _reference_index(reference, raw.shape[0])
    dev = resolve_device(device)
    shape = tuple(raw.shape[1:])
    batch = _batch_size(batch_size, shape, metric, model not in LINEAR_MODELS, dev, raw.shape[0])
    _check_stack_memory(raw, batch, metric, model not in LINEAR_MODELS, dev)
    raw_dev = raw.to(dev)
    frames = _inputs.normalize(raw_dev, "stack")[:, None]  # one range for the whole stack
    _check_frames_vary(frames)
    # The shift estimates (phase correlation, Gauss–Newton) see the frames clipped to the
    # robust range, so that hot or saturated pixels cannot dominate them.
    clipped = clip_unit(frames)
    history: list[float] = []
    state = {"stopped": False}
    if model == "translation":
        transforms = yield from _translation_route(
            clipped, reference, ref_index, batch, iterations, history, state
        )
    else:
        transforms = yield from _optimizer_route(
            frames,
            clipped,
            reference,
            ref_index,
            batch,
            history,
            state,
            model=model,
            metric=metric,
            levels=levels,
            iterations=iterations,
            lr=lr,
            tol=tol,
            window=window,
            grid_spacing=grid_spacing,
            regularization=regularization,
            steps=steps,
            report_every=report_every,
            full_resolution=full_resolution,
        )
    warped, coverage = _warp_stack(raw_dev, transforms, batch)
    final, initial, overlap = _frame_similarities(
        raw_dev,
        warped,
        coverage,
        reference,
        ref_index,
        batch,
        _inputs.robust_range(raw_dev, "stack"),
    )
    found = _assess_frames(final, initial, overlap, dense=model not in LINEAR_MODELS)
    return StackRegistrationResult(
        transforms=transforms,
        warped=warped,
        loss_history=history,
        stopped=state["stopped"],
        reference=reference,
        model=model,
        device=str(dev),
        similarity=float(final.min()),
        initial_similarity=float(initial.min()),
        overlap=float(overlap.min()),
        frame_similarity=final,
        warnings=found,
        seconds=time.perf_counter() - start,
    )


# -- arguments ----------------------------------------------------------------------------


def _reference_index(reference, total: int) -> int:
    """The reference frame's index (0 for "first", "previous" and "mean"), checked."""
    if isinstance(reference, (int, np.integer)) and not isinstance(reference, bool):
        if not -total <= int(reference) < total:
            raise ValueError(f"reference index {reference} is out of range for {total} frames")
        return int(reference) % total
    if reference not in REFERENCES:
        raise ValueError(
            f"reference must be 'first', 'previous', 'mean' or a frame index, got {reference!r}"
        )
    if total < 2 and reference == "previous":
        raise ValueError("reference='previous' needs at least 2 frames")
    return 0


def _batch_size(batch_size, shape, metric, dense, device, total) -> int:
    """Frames per batch: as asked, or (auto) as many as half the free memory holds."""
    if batch_size != "auto":
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, (int, np.integer))
            or batch_size < 1
        ):
            raise ValueError(f"batch_size must be 'auto' or a positive int, got {batch_size!r}")
        return int(batch_size)
    return _auto_batch(shape, metric, dense, device, total)


def _check_frames_vary(frames: torch.Tensor) -> None:
    """Raise a ValueError naming the first constant frame of ``frames`` ``(T, 1, *S)``."""
    flat = frames.reshape(frames.shape[0], -1)
    constant = (flat.amax(dim=1) - flat.amin(dim=1)) <= 0
    if bool(constant.any()):
        t = int(constant.nonzero()[0, 0])
        raise ValueError(f"frame {t} of stack is constant; there is nothing to align it by")


def _pairs(frames: torch.Tensor, reference, ref_index: int):
    """``(moving, refs)``: the frames to align and their reference(s) ``(1 or T', 1, *S)``."""
    if reference == "previous":
        return frames[1:], frames[:-1]
    return frames, frames[ref_index : ref_index + 1]


def _batches(total: int, size: int):
    for start in range(0, total, size):
        yield slice(start, min(total, start + size))


def _auto_batch(shape, metric, dense, device, total) -> int:
    free = available_memory(device)
    per = _inputs.estimate_bytes(1, shape, metric, dense)
    if free is None:
        return min(total, 64)
    fit = int(0.5 * free // max(per, 1))
    if fit < 1:
        _inputs.check_memory(1, shape, metric, dense, device, advice=_MEMORY_ADVICE)
    return max(1, min(total, fit))


_MEMORY_ADVICE = (
    "use a smaller batch_size, crop or downsample the frames, choose metric "
    "'mse' or 'ncc', or another device"
)

#: float32 copies of the whole stack alive at once: the frames as given, normalized,
#: clipped to the robust range, and the aligned output.
STACK_COPIES = 4


def _check_stack_memory(raw: torch.Tensor, batch: int, metric, dense, device) -> None:
    """Refuse, with the figures, a stack that cannot be aligned in the free memory."""
    free = available_memory(device)
    if free is None:
        return
    frame = raw[0].numel() * 4
    need = STACK_COPIES * raw.shape[0] * frame + _inputs.estimate_bytes(
        batch, tuple(raw.shape[1:]), metric, dense
    )
    if need > free:
        raise MemoryError(
            f"aligning {raw.shape[0]} frames of shape {tuple(raw.shape[1:])} needs about "
            f"{need / 2**30:.2f} GiB on {device} ({STACK_COPIES} copies of the stack and a "
            f"batch of {batch}), but only {free / 2**30:.2f} GiB is free; {_MEMORY_ADVICE}, "
            "or align the stack in parts"
        )


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


def _identity(model, shape):
    d = len(shape)
    if model in LINEAR_MODELS:
        return AffineTransform(np.eye(d + 1), model)
    return DisplacementTransform(np.zeros((d, *shape), np.float32))


def _warp_stack(raw, transforms, batch) -> tuple[np.ndarray, torch.Tensor]:
    """Resample every raw frame with its transform, in batches on the device.

    Returns the aligned stack (NumPy ``(T, *S)``, written batch by batch into one array)
    and each frame's coverage ``(T, *S)`` (1 where its pixels landed, on the device): the
    frame and a plane of ones are warped together, so coverage costs no extra pass.
    """
    out = np.empty(tuple(raw.shape), dtype=np.float64 if raw.dtype == torch.float64 else np.float32)
    coverage = torch.empty(raw.shape, dtype=torch.bool, device=raw.device)
    shape = tuple(raw.shape[1:])
    for sl in _batches(raw.shape[0], batch):
        ts = transforms[sl]
        pair = torch.stack([raw[sl], torch.ones_like(raw[sl])], dim=1)
        if isinstance(ts[0], AffineTransform):
            mats = torch.as_tensor(np.stack([t.matrix for t in ts])).to(pair)
            moved = warp_affine(pair, mats, padding="grid-constant")
        else:
            disp = torch.as_tensor(np.stack([t.to_displacement(shape) for t in ts])).to(pair)
            moved = warp(pair, disp, padding="grid-constant")
        out[sl] = moved[:, 0].cpu().numpy()
        coverage[sl] = moved[:, 1] > 0.999
    return out, coverage


def _frame_similarities(raw, warped, coverage, reference, ref_index, batch, value_range):
    """Per frame: final ZNCC with the aligned reference over shared pixels, the initial
    ZNCC of the raw frames, and the overlap (fraction of pixels covered).

    Values are clipped to the stack's robust ``value_range`` first (as the shift
    estimates see them), so hot or saturated pixels cannot dominate the score.
    """
    lo, hi = value_range
    shape = tuple(raw.shape[1:])

    def clip(x):  # lightly blurred, as the estimates see the frames (less noise)
        x = torch.as_tensor(x).to(raw).clamp(lo, hi)
        return gaussian_blur(x.reshape(-1, 1, *x.shape[-len(shape) :]), 1.0).reshape(x.shape)

    if reference == "mean":
        # The mean is a real image only where every frame landed.
        target = clip(warped).mean(dim=0)[None, None]
        target_cover = coverage.all(dim=0)[None, None]
        start = clip(raw).mean(dim=0)[None, None]
    else:
        index = 0 if reference == "previous" else ref_index
        target = clip(warped[index])[None, None]
        target_cover = coverage[index : index + 1, None]
        start = clip(raw[index])[None, None]
    final, initial = [], []
    for sl in _batches(raw.shape[0], batch):
        shared = (coverage[sl, None] & target_cover).to(raw.dtype)
        final.append(masked_zncc(target, clip(warped[sl])[:, None], shared))
        initial.append(masked_zncc(start, clip(raw[sl])[:, None], torch.ones_like(shared)))
    overlap = coverage.flatten(1).double().mean(1)
    return (torch.cat(final).cpu().numpy(), torch.cat(initial).cpu().numpy(), overlap.cpu().numpy())


def _assess_frames(final, initial, overlap, dense: bool) -> list[str]:
    """The warnings a stack earns: one per kind of problem, naming the frames that have it
    and quoting the worst of them (not one warning per frame); also emitted."""
    by_kind: dict[str, list[int]] = {}
    for t in range(len(final)):
        for kind in problems(final[t], initial[t], overlap[t], dense):
            by_kind.setdefault(kind, []).append(t)
    messages = []
    for kind, frames in by_kind.items():
        worst = min(frames, key=lambda t: overlap[t] if kind == "overlap" else final[t])
        listed = ", ".join(map(str, frames[:10])) + (", ..." if len(frames) > 10 else "")
        detail = problems(final[worst], initial[worst], overlap[worst], dense)[kind]
        messages.append(f"frame(s) {listed}: {detail}")
    return emit(messages)


# -- the translation route ----------------------------------------------------------------


def _shift_progress(sl: slice, scale: float, history: list):
    """A converter of :class:`~.drift.TranslationStep` s of batch ``sl`` to StackProgress."""

    def convert(step):
        loss = float(step.loss.mean())
        history.append(loss)
        shifts = (step.shifts * scale).detach().clone()
        return StackProgress(
            0,
            1,
            step.iteration,
            loss,
            sl,
            lambda: [AffineTransform(m.numpy(), "translation") for m in _shift_matrices(shifts)],
        )

    return convert


def _translation_shifts(
    frames, refs, batch, history, state, iterations, full_iterations=1, previous=False
):
    """Phase correlation + Gauss–Newton, batch by batch; ``refs`` ``(1 or T, 1, *S)``.

    A generator (yields :class:`StackProgress`) returning the shifts ``(T, D)``. Each
    frame's phase-correlation peak is kept only where it matches better than a zero
    shift (or, with ``previous``, the previous pair's shift): a spurious peak, e.g. from
    hot pixels, is not followed.

    Frames with every side ≥ 256 are first solved at half resolution (a quarter of the
    pixels; the box average also halves the noise), then polished by ``full_iterations``
    Gauss–Newton steps at full resolution, which is where the last hundredths of a pixel
    come from.
    """
    out = []
    halve = min(frames.shape[2:]) >= 256
    scale = 2.0 if halve else 1.0
    for sl in _batches(frames.shape[0], batch):
        f = frames[sl]
        r = refs if refs.shape[0] == 1 else refs[sl]
        fc, rc = (_halve(f), _halve(r)) if halve else (f, r)
        init = -phase_correlation(rc, fc)
        last = out[-1][-1] / scale if out else None
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
        out.append(shifts)
        if stopped:
            state["stopped"] = True
            # Frames not reached keep the identity.
            rest = frames.shape[0] - sl.stop
            if rest:
                out.append(shifts.new_zeros(rest, shifts.shape[1]))
            break
    return torch.cat(out)


def _refine_to(frames, mean, mask, shifts, batch, history, state, iterations):
    """Gauss–Newton from ``shifts`` against one ``mean`` reference, where ``mask`` says it
    is a real image (a generator)."""
    out = []
    for sl in _batches(frames.shape[0], batch):
        refined, _, stopped = yield from relay(
            refine_translation_iter(
                frames[sl], mean, shifts[sl], iterations=iterations, reference_mask=mask
            ),
            _shift_progress(sl, 1.0, history),
        )
        out.append(refined)
        if stopped:
            state["stopped"] = True
            out.append(shifts[sl.stop :])
            break
    return torch.cat(out)


def _translation_route(clipped, reference, ref_index, batch, iterations, history, state):
    """Per-frame translations (a generator returning one AffineTransform per frame)."""
    its = 10 if iterations is None else int(iterations)
    moving, refs = _pairs(clipped, reference, ref_index)
    shifts = yield from _translation_shifts(
        moving, refs, batch, history, state, its, previous=reference == "previous"
    )
    if reference == "mean" and not state["stopped"]:
        mean, mask = _aligned_mean(clipped, shifts)
        shifts = yield from _refine_to(clipped, mean, mask, shifts, batch, history, state, its)
    if reference == "previous":
        shifts = torch.cat([shifts.new_zeros(1, shifts.shape[1]), torch.cumsum(shifts, dim=0)])
    return [AffineTransform(m.numpy(), "translation") for m in _shift_matrices(shifts)]


# -- the optimizer route ------------------------------------------------------------------


def _aligned_mean(frames, shifts):
    """The mean of ``frames`` aligned by ``shifts`` and where every frame covers it.

    Returns ``(mean (1, 1, *S), mask (1, 1, *S))``: only where every frame contributed is
    the mean a real image (not edge smear), so it is matched there only.
    """
    mats = _shift_matrices(shifts).to(frames)
    mean = warp_affine(frames, mats, padding="nearest").mean(dim=0, keepdim=True)
    covered = warp_affine(torch.ones_like(frames[:1]), mats, padding="grid-constant")
    return mean, (covered.amin(dim=0, keepdim=True) > 0.999).to(frames.dtype)


def _mean_reference(frames, clipped, batch):
    """The mean of the drift-corrected frames and where every frame covers it (see
    :func:`_aligned_mean`), for the optimizer route: the frames are aligned as the
    translation route aligns them to a mean (to the first frame, then to the mean of
    those), so that the mean is as sharp as translations can make it."""
    state = {"stopped": False}
    drift = drive(_translation_shifts(clipped, clipped[:1], batch, [], state, 10))
    mean, mask = _aligned_mean(clipped, drift)
    drift = drive(_refine_to(clipped, mean, mask, drift, batch, [], state, 10))
    return _aligned_mean(frames, drift)


def _phase_guesses(moving_c, refs_c, batch, previous: bool) -> torch.Tensor:
    """Initial matrices ``(T', D + 1, D + 1)`` from phase correlation of the clipped frames.

    Each guess is kept only where it matches better than zero (or than the previous
    pair's guess), as in ``register``'s ``initial_shift_matrix``.
    """
    guesses, last = [], None
    for sl in _batches(moving_c.shape[0], batch):
        mc = moving_c[sl]
        rc = refs_c if refs_c.shape[0] == 1 else refs_c[sl]
        guess = -phase_correlation(gaussian_blur(rc, 1.0), gaussian_blur(mc, 1.0))
        guess = select_shifts(mc, rc, [guess, *_start_candidates(guess, previous, last)])
        guesses.append(guess)
        last = guess[-1]
    return _shift_matrices(torch.cat(guesses))


def _optimize_frames(
    moving,
    refs,
    model,
    schedule,
    levels,
    batch,
    grid_spacing,
    steps,
    history,
    state,
    init_mats,
    ref_mask=None,
):
    """The generic optimizer on batches of frames (a generator returning the models).

    ``ref_mask`` ``(1, 1, *S)``: where the reference may be matched (None: everywhere).
    """
    shape = tuple(moving.shape[2:])
    shapes = level_shapes(shape, levels)
    weights = (
        [None] * levels
        if ref_mask is None
        else [(w > 0.5).to(moving.dtype) for w in build_pyramid(ref_mask, shapes)]
    )
    models = []
    for sl in _batches(moving.shape[0], batch):
        f = moving[sl]
        r = refs if refs.shape[0] == 1 else refs[sl]
        n = f.shape[0]
        if model in LINEAR_MODELS:
            mdl = LinearModel(model, shape, shape, n, init=init_mats[sl], device=f.device)
        else:
            mdl = DenseModel(
                model, shape, n, grid_spacing=grid_spacing, steps=steps, device=f.device
            )

        def convert(progress, sl=sl):
            return StackProgress(
                progress.level,
                progress.levels,
                progress.iteration,
                progress.loss,
                sl,
                lambda: progress.transforms,
            )

        stopped, _ = yield from relay(
            optimize(
                mdl, build_pyramid(r, shapes), build_pyramid(f, shapes), weights, schedule, history
            ),
            convert,
        )
        models.append(mdl)
        if stopped:
            state["stopped"] = True
            break
    return models


def _optimizer_route(
    frames,
    clipped,
    reference,
    ref_index,
    batch,
    history,
    state,
    *,
    model,
    metric,
    levels,
    iterations,
    lr,
    tol,
    window,
    grid_spacing,
    regularization,
    steps,
    report_every,
    full_resolution,
):
    """Any model by the generic optimizer (a generator returning one transform per frame)."""
    shape = tuple(frames.shape[2:])
    moving, refs = _pairs(frames, reference, ref_index)
    moving_c, refs_c = _pairs(clipped, reference, ref_index)
    ref_mask = None
    if reference == "mean":
        refs, ref_mask = _mean_reference(frames, clipped, batch)
    levels_n = auto_levels(shape) if levels in ("auto", None) else int(levels)
    its = level_iterations(iterations, model, shape, levels_n, full_resolution)
    schedule = make_schedule(model, lr, its, tol, regularization, report_every, metric, window)
    # The same light blur as register(): less noise on the gradient, less bias from
    # bilinear interpolation.
    moving, refs = gaussian_blur(moving, 1.0), gaussian_blur(refs, 1.0)
    init = (
        _phase_guesses(moving_c, refs_c, batch, reference == "previous")
        if model in LINEAR_MODELS
        else None
    )
    models = yield from _optimize_frames(
        moving,
        refs,
        model,
        schedule,
        levels_n,
        batch,
        grid_spacing,
        steps,
        history,
        state,
        init,
        ref_mask,
    )
    transforms = [t for mdl in models for t in mdl.transforms()]
    transforms += [_identity(model, shape)] * (moving.shape[0] - len(transforms))
    if reference == "previous":
        transforms = _chain(transforms, model, shape)
    return transforms


def _chain(pairwise, model, shape):
    """Transforms of frame t−1 → t (pairwise) to reference (frame 0) → frame t.

    Linear: the matrices multiply. Dense: ``d_t = compose(p_t, d_{t−1})``, i.e.
    ``d_t(x) = d_{t−1}(x) + p_t(x + d_{t−1}(x))``.
    """
    out = [_identity(model, shape)]
    if model in LINEAR_MODELS:
        for p in pairwise:
            out.append(AffineTransform(p.matrix @ out[-1].matrix, model))
        return out
    current = torch.zeros(1, len(shape), *shape)
    for p in pairwise:
        current = compose(torch.as_tensor(p.to_displacement(shape))[None], current)
        out.append(DisplacementTransform(current[0].numpy()))
    return out
