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

The options become one :class:`~.plan.RunOptions` (as for :func:`~.pair.register`); the
routes live in :mod:`._stack_translation` and :mod:`._stack_optimizer`, batch sizes and
memory checks in :mod:`._stack_memory`, the aligned stack and its scores in
:mod:`._stack_output`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .._devices import resolve_device
from . import _inputs
from ._batches import runner_for
from ._driver import drive
from ._frames import FrameSource
from ._stack_batches import StackProgress
from ._stack_memory import _batch_size, _budgets, _check_stack_memory
from ._stack_optimizer import _optimizer_route
from ._stack_output import _assess_frames, _finish, lazy_warped, warp_frames, warped_stack
from ._stack_translation import _translation_route
from .grid import Grid
from .optimize import RunResult
from .plan import TRANSLATION_ROUTE_ITERATIONS, RunOptions
from .quality import lowest_jacobian

__all__ = [
    "REFERENCES",
    "StackProgress",
    "StackRegistrationResult",
    "lazy_warped",
    "register_stack",
    "register_stack_iter",
    "warp_frames",
    "warped_stack",
]

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
        it is refused before any frame is read. On a ``dask.distributed`` cluster it bounds
        each worker: the tasks a worker runs at once (its threads) share it.
    Other options as in :func:`~.register.register`.

    Returns
    -------
    StackRegistrationResult
        ``.transforms`` (one per frame, each carrying the grid as ``fixed_grid`` and
        ``moving_grid``, so ``.physical_matrix`` is in physical units), ``.warped``
        ``(T, *S)`` float32 (lazy for dask or zarr input), ``.shifts``.
    """
    # every other argument of the signature, passed on by name (one list of options: the
    # signature's)
    arguments = {k: v for k, v in locals().items() if k not in ("stack", "callback")}
    run = register_stack_iter(stack, **arguments)
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
    options = RunOptions.from_arguments(locals())  # the options among the arguments
    metric, dense = options.metric, options.dense
    dev = resolve_device(device)
    src = FrameSource(stack, dev)
    _inputs.check_axes_for_model(model, src.frame_shape, "the stack's frames")
    grid = Grid.make(len(src.frame_shape), spacing, origin)
    ref_index = _reference_index(reference, src.total)
    runner = runner_for(src, device)
    budgets = _budgets(memory_budget, dev, runner)
    batch = _batch_size(
        batch_size, src, metric if dense or model != "translation" else None, dense, budgets
    )
    spare = _check_stack_memory(src, batch, metric, dense, model, budgets, batch_size != "auto")
    # The budget's spare part keeps the frames a lazy stack's first pass reads, for the
    # passes after it (a slow store is read once where they fit).
    src.keep(spare)
    runner.bound(budgets[0].bytes)  # trims only past the budget
    value_range = src.value_range()  # one range for the whole stack
    history: list[float] = []
    state = {"stopped": False}
    if model == "translation":
        # One grid for every frame: the pixel shifts are the physical ones over the
        # spacing, so phase correlation works in pixels unchanged.
        its = _translation_iterations(options.iterations)
        transforms = yield from _translation_route(
            runner, value_range, reference, ref_index, batch, its, history, state, grid
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
            options=options,
        )
    warped, (final, initial, overlap) = _finish(
        runner, src, value_range, transforms, reference, ref_index, batch
    )
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


def _translation_iterations(iterations) -> int:
    """The translation route's Gauss–Newton iterations per pass (one int)."""
    if iterations is None:
        return TRANSLATION_ROUTE_ITERATIONS
    if not isinstance(iterations, int):
        raise ValueError(
            f"iterations must be one int for model='translation' (the iterations of each "
            f"Gauss–Newton pass), got {iterations!r}"
        )
    return iterations
