"""``register_stack``: align every frame of a ``(T, *S)`` stack (drift correction).

Frames are processed in batches on the device, never one by one. Translation (the
default) takes the fast route of :mod:`.drift`: a batched phase correlation for the
integer-pixel guess, then batched Gauss–Newton to sub-pixel accuracy. Other models run the
generic optimizer with the frames as the batch, started from the phase-correlation shift.

References: ``"first"`` (frame 0), an int (that frame), ``"mean"`` (align to the first
frame, average the aligned frames, align again to that average) and ``"previous"`` (each
frame to the one before, transforms chained, which follows slow changes of appearance at
the price of accumulating error).

The stack is never held whole as float32: frames are read batch by batch (NumPy and torch
stacks sliced in place, dask and zarr stacks read region by region, see :mod:`._frames`),
and only what the reference needs is kept (one frame, or a running mean). Batches are sized
from the memory budget (:mod:`napari_simwarp.io.budget`), and a stack whose smallest batch
cannot fit is refused before anything is read. For NumPy or torch input the aligned stack
is one NumPy array; for dask or zarr input it is a lazy dask array whose frames are warped
when computed.

:func:`register_stack_iter` is the run as a generator (progress out, a stop signal in,
the result returned); :func:`register_stack` drives it with an optional callback.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .._devices import resolve_device
from ..io import budget as _budget
from ..io.tasks import device_slot
from ..ops import compose, warp, warp_affine
from ..ops._validation import check_choice
from . import _inputs, _options
from ._driver import drive, relay
from ._frames import FrameSource
from ._names import LINEAR_MODELS, METRICS, MODELS, default_metric
from .drift import clip_unit, phase_correlation, refine_translation_iter, select_shifts
from .grid import Grid
from .models import DenseModel, LinearModel
from .optimize import (
    Progress,
    RunResult,
    level_iterations,
    make_schedule,
    optimize,
    resolve_optimizer,
)
from .pyramid import auto_levels, build_pyramid, gaussian_blur, level_shapes
from .quality import emit, masked_zncc, problems
from .transforms import AffineTransform, DisplacementTransform

REFERENCES = ("first", "previous", "mean")


@dataclass(kw_only=True)
class StackRegistrationResult(RunResult):
    """What :func:`register_stack` returns.

    transforms : one transform per frame, mapping reference coordinates to the frame's
    warped : the aligned stack ``(T, *S)`` (float64 for float64 input, else float32):
        NumPy for NumPy or torch input; for dask or zarr input a lazy ``dask.array.Array``
        (one frame per chunk) whose frames are warped only when computed
    reference : the reference asked for
    metric : the similarity metric the frames were aligned with (not used by the
        translation route)
    frame_similarity : ``(T,)`` ZNCC of each aligned frame with the aligned reference over
        the pixels they share
    (and the fields of :class:`~.optimize.RunResult`)
    """

    transforms: list
    warped: object
    reference: object = "first"
    metric: str = ""
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
    metric=None,
    levels="auto",
    iterations=None,
    lr=None,
    tol=1e-4,
    window=None,
    grid_spacing=None,
    regularization=None,
    steps=7,
    spacing=None,
    origin=None,
    batch_size="auto",
    device="auto",
    callback=None,
    report_every=5,
    full_resolution=None,
    memory_budget=None,
) -> StackRegistrationResult:
    """Align every frame of ``stack`` to a reference (drift correction of a time-lapse).

    Parameters
    ----------
    stack : array-like, torch.Tensor, dask or zarr array, shape ``(T, H, W)`` or
        ``(T, D, H, W)``
        Any numeric dtype and range; not modified. Dask and zarr stacks are read batch by
        batch (never whole); multiscale data must be given as one level.
    reference : "first", "previous", "mean" or int
    model : {"translation", "rigid", "similarity", "affine", "deformable", "diffeomorphic"}
        "translation" uses phase correlation and Gauss–Newton (``metric`` is then not used:
        the refinement is least squares on locally normalized intensities).
    metric : {"ncc", "lncc", "ssim", "mse", "mi"}, optional
        Default (None): "ncc" (global normalized cross-correlation, solved by
        Gauss–Newton) for the linear models, "lncc" (local NCC, Adam) for the dense ones,
        as in ``register``. Chosen by measurement on rigid drift with every reference,
        photobleaching and noise (docs/benchmarks.md, "Drift correction: register_stack's
        metric"): several times faster than "lncc" and as accurate or more, but for
        bleaching with heavy noise; "mse" fails when the intensity decays over the stack.
        With a bright object moving over the scene, "lncc" is more accurate (a global
        metric weighs the object's mismatch over the whole frame): pass it there; a very
        bright one is followed instead of the drift whatever the metric.
        ``result.metric`` says which ran.
    spacing : float or sequence of float, optional
        Pixel size per spatial axis, array order (napari's layer ``scale`` without the
        time axis: ``(z, y, x)`` of a ``(T, Z, Y, X)`` stack); default 1. One grid is
        shared by every frame. The transforms are found in physical space: rigid and
        similarity stay rigid for the sample however anisotropic the voxels, the pyramid
        follows the anisotropy, and ``window`` and ``grid_spacing`` are physical units
        (defaults: 9 or 11 and 8 of the finest pixel size, as in ``register``).
    origin : float or sequence of float, optional
        Physical position of pixel 0 per spatial axis (napari's ``translate``); default 0.
    batch_size : "auto" or int
        Frames per batch on the device (auto: sized from the memory budget).
    callback : callable(StackProgress) -> bool, optional
        Called with each :class:`StackProgress`; returning True stops the run within one
        iteration (frames not reached keep the identity).
    memory_budget : int or str, optional
        Bytes the run may hold at once ("2GiB"); default ``SIMWARP_MEMORY_BUDGET``, else
        half the free memory (:mod:`napari_simwarp.io.budget`). A run that cannot fit in
        it is refused before any frame is read.
    Other options as in :func:`~.register.register`.

    Returns
    -------
    StackRegistrationResult
        ``.transforms`` (one per frame, each carrying the grid as ``fixed_grid`` and
        ``moving_grid``, so ``.physical_matrix`` is in physical units), ``.warped``
        ``(T, *S)`` float32 (lazy for dask or zarr input), ``.shifts``.
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
        spacing=spacing,
        origin=origin,
        batch_size=batch_size,
        device=device,
        report_every=report_every,
        full_resolution=full_resolution,
        memory_budget=memory_budget,
    )
    return drive(run, callback)


def register_stack_iter(
    stack,
    *,
    reference="first",
    model="translation",
    metric=None,
    levels="auto",
    iterations=None,
    lr=None,
    tol=1e-4,
    window=None,
    grid_spacing=None,
    regularization=None,
    steps=7,
    spacing=None,
    origin=None,
    batch_size="auto",
    device="auto",
    report_every=5,
    full_resolution=None,
    memory_budget=None,
):
    """Generator form of :func:`register_stack`: yields :class:`StackProgress` snapshots.

    Send a true value (``gen.send(True)``) to stop within one iteration; the generator
    then returns (``StopIteration.value``) the :class:`StackRegistrationResult`.
    """
    start = time.perf_counter()
    check_choice(model, "model", MODELS)
    metric = default_metric(model, metric)
    check_choice(metric, "metric", METRICS)
    levels = _options.levels(levels)
    grid_spacing = _options.optional_positive(grid_spacing, "grid_spacing")
    steps = _options.steps(steps)
    dev = resolve_device(device)
    src = FrameSource(stack, dev)
    grid = Grid.make(len(src.frame_shape), spacing, origin)
    ref_index = _reference_index(reference, src.total)
    dense = model not in LINEAR_MODELS
    budgets = _budgets(memory_budget, dev)
    batch = _batch_size(
        batch_size, src, metric if dense or model != "translation" else None, dense, budgets
    )
    _check_stack_memory(src, batch, metric, dense, model, budgets)
    value_range = src.value_range()  # one range for the whole stack
    history: list[float] = []
    state = {"stopped": False}
    if model == "translation":
        # One grid for every frame: the pixel shifts are the physical ones over the
        # spacing, so phase correlation works in pixels unchanged.
        transforms = yield from _translation_route(
            src, value_range, reference, ref_index, batch, iterations, history, state, grid
        )
    else:
        transforms = yield from _optimizer_route(
            src,
            value_range,
            reference,
            ref_index,
            batch,
            history,
            state,
            grid=grid,
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
    warped, (final, initial, overlap) = _finish(
        src, value_range, transforms, reference, ref_index, batch
    )
    found = _assess_frames(final, initial, overlap, dense=model not in LINEAR_MODELS)
    return StackRegistrationResult(
        transforms=transforms,
        warped=warped,
        loss_history=history,
        stopped=state["stopped"],
        reference=reference,
        metric=metric,
        model=model,
        device=str(dev),
        similarity=float(final.min()),
        initial_similarity=float(initial.min()),
        overlap=float(overlap.min()),
        frame_similarity=final,
        warnings=found,
        seconds=time.perf_counter() - start,
    )


# -- arguments and memory -----------------------------------------------------------------


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


def _budgets(memory_budget, device) -> tuple[_budget.Budget, _budget.Budget]:
    """``(RAM, device)`` budgets; on the CPU they are one pool (the same budget)."""
    ram = _budget.memory_budget(memory_budget, torch.device("cpu"))
    return ram, (ram if device.type == "cpu" else _budget.memory_budget(memory_budget, device))


#: float32 maps per pixel that the translation route holds per frame of a batch (frame,
#: clipped copy, half-resolution copies, FFT spectra, Gauss–Newton images and gradients).
#: Measured (``OMP_NUM_THREADS=1 python benchmarks/maps_per_pixel.py``, 2026-11-23: the
#: peak resident set of a batch of 16 (64) frames minus that of a batch of 4, per extra
#: frame, less the frame as read): 15.3 for 512² frames (solved at half resolution) and
#: 20.9 for 192² frames (solved at full resolution), rounded up with a margin.
TRANSLATION_MAPS_PER_PIXEL = 24
#: the work of an automatic batch on the CPU may reach this, or a quarter of the stack
CPU_BATCH_BYTES = 64 * 2**20
#: frames per batch at most when the batch size is automatic
AUTO_BATCH_MAX = 64


def _frame_work(src: FrameSource, metric, dense: bool) -> int:
    """Bytes of working memory per frame of a batch on the device."""
    if metric is None:
        return int(np.prod(src.frame_shape)) * 4 * TRANSLATION_MAPS_PER_PIXEL
    return _inputs.estimate_bytes(1, src.frame_shape, metric, dense)


def _held_bytes(src: FrameSource, batch: int) -> int:
    """RAM held besides the batch's work: the aligned stack when it is returned in memory,
    the frames the reference keeps (up to four), and a batch as read."""
    frames = 4 + batch + (0 if src.lazy else src.total)
    return frames * src.frame_bytes


def _batch_size(batch_size, src, metric, dense, budgets) -> int:
    """Frames per batch: as asked, or (auto) as many as the budget holds.

    On the CPU the automatic batch also keeps its work within :data:`CPU_BATCH_BYTES` or a
    quarter of the stack's size, whichever is larger (at least one frame), so that an
    in-memory run of a large stack stays within about 2.5 copies of it: batching buys
    little on a CPU, memory is what runs out.
    """
    if batch_size != "auto":
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, (int, np.integer))
            or batch_size < 1
        ):
            raise ValueError(f"batch_size must be 'auto' or a positive int, got {batch_size!r}")
        return min(int(batch_size), src.total)
    ram, device = budgets
    per = _frame_work(src, metric, dense)
    room = device.bytes - (_held_bytes(src, 0) if device is ram else 0)
    fit = int(room // max(per + (src.frame_bytes if device is ram else 0), 1))
    if device is ram:
        fit = min(fit, max(CPU_BATCH_BYTES, src.total * src.frame_bytes // 4) // per)
    return max(1, min(src.total, fit, AUTO_BATCH_MAX))


_MEMORY_ADVICE = (
    "use a smaller batch_size, crop or downsample the frames, choose metric "
    "'mse' or 'ncc', give the stack as a dask or zarr array (the aligned stack is then "
    "lazy), or use another device"
)


def _check_stack_memory(src, batch, metric, dense, model, budgets) -> None:
    """Refuse, with the figures and before any frame is read, a run that cannot fit."""
    ram, device = budgets
    work = batch * _frame_work(src, None if model == "translation" else metric, dense)
    held = _held_bytes(src, batch)
    what = (
        f"aligning {src.total} frames of shape {src.frame_shape} (batches of {batch}"
        + ("" if src.lazy else ", the aligned stack in memory")
        + ")"
    )
    if device is ram:
        _budget.refuse(work + held, ram, what=what, advice=_MEMORY_ADVICE)
    else:
        _budget.refuse(work, device, what=what + " on " + str(src.device), advice=_MEMORY_ADVICE)
        _budget.refuse(held, ram, what=what + " in RAM", advice=_MEMORY_ADVICE)


def _batches(total: int, size: int, first: int = 0):
    for start in range(first, total, size):
        yield slice(start, min(total, start + size))


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


# -- the aligned stack and its quality ----------------------------------------------------


def _warp(images: torch.Tensor, transforms) -> torch.Tensor:
    """``images`` ``(n, C, *S)`` resampled by one transform each (zeros outside)."""
    if isinstance(transforms[0], AffineTransform):
        mats = torch.as_tensor(np.stack([t.matrix for t in transforms])).to(images)
        return warp_affine(images, mats, padding="grid-constant")
    shape = tuple(images.shape[2:])
    disp = torch.as_tensor(np.stack([t.to_displacement(shape) for t in transforms]))
    return warp(images, disp.to(images), padding="grid-constant")


def warp_frames(raw: torch.Tensor, transforms) -> tuple[torch.Tensor, torch.Tensor]:
    """Frames ``raw`` ``(n, *S)`` resampled by their transforms (zeros outside), and each
    one's coverage ``(n, *S)`` (True where its pixels landed): the frame and a plane of ones
    are warped together, so coverage costs no extra pass."""
    moved = _warp(torch.stack([raw, torch.ones_like(raw)], dim=1), transforms)
    return moved[:, 0], moved[:, 1] > 0.999


def _warp_block(block: np.ndarray, transforms, device: str) -> np.ndarray:
    """One frame of the lazy aligned stack (a dask task): the frame alone is warped (the
    coverage that :func:`warp_frames` adds is not needed here; each channel is sampled
    on its own, so the values are the same)."""
    dev = torch.device(device)
    with device_slot(dev):
        raw = _inputs.to_tensor(block, "stack", leading=1).to(dev)
        return _warp(raw[:, None], transforms)[:, 0].cpu().numpy()


def lazy_warped(data, transforms, device) -> object:
    """The aligned stack of a dask or zarr ``data`` ``(T, *S)`` as a dask array, one frame
    per chunk: computing a frame reads and warps that frame only.

    One graph layer of ``T`` tasks, each holding its own frame's transform (so a
    distributed worker receives one transform per frame, not the list), over ``data``
    chunked one frame per chunk: slicing a frame out of it, as napari does on every step
    of the time slider, costs the same at any ``T``.
    """
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    from ..io import lazy

    frames = lazy.as_dask(data)
    shape = tuple(int(n) for n in frames.shape[1:])
    frames = frames.rechunk((1, *shape))
    dtype = np.float64 if np.dtype(frames.dtype) == np.float64 else np.float32
    name = "simwarp-warped-" + tokenize(frames.name, transforms, str(device))
    rest = (0,) * len(shape)
    tasks = {
        (name, t, *rest): (_warp_block, (frames.name, t, *rest), transforms[t : t + 1], str(device))
        for t in range(frames.shape[0])
    }
    graph = HighLevelGraph.from_collections(name, tasks, dependencies=[frames])
    chunks = ((1,) * frames.shape[0], *((n,) for n in shape))
    return da.Array(graph, name, chunks=chunks, dtype=dtype)


def _finish(src, value_range, transforms, reference, ref_index, batch):
    """The aligned stack and, per frame: the final ZNCC with the aligned reference over the
    pixels both cover, the initial ZNCC of the raw frames, and the overlap (fraction of
    pixels covered). Returns ``(warped, (final, initial, overlap))``.

    Values are clipped to the stack's robust ``value_range`` first (as the shift estimates
    see them), so hot or saturated pixels cannot dominate the score. The frames are read
    and warped batch by batch: once, or twice for ``reference="mean"`` (its target, the
    mean of the aligned frames, needs a pass of its own).
    """
    lo, hi = value_range
    ndim = len(src.shape) - 1

    def clip(x):  # lightly blurred, as the estimates see the frames (less noise)
        x = x.clamp(lo, hi)
        return gaussian_blur(x.reshape(-1, 1, *x.shape[-ndim:]), 1.0).reshape(x.shape)

    if reference == "mean":
        # The mean is a real image only where every frame landed.
        target = start = None
        for sl in _batches(src.total, batch):
            raw = src.raw(sl)
            moved, cover = warp_frames(raw, transforms[sl])
            part = (clip(moved).sum(dim=0), cover.all(dim=0), clip(raw).sum(dim=0))
            if target is None:
                target, target_cover, start = part
            else:
                target, target_cover, start = (
                    target + part[0],
                    target_cover & part[1],
                    start + part[2],
                )
        target, start = (target / src.total)[None, None], (start / src.total)[None, None]
        target_cover = target_cover[None, None]
    else:
        index = 0 if reference == "previous" else ref_index
        raw = src.raw(slice(index, index + 1))
        moved, cover = warp_frames(raw, transforms[index : index + 1])
        target, target_cover, start = clip(moved)[None], cover[None], clip(raw)[None]
    out = None if src.lazy else np.empty(src.shape, np.float64 if src.is_float64 else np.float32)
    final, initial, overlap = [], [], []
    for sl in _batches(src.total, batch):
        raw = src.raw(sl)
        moved, cover = warp_frames(raw, transforms[sl])
        if out is not None:
            out[sl] = moved.cpu().numpy()
        shared = (cover[:, None] & target_cover).to(raw.dtype)
        final.append(masked_zncc(target, clip(moved)[:, None], shared))
        initial.append(masked_zncc(start, clip(raw)[:, None], torch.ones_like(shared)))
        overlap.append(cover.flatten(1).double().mean(1))
    warped = out if out is not None else lazy_warped(src.data, transforms, src.device)
    scores = tuple(torch.cat(x).cpu().numpy() for x in (final, initial, overlap))
    return warped, scores


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
    total, pairs, batch, history, state, iterations, full_iterations=1, previous=False
):
    """Phase correlation + Gauss–Newton, batch by batch, over ``total`` moving frames;
    ``pairs(sl)`` reads batch ``sl``: ``(frames (n, 1, *S), refs (1 or n, 1, *S))``.

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
    for sl in _batches(total, batch):
        f, r = pairs(sl)
        halve = min(f.shape[2:]) >= 256
        scale = 2.0 if halve else 1.0
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
            rest = total - sl.stop
            if rest:
                out.append(shifts.new_zeros(rest, shifts.shape[1]))
            break
    return torch.cat(out)


def _refine_to(total, read, mean, mask, shifts, batch, history, state, iterations):
    """Gauss–Newton from ``shifts`` against one ``mean`` reference, where ``mask`` says it
    is a real image (a generator); ``read(sl)`` gives the frames of batch ``sl``."""
    out = []
    for sl in _batches(total, batch):
        refined, _, stopped = yield from relay(
            refine_translation_iter(
                read(sl), mean, shifts[sl], iterations=iterations, reference_mask=mask
            ),
            _shift_progress(sl, 1.0, history),
        )
        out.append(refined)
        if stopped:
            state["stopped"] = True
            out.append(shifts[sl.stop :])
            break
    return torch.cat(out)


def _readers(src, value_range):
    """``(normalized(sl), clipped(sl))``: batch readers of normalized and clipped frames."""

    def normalized(sl):
        return src.normalized(sl, value_range)

    def clipped(sl):
        return clip_unit(normalized(sl))

    return normalized, clipped


def _pair_reader(read, reference, ref_index):
    """``pairs(sl)`` for the moving frames of batch ``sl`` and their reference(s): with
    ``"previous"`` moving frame ``i`` is stack frame ``i + 1`` and its reference frame
    ``i``; otherwise the reference frame is read once and kept."""
    if reference == "previous":

        def pairs(sl):
            x = read(slice(sl.start, sl.stop + 1))
            return x[1:], x[:-1]

        return pairs
    ref = read(slice(ref_index, ref_index + 1))
    return lambda sl: (read(sl), ref)


def _translation_route(
    src, value_range, reference, ref_index, batch, iterations, history, state, grid
):
    """Per-frame translations (a generator returning one AffineTransform per frame, on
    ``grid``)."""
    its = 10 if iterations is None else int(iterations)
    _, clipped = _readers(src, value_range)
    previous = reference == "previous"
    shifts = yield from _translation_shifts(
        src.total - previous,
        _pair_reader(clipped, reference, ref_index),
        batch,
        history,
        state,
        its,
        previous=previous,
    )
    if reference == "mean" and not state["stopped"]:
        mean, mask = _aligned_mean(clipped, src.total, shifts, batch)
        shifts = yield from _refine_to(
            src.total, clipped, mean, mask, shifts, batch, history, state, its
        )
    if previous:
        shifts = torch.cat([shifts.new_zeros(1, shifts.shape[1]), torch.cumsum(shifts, dim=0)])
    return [
        AffineTransform(m.numpy(), "translation").with_grids(grid, grid)
        for m in _shift_matrices(shifts)
    ]


# -- the optimizer route ------------------------------------------------------------------


def _aligned_mean(read, total, shifts, batch):
    """The mean of the frames ``read(sl)`` aligned by ``shifts``, and where every frame
    covers it, accumulated batch by batch.

    Returns ``(mean (1, 1, *S), mask (1, 1, *S))``: only where every frame contributed is
    the mean a real image (not edge smear), so it is matched there only.
    """
    mats = _shift_matrices(shifts)
    total_sum, covered = None, None
    for sl in _batches(total, batch):
        frames = read(sl)
        m = mats[sl].to(frames)
        moved = warp_affine(frames, m, padding="nearest").sum(dim=0, keepdim=True)
        cover = warp_affine(torch.ones_like(frames[:1]), m, padding="grid-constant")
        cover = cover.amin(dim=0, keepdim=True)
        total_sum = moved if total_sum is None else total_sum + moved
        covered = cover if covered is None else torch.minimum(covered, cover)
    return total_sum / total, (covered > 0.999).to(total_sum.dtype)


def _mean_reference(normalized, clipped, total, batch):
    """The mean of the drift-corrected frames and where every frame covers it (see
    :func:`_aligned_mean`), for the optimizer route: the frames are aligned as the
    translation route aligns them to a mean (to the first frame, then to the mean of
    those), so that the mean is as sharp as translations can make it."""
    state = {"stopped": False}
    pairs = _pair_reader(clipped, "first", 0)
    drift = drive(_translation_shifts(total, pairs, batch, [], state, 10))
    mean, mask = _aligned_mean(clipped, total, drift, batch)
    drift = drive(_refine_to(total, clipped, mean, mask, drift, batch, [], state, 10))
    return _aligned_mean(normalized, total, drift, batch)


def _phase_guess(mc, rc, previous: bool, last) -> torch.Tensor:
    """Initial shifts ``(n, D)`` of one batch from phase correlation of the clipped frames.

    Each guess is kept only where it matches better than zero (or than the previous
    pair's guess ``last``), as ``register`` checks its candidates (:mod:`.search`).
    """
    guess = -phase_correlation(gaussian_blur(rc, 1.0), gaussian_blur(mc, 1.0))
    return select_shifts(mc, rc, [guess, *_start_candidates(guess, previous, last)])


def _optimize_frames(
    total,
    batch_inputs,
    model,
    shape,
    schedule,
    levels,
    batch,
    grid_spacing,
    steps,
    history,
    state,
    grid: Grid,
    ref_mask=None,
):
    """The generic optimizer on batches of frames (a generator returning the models).

    ``batch_inputs(sl)`` gives batch ``sl``'s ``(moving (n, 1, *S), refs (1 or n, 1, *S),
    initial matrices or None)``; ``ref_mask`` ``(1, 1, *S)``: where the reference may be
    matched (None: everywhere). Every frame and the reference lie on ``grid``; the
    pyramid follows its anisotropy and ``grid_spacing`` is in its finest pixels.
    """
    shapes = level_shapes(shape, levels, grid.spacing)
    weights = (
        [None] * levels
        if ref_mask is None
        else [(w > 0.5).to(ref_mask.dtype) for w in build_pyramid(ref_mask, shapes)]
    )
    models = []
    for sl in _batches(total, batch):
        f, r, init = batch_inputs(sl)
        n = f.shape[0]
        if model in LINEAR_MODELS:
            mdl = LinearModel(
                model,
                shape,
                shape,
                n,
                init=init,
                device=f.device,
                fixed_grid=grid,
                moving_grid=grid,
            )
        else:
            mdl = DenseModel(
                model,
                shape,
                n,
                grid_spacing=grid_spacing,
                steps=steps,
                device=f.device,
                spacing=grid.spacing,
                fixed_grid=grid,
                moving_grid=grid,
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
                mdl,
                build_pyramid(r, shapes),
                build_pyramid(f, shapes),
                weights,
                schedule,
                history,
                spacing=grid.spacing,
            ),
            convert,
        )
        models.append(mdl)
        if stopped:
            state["stopped"] = True
            break
    return models


def _optimizer_route(
    src,
    value_range,
    reference,
    ref_index,
    batch,
    history,
    state,
    *,
    grid,
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
    shape = src.frame_shape
    normalized, clipped = _readers(src, value_range)
    previous = reference == "previous"
    total = src.total - previous
    ref_mask = None
    mean = None
    if reference == "mean":
        mean, ref_mask = _mean_reference(normalized, clipped, src.total, batch)
    levels_n = auto_levels(shape, spacing=grid.spacing) if levels in ("auto", None) else int(levels)
    optimizer = resolve_optimizer("auto", model, metric)
    its = level_iterations(iterations, model, shape, levels_n, full_resolution, optimizer)
    unit = min(grid.spacing)
    schedule = make_schedule(
        model, lr, its, tol, regularization, report_every, metric, window, optimizer, unit
    )
    # register's conventions: the control grid 8 finest pixels apart unless given in
    # physical units, and a blur of one finest pixel size (fewer pixels along coarse axes).
    control = 8.0 if grid_spacing is None else grid_spacing / unit
    sigma = [unit / s for s in grid.spacing]
    pairs = _pair_reader(normalized, "first" if mean is not None else reference, ref_index)
    linear = model in LINEAR_MODELS
    last = None

    def batch_inputs(sl):
        """The batch's moving frames and references, blurred as register() blurs them (less
        noise on the gradient, less bias from bilinear interpolation), and the
        phase-correlation guesses of linear models."""
        nonlocal last
        f, r = pairs(sl)
        init = None
        if linear:
            guess = _phase_guess(clip_unit(f), clip_unit(r), previous, last)
            last = guess[-1]
            init = _shift_matrices(guess)
        refs = mean if mean is not None else r
        return gaussian_blur(f, sigma), gaussian_blur(refs, sigma), init

    models = yield from _optimize_frames(
        total,
        batch_inputs,
        model,
        shape,
        schedule,
        levels_n,
        batch,
        control,
        steps,
        history,
        state,
        grid,
        ref_mask,
    )
    transforms = [t for mdl in models for t in mdl.transforms()]
    transforms += [_identity(model, shape, grid)] * (total - len(transforms))
    if previous:
        transforms = _chain(transforms, model, shape, grid)
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
    for p in pairwise:
        current = compose(torch.as_tensor(p.to_displacement(shape))[None], current)
        out.append(DisplacementTransform(current[0].numpy()).with_grids(grid, grid))
    return out
