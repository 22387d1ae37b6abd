"""register_stack's memory: the budgets, the batch size, and the refusal of a run that
cannot fit, made before any frame is read (:mod:`napari_simwarp.io.budget`)."""

from __future__ import annotations

import numpy as np
import torch

from ..io import budget as _budget
from . import _inputs
from ._frames import FrameSource


def _budgets(memory_budget, device, runner) -> tuple[_budget.Budget, _budget.Budget]:
    """``(RAM, device)`` budgets; on the CPU they are one pool (the same budget).

    On a cluster each task holds one batch, and a worker runs one per thread: the default
    RAM budget is also capped by a thread's share of its worker's memory limit, and a
    budget given is shared by the tasks a worker runs at once (it bounds each worker).
    """
    ram = _budget.memory_budget(memory_budget, torch.device("cpu"))
    task = runner.task_budget() if memory_budget is None else None
    if task is not None and task.bytes < ram.bytes:
        ram = task
    at_once = runner.tasks_at_once()
    if memory_budget is not None and at_once > 1:
        ram = _budget.Budget(
            ram.bytes // at_once, f"{ram.source}, shared by a worker's {at_once} threads"
        )
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


def _check_stack_memory(src, batch, metric, dense, model, budgets, batch_given=True) -> int:
    """Refuse, with the figures and before any frame is read, a run that cannot fit;
    return the RAM budget's bytes the run leaves spare (what :meth:`~._frames.FrameSource.
    keep` may hold).

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
        return ram.bytes - work - held
    _budget.refuse(work, device, what=what + " on " + str(src.device), advice=advice)
    _budget.refuse(held, ram, what=what + " in RAM", advice=advice)
    return ram.bytes - held
