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
and only what the reference needs is kept (one frame, or a running mean). Each pass over
the batches is a *job* per batch that reads its own frames and returns something small;
with a ``dask.distributed`` client active, the jobs of a dask or zarr stack run as tasks on
its workers (:mod:`._batches`), in parallel for every reference: ``"previous"`` pairs
are independent (the transforms are chained afterwards) and the sums of ``"mean"`` are
reduced by tasks. Batches are sized
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
from ._batches import batches, runner_for
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
from .quality import emit, lowest_jacobian, masked_zncc, problems
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
    ``transforms`` that batch's best transforms so far. A run here gives one per
    iteration; a run on a ``dask.distributed`` cluster one per finished batch (in the
    order they finish), with that batch's final transforms and loss.
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
        Gauss–Newton) for the linear models, "lncc" (local NCC, Adam) for the dense
        ones, as in ``register``. Chosen by measurement on
        rigid drift with every reference, photobleaching and noise (docs/benchmarks.md,
        "Drift correction: register_stack's metric"): several times faster than "lncc" and
        as accurate or more, but for bleaching with heavy noise; "mse" fails when the
        intensity decays over the stack.
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
        iteration (frames not reached keep the identity); on a cluster, the batches not
        finished are cancelled.
    device : "auto" or a device; with a ``dask.distributed`` client active and a dask or
        zarr stack, the frame batches run as tasks on its workers (each task reads its own
        frames and holds one batch; this process holds the transforms), each resolving
        ``device`` for itself. The results are those of a run here.
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
    window = _options.window(window)  # its own error first (a zero or NaN window)
    metric = default_metric(model, metric, window)
    check_choice(metric, "metric", METRICS)
    levels = _options.levels(levels)
    grid_spacing = _options.optional_positive(grid_spacing, "grid_spacing")
    steps = _options.steps(steps)
    dev = resolve_device(device)
    src = FrameSource(stack, dev)
    _inputs.check_axes_for_model(model, src.frame_shape, "the stack's frames")
    grid = Grid.make(len(src.frame_shape), spacing, origin)
    ref_index = _reference_index(reference, src.total)
    dense = model not in LINEAR_MODELS
    runner = runner_for(src, device)
    budgets = _budgets(memory_budget, dev, runner)
    batch = _batch_size(
        batch_size, src, metric if dense or model != "translation" else None, dense, budgets
    )
    _check_stack_memory(src, batch, metric, dense, model, budgets, batch_size != "auto")
    value_range = src.value_range()  # one range for the whole stack
    history: list[float] = []
    state = {"stopped": False}
    if model == "translation":
        # One grid for every frame: the pixel shifts are the physical ones over the
        # spacing, so phase correlation works in pixels unchanged.
        transforms = yield from _translation_route(
            runner, value_range, reference, ref_index, batch, iterations, history, state, grid
        )
    else:
        transforms = yield from _optimizer_route(
            runner,
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
        runner, src, value_range, transforms, reference, ref_index, batch
    )
    dense = model not in LINEAR_MODELS
    folding = (
        [lowest_jacobian(t.to_displacement(src.frame_shape)) for t in transforms] if dense else None
    )
    found = _assess_frames(final, initial, overlap, dense, folding)
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


def _budgets(memory_budget, device, runner) -> tuple[_budget.Budget, _budget.Budget]:
    """``(RAM, device)`` budgets; on the CPU they are one pool (the same budget).

    On a cluster the default RAM budget is also capped by a worker thread's share of its
    worker's memory limit (each task holds one batch, and a worker runs one per thread).
    """
    ram = _budget.memory_budget(memory_budget, torch.device("cpu"))
    task = runner.task_budget() if memory_budget is None else None
    if task is not None and task.bytes < ram.bytes:
        ram = task
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


def _held_bytes(src: FrameSource, batch: int, dense: bool = False) -> int:
    """RAM held besides the batch's work: the aligned stack when it is returned in memory,
    the frames the reference keeps (up to four), a batch as read, and a dense model's
    result (one full-resolution field per frame, held to the end: issue 28)."""
    frames = 4 + batch + (0 if src.lazy else src.total)
    return frames * src.frame_bytes + (src.total * src.field_bytes if dense else 0)


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
    room = device.bytes - (_held_bytes(src, 0, dense) if device is ram else 0)
    fit = int(room // max(per + (src.frame_bytes if device is ram else 0), 1))
    if device is ram:
        fit = min(fit, max(CPU_BATCH_BYTES, src.total * src.frame_bytes // 4) // per)
    return max(1, min(src.total, fit, AUTO_BATCH_MAX))


_MEMORY_ADVICE = (
    "crop or downsample the frames, choose metric "
    "'mse' or 'ncc', give the stack as a dask or zarr array (the aligned stack is then "
    "lazy), or use another device"
)


def _check_stack_memory(src, batch, metric, dense, model, budgets, batch_given=True) -> None:
    """Refuse, with the figures and before any frame is read, a run that cannot fit.

    The advice names ``batch_size`` only when the caller gave one above 1: "auto" already
    chose the largest batch that fits (at least 1), and the widgets have no such setting.
    """
    advice = ("use a smaller batch_size, " if batch_given and batch > 1 else "") + _MEMORY_ADVICE
    ram, device = budgets
    src.check_chunks(ram)  # a chunk is read whole: it must fit before any batch can
    work = batch * _frame_work(src, None if model == "translation" else metric, dense)
    held = _held_bytes(src, batch, dense)
    what = (
        f"aligning {src.total} frames of shape {src.frame_shape} (batches of {batch}"
        + ("" if src.lazy else ", the aligned stack in memory")
        + (
            f", a {model} field per frame: {_budget.format_bytes(src.total * src.field_bytes)}"
            if dense
            else ""
        )
        + ")"
    )
    if device is ram:
        _budget.refuse(work + held, ram, what=what, advice=advice)
    else:
        _budget.refuse(work, device, what=what + " on " + str(src.device), advice=advice)
        _budget.refuse(held, ram, what=what + " in RAM", advice=advice)


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


def warped_stack(data, transforms, device) -> object:
    """The aligned stack of ``data`` ``(T, *S)`` from its per-frame ``transforms``: lazy
    (:func:`lazy_warped`) for a dask or zarr ``data``; else a NumPy array warped frame by
    frame (a base install has no dask)."""
    from ..io import lazy

    if lazy.is_lazy(data):
        return lazy_warped(data, transforms, device)
    return np.concatenate(
        [
            _warp_block(np.asarray(data[t : t + 1]), transforms[t : t + 1], str(device))
            for t in range(len(transforms))
        ]
    )


def _score_view(x: torch.Tensor, value_range) -> torch.Tensor:
    """Frames ``(n, *S)`` as the scores compare them: clipped to the stack's robust
    ``value_range`` (hot or saturated pixels cannot dominate) and lightly blurred, as the
    estimates see them (less noise)."""
    lo, hi = value_range
    ndim = x.dim() - 1
    x = x.clamp(lo, hi)
    return gaussian_blur(x.reshape(-1, 1, *x.shape[-ndim:]), 1.0).reshape(x.shape)


def _target_part(src, sl, transforms, value_range):
    """Batch ``sl``'s share of the "mean" target (a job): the sums over its frames of the
    aligned and of the raw frames ``(*S)``, and where all of them landed ``(*S)``."""
    raw = src.raw(sl)
    moved, cover = warp_frames(raw, transforms)
    view = _score_view
    return view(moved, value_range).sum(dim=0), cover.all(dim=0), view(raw, value_range).sum(0)


def _add_target_parts(a, b):
    return a[0] + b[0], a[1] & b[1], a[2] + b[2]


def _mean_target(src, parts, total):
    """``(target, cover, start)``, each ``(1, 1, *S)``: the mean aligned frame (a real image
    only where every frame landed: ``cover``) and the mean raw frame."""
    target, cover, start = parts
    return (target / total)[None, None], cover[None, None], (start / total)[None, None]


def _frame_target(src, index, transform, value_range):
    """``(target, cover, start)`` of one reference frame: aligned, its coverage, raw."""
    raw = src.raw(slice(index, index + 1))
    moved, cover = warp_frames(raw, [transform])
    return _score_view(moved, value_range)[None], cover[None], _score_view(raw, value_range)[None]


def _score_batch(src, sl, transforms, value_range, target, keep):
    """Batch ``sl``'s scores (a job): final ZNCC with the aligned reference over the pixels
    both cover, initial ZNCC of the raw frames, overlap (each ``(n,)``); and its aligned
    frames as NumPy when ``keep`` (else None)."""
    target, target_cover, start = target
    raw = src.raw(sl)
    moved, cover = warp_frames(raw, transforms)
    shared = (cover[:, None] & target_cover).to(raw.dtype)
    final = masked_zncc(target, _score_view(moved, value_range)[:, None], shared)
    initial = masked_zncc(start, _score_view(raw, value_range)[:, None], torch.ones_like(shared))
    overlap = cover.flatten(1).double().mean(1)
    return final, initial, overlap, (moved.cpu().numpy() if keep else None)


def _finish(runner, src, value_range, transforms, reference, ref_index, batch):
    """The aligned stack and, per frame: the final ZNCC with the aligned reference over the
    pixels both cover, the initial ZNCC of the raw frames, and the overlap (fraction of
    pixels covered). Returns ``(warped, (final, initial, overlap))``.

    The frames are read and warped batch by batch (by ``runner``): once, or twice for
    ``reference="mean"`` (its target, the mean of the aligned frames, needs a pass of its
    own).
    """
    total = src.total
    if reference == "mean":
        parts = runner.reduce(
            _target_part, _add_target_parts, total, batch, value_range, sliced=transforms
        )
        target = runner.value(_mean_target, parts, total)
    else:
        index = 0 if reference == "previous" else ref_index
        target = runner.value(_frame_target, index, transforms[index], value_range)
    keep = not src.lazy
    out = np.empty(src.shape, np.float64 if src.is_float64 else np.float32) if keep else None
    scores = []
    each = runner.each(_score_batch, total, batch, value_range, target, keep, sliced=transforms)
    for sl, (final, initial, overlap, moved) in zip(batches(total, batch), each):
        if keep:
            out[sl] = moved
        scores.append((final.cpu(), initial.cpu(), overlap.cpu()))
    warped = out if keep else lazy_warped(src.data, transforms, src.device)
    return warped, tuple(torch.cat(x).numpy() for x in zip(*scores))


def _assess_frames(final, initial, overlap, dense: bool, folding=None) -> list[str]:
    """The warnings a stack earns: one per kind of problem, naming the frames that have it
    and quoting the worst of them (not one warning per frame); also emitted. ``folding``:
    each dense frame's lowest Jacobian determinant (None: not checked)."""
    fold = folding if folding is not None else [None] * len(final)

    def found(t):
        return problems(final[t], initial[t], overlap[t], dense, "zncc", fold[t])

    by_kind: dict[str, list[int]] = {}
    for t in range(len(final)):
        for kind in found(t):
            by_kind.setdefault(kind, []).append(t)
    worst_by = {"overlap": overlap, "folds": fold}
    messages = []
    for kind, frames in by_kind.items():
        worst = min(frames, key=lambda t: worst_by.get(kind, final)[t])
        listed = ", ".join(map(str, frames[:10])) + (", ..." if len(frames) > 10 else "")
        detail = found(worst)[kind]
        messages.append(f"frame(s) {listed}: {detail}")
    return emit(messages)


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


# -- the translation route ----------------------------------------------------------------


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
    ``grid``)."""
    its = 10 if iterations is None else int(iterations)
    shifts = yield from _translation_passes(
        runner, runner.src.total, batch, value_range, reference, ref_index, its, history, state
    )
    if reference == "previous":
        shifts = torch.cat([shifts.new_zeros(1, shifts.shape[1]), torch.cumsum(shifts, dim=0)])
    return [
        AffineTransform(m.numpy(), "translation").with_grids(grid, grid)
        for m in _shift_matrices(shifts)
    ]


# -- the optimizer route ------------------------------------------------------------------


def _mean_reference(runner, total, batch, value_range):
    """The mean of the drift-corrected frames and where every frame covers it (see
    :func:`_aligned_mean`), for the optimizer route: the frames are aligned as the
    translation route aligns them to a mean (to the first frame, then to the mean of
    those), so that the mean is as sharp as translations can make it."""
    state = {"stopped": False}
    drift = drive(_translation_passes(runner, total, batch, value_range, "mean", 0, 10, [], state))
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

    model: str
    shape: tuple
    schedule: object
    levels: int
    control: float
    steps: int
    grid: Grid
    sigma: list
    previous: bool


def _make_model(s: _OptimizerSettings, n: int, init, device):
    if s.model in LINEAR_MODELS:
        return LinearModel(
            s.model,
            s.shape,
            s.shape,
            n,
            init=init,
            device=device,
            fixed_grid=s.grid,
            moving_grid=s.grid,
        )
    return DenseModel(
        s.model,
        s.shape,
        n,
        grid_spacing=s.control,
        steps=s.steps,
        device=device,
        spacing=s.grid.spacing,
        fixed_grid=s.grid,
        moving_grid=s.grid,
    )


def _optimizer_job(src, sl, history, value_range, ref, mean_mask, s: _OptimizerSettings):
    """The generic optimizer on batch ``sl`` of moving frames (a job returning
    ``(transforms, stopped)``).

    The frames and their references are blurred as register() blurs them (less noise on
    the gradient, less bias from bilinear interpolation); linear models start from the
    phase-correlation guesses. ``mean_mask``: ``(mean, mask)`` to match every frame to
    (where the mask is set; ``ref`` then only gives the guesses), or None. Every frame and
    the reference lie on ``s.grid``; the pyramid follows its anisotropy and
    ``s.control`` is in its finest pixels.
    """
    f, r, lead = _read_pairs(src, sl, value_range, ref, s.previous, clipped=False)
    init = None
    if s.model in LINEAR_MODELS:
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

    def convert(progress):
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
            build_pyramid(gaussian_blur(refs, s.sigma), shapes),
            build_pyramid(gaussian_blur(f, s.sigma), shapes),
            weights,
            s.schedule,
            history,
            spacing=s.grid.spacing,
        ),
        convert,
    )
    return mdl.transforms(), stopped


def _optimizer_route(
    runner,
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
    src = runner.src
    shape = src.frame_shape
    previous = reference == "previous"
    total = src.total - previous
    mean_mask = None
    if reference == "mean":
        mean_mask = _mean_reference(runner, src.total, batch, value_range)
    levels_n = auto_levels(shape, spacing=grid.spacing) if levels in ("auto", None) else int(levels)
    _inputs.check_levels(model, shape, levels_n, grid.spacing)
    optimizer = resolve_optimizer("auto", model, metric)
    its = level_iterations(iterations, model, shape, levels_n, full_resolution, optimizer, metric)
    unit = min(grid.spacing)
    schedule = make_schedule(
        model, lr, its, tol, regularization, report_every, metric, window, optimizer, unit
    )
    # register's conventions: the control grid 8 finest pixels apart unless given in
    # physical units, and a blur of one finest pixel size (fewer pixels along coarse axes).
    settings = _OptimizerSettings(
        model=model,
        shape=shape,
        schedule=schedule,
        levels=levels_n,
        control=8.0 if grid_spacing is None else grid_spacing / unit,
        steps=steps,
        grid=grid,
        sigma=[unit / s for s in grid.spacing],
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
        transforms += part or [_identity(model, shape, grid)] * (sl.stop - sl.start)
    del parts  # the batches' lists: _chain frees each pair's field as it goes
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
    for i, p in enumerate(pairwise):
        pairwise[i] = None  # each pair's field freed once chained: T fields held, not 2T
        current = compose(torch.as_tensor(p.to_displacement(shape))[None], current)
        out.append(DisplacementTransform(current[0].numpy()).with_grids(grid, grid))
    return out
