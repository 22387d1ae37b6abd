"""``Transform.apply`` on arrays larger than memory: one dask task per output chunk.

Each output chunk reads only the input region it needs (solved geometry, as dask-image's
``affine_transform``): the box around the chunk's preimage (a linear transform maps the
chunk's corners; a dense one is bounded by ``x + d(x)`` over the chunk), widened by the
interpolation footprint and a one-pixel margin against rounding, clipped to the input.
The chunk is then resampled from that box by the same operators the in-memory ``apply``
uses, so both agree to float32 rounding at every chunking (order 0 is exact: positions
are rounded in the input's own coordinates, then shifted into the box).

Computed with whatever dask scheduler is active: with a ``dask.distributed`` client the
chunks run as tasks on its workers, each holding one input box and one output chunk.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from ..io import budget as _budget
from ..io import lazy, trim
from ..io.tasks import local_tasks
from ..ops import warp_affine
from ..ops._sampling import _pad_singleton_axes, displacement_to_grid, grid_sample

#: default output chunk side per spatial axis (2D, 3D) when the input's chunks do not fit
DEFAULT_CHUNK = {2: 1024, 3: 128}


def apply_chunked(transform, array, *, order: int, output_shape, chunks, memory_budget=None):
    """``transform.apply(array, order, output_shape)`` as a lazy dask array.

    Parameters
    ----------
    transform : a :class:`~.transforms.Transform` (``matrix`` for linear ones, else
        ``to_displacement``), of ``D`` spatial axes
    array : NumPy, dask or zarr array, shape ``(*C, *S)``, real numbers; never read whole
    order : 0 (nearest, exact for labels) or 1 (linear, zeros outside)
    output_shape : the spatial output shape ``S_out`` (None: ``S``)
    chunks : int or ``D`` ints, the output's spatial chunk shape; None: the input's spatial
        chunks (when regular), else :data:`DEFAULT_CHUNK`. Leading axes keep the input's.
    memory_budget : bytes or a size string (default: :mod:`napari_simwarp.io.budget`'s);
        each task's input box and output chunk must fit (checked before anything is read):
        tasks take fewer planes of the leading axes than the input's chunks hold where
        those would not fit, and an input chunk larger than the budget is refused

    Returns
    -------
    dask.array.Array, shape ``(*C, *S_out)``; dtype as the in-memory ``apply``: order 0
    keeps the input's, order 1 keeps floats (float32 for everything else).
    """
    lazy.check_array(array, "array")
    src = lazy.as_dask(array)
    d = transform.ndim
    if src.ndim < d:
        raise ValueError(
            f"array must have at least {d} dimensions (the transform is {d}-D), got shape "
            f"{src.shape}"
        )
    if src.size == 0:
        raise ValueError(f"array must not be empty, got shape {src.shape}")
    spatial = tuple(src.shape[src.ndim - d :])
    out_shape = transform._output_shape(spatial, output_shape)
    out_chunks = _output_chunks(chunks, src, d, out_shape)
    dtype = _output_dtype(np.dtype(src.dtype), order)
    field = None if hasattr(transform, "matrix") else transform.to_displacement(out_shape)
    plans = _plans(transform, field, out_chunks, spatial, order)
    budget = _budget.memory_budget(memory_budget)
    _check_source_chunks(src, budget)
    lead_chunks = _lead_chunks(src.chunks[: src.ndim - d], _plane_bytes(plans, src), budget)
    return _assemble(src, transform, field, plans, out_chunks, lead_chunks, d, order, dtype)


def _output_dtype(dtype: np.dtype, order: int) -> np.dtype:
    """As the in-memory ``apply``: nearest keeps the dtype, linear keeps floats."""
    if order == 0 or np.issubdtype(dtype, np.floating):
        return dtype
    return np.dtype(np.float32)


def _output_chunks(chunks, src, d: int, out_shape) -> tuple[tuple[int, ...], ...]:
    """Per spatial axis, the output chunk sizes (dask's ``chunks`` form)."""
    if chunks is None:
        own = src.chunks[src.ndim - d :]
        regular = all(len(set(c[:-1])) <= 1 and c[-1] <= c[0] for c in own)
        if regular and tuple(sum(c) for c in own) == tuple(out_shape):
            return tuple(own)
        sizes = (DEFAULT_CHUNK[d],) * d
    else:
        sizes = (chunks,) * d if isinstance(chunks, (int, np.integer)) else tuple(chunks)
        if (
            len(sizes) != d
            or any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) for n in sizes)
            or any(n < 1 for n in sizes)
        ):
            raise ValueError(f"chunks must be a positive int or {d} positive ints, got {chunks!r}")
    return tuple(
        tuple(min(c, n - s) for s in range(0, n, c))
        for c, n in zip((int(c) for c in sizes), out_shape)
    )


def _plans(transform, field, out_chunks, spatial, order) -> dict:
    """Per output chunk (its block index): the output region and the input box to read."""
    d = len(spatial)
    plans = {}
    for index, region in lazy.block_regions(out_chunks).items():
        start = [s.start for s in region]
        stop = [s.stop for s in region]
        if field is None:
            corners = np.array(list(itertools.product(*[(a, b - 1) for a, b in zip(start, stop)])))
            m = transform.matrix
            positions = corners @ m[:d, :d].T + m[:d, d]
            low, high = positions.min(axis=0), positions.max(axis=0)
        else:
            grid = np.meshgrid(*[np.arange(a, b) for a, b in zip(start, stop)], indexing="ij")
            low = np.array([(field[a][region] + grid[a]).min() for a in range(d)])
            high = np.array([(field[a][region] + grid[a]).max() for a in range(d)])
        # floor and floor + 1 are read by linear interpolation, rint by nearest; one more
        # pixel each side absorbs the rounding of the sampling grid.
        box_lo = np.clip(np.floor(low).astype(np.int64) - 1, 0, spatial)
        box_hi = np.clip(np.floor(high).astype(np.int64) + 3, 0, spatial)
        box = None if (box_hi <= box_lo).any() else tuple(map(slice, box_lo, box_hi))
        plans[index] = (region, box)
    return plans


def _plane_bytes(plans, src) -> int:
    """The most one task holds per plane of the leading axes: its input box as read and as
    float, its output chunk and the output's float work copy."""
    worst = 0
    for region, box in plans.values():
        box_px = 0 if box is None else math.prod(s.stop - s.start for s in box)
        out_px = math.prod(s.stop - s.start for s in region)
        worst = max(worst, box_px * (src.dtype.itemsize + 8) + out_px * 12)
    return worst


def _check_source_chunks(src, budget) -> None:
    """Refuse, before reading, an input whose one chunk exceeds ``budget``: any box read
    from it reads that chunk whole."""
    shape = tuple(max(c) for c in src.chunks)
    _budget.refuse(
        math.prod(shape) * src.dtype.itemsize,
        budget,
        what=f"one chunk of array (shape {shape}), read whole to get any part of it,",
        advice="rechunk array to smaller chunks (dask: array.rechunk(...); Zarr: smaller chunks)",
    )


def _lead_chunks(chunks, plane: int, budget) -> tuple:
    """The leading axes' chunks of the tasks: the input's, split (the largest chunks
    halved, in turn) until the tasks dask runs at once fit ``budget`` together (``plane``
    bytes per plane; one plane per task at least). A stack chunked over 16 frames then
    gives tasks of fewer frames instead of a refusal, each slicing its frames out of the
    chunk it reads. Refuses when one plane's task cannot fit."""
    _budget.refuse(
        plane,
        budget,
        what="one output chunk of apply (its input box and output, one plane)",
        advice="choose smaller chunks (chunks=)",
    )
    share = budget.bytes // local_tasks()  # dask runs that many tasks at once
    out = [tuple(c) for c in chunks]
    while out and math.prod(max(c) for c in out) * plane > max(share, plane):
        axis = max(range(len(out)), key=lambda a: max(out[a]))
        out[axis] = tuple(p for n in out[axis] for p in ((n + 1) // 2, n // 2) if p)
    return tuple(out)


def _assemble(src, transform, field, plans, out_chunks, lead_chunks, d, order, dtype):
    import dask
    import dask.array as da

    spatial = tuple(src.shape[src.ndim - d :])
    matrix = getattr(transform, "matrix", None)
    blocks = {}
    for lead_index, lead_region in lazy.block_regions(lead_chunks).items():
        lead_shape = tuple(s.stop - s.start for s in lead_region)
        for index, (region, box) in plans.items():
            shape = lead_shape + tuple(s.stop - s.start for s in region)
            if box is None:  # the chunk's preimage misses the input: zeros
                blocks[lead_index + index] = da.zeros(shape, dtype=dtype, chunks=shape)
                continue
            part = None if field is None else np.ascontiguousarray(field[(slice(None), *region)])
            task = dask.delayed(resample_block, pure=True)(
                src[lead_region + box], region, box, spatial, order, matrix, part
            )
            blocks[lead_index + index] = da.from_delayed(task, shape=shape, dtype=dtype)
    counts = tuple(len(c) for c in lead_chunks) + tuple(len(c) for c in out_chunks)
    return lazy.from_blocks(blocks, counts)


def _positions(region, matrix, field_part) -> np.ndarray:
    """Input positions ``(D, *chunk)`` (float64, pixels of the whole input) of the output
    pixels in ``region``, computed as the in-memory nearest path computes them."""
    d = len(region)
    grid = np.stack(np.meshgrid(*[np.arange(s.start, s.stop) for s in region], indexing="ij"))
    if matrix is None:
        return field_part.astype(np.float64) + grid
    linear, shift = matrix[:d, :d], matrix[:d, d]
    return np.tensordot(linear, grid.astype(np.float64), axes=1) + shift.reshape(-1, *[1] * d)


def resample_block(block, region, box, spatial, order, matrix=None, field_part=None):
    """One output chunk from its input box (a task): :func:`_resample_block`, then the
    memory its work copies held handed back to the system (they were freed in a dask
    thread's malloc arena, which would keep them: :mod:`napari_simwarp.io.trim`)."""
    out = _resample_block(block, region, box, spatial, order, matrix, field_part)
    trim.release()
    return out


def _resample_block(block, region, box, spatial, order, matrix=None, field_part=None):
    """One output chunk from its input box.

    Parameters
    ----------
    block : array ``(*C, *B)``, the input box ``box`` (slices of the input's spatial axes)
    region : slices of the output's spatial axes, the chunk ``(*R)``
    spatial : the input's spatial shape
    order : 0 or 1
    matrix : ``(D + 1, D + 1)`` fixed → moving pixels, for a linear transform
    field_part : ``(D, *R)`` the displacement over the chunk, for a dense one

    Returns
    -------
    ndarray ``(*C, *R)``, the same values as the in-memory ``apply`` over ``region``.
    """
    block = np.asarray(block)
    d = len(spatial)
    lead = block.shape[: block.ndim - d]
    box_shape = block.shape[block.ndim - d :]
    box_lo = np.array([s.start for s in box])
    start = np.array([s.start for s in region])
    out_shape = tuple(s.stop - s.start for s in region)
    column = (-1, *[1] * d)
    if order == 0:
        # Rounded in the input's coordinates (rint's ties to even are not shift-invariant),
        # then moved into the box: exactly the in-memory choice of source pixel.
        index = np.rint(_positions(region, matrix, field_part)).astype(np.int64)
        inside = ((index >= 0) & (index < np.asarray(spatial).reshape(column))).all(axis=0)
        last = np.asarray(box_shape).reshape(column) - 1
        local = np.clip(index - box_lo.reshape(column), 0, last)
        flat = block.reshape(-1, math.prod(box_shape))
        values = flat[:, np.ravel_multi_index(tuple(local), box_shape)]
        values[:, ~inside] = 0
        return values.reshape(*lead, *out_shape)
    work = np.float64 if block.dtype == np.float64 else np.float32
    t = torch.as_tensor(block.astype(work, copy=False)).reshape(1, -1, *box_shape)
    if matrix is not None:
        into_box, from_chunk = np.eye(d + 1), np.eye(d + 1)
        into_box[:d, d], from_chunk[:d, d] = -box_lo, start
        local = into_box @ matrix @ from_chunk
        out = warp_affine(
            t, torch.as_tensor(local).to(t.dtype), output_shape=out_shape, padding="grid-constant"
        )
    else:
        # warp()'s own engine, with the chunk's pixel 0 placed at its position in the box
        padded, pad_origin = _pad_singleton_axes(t, "grid-constant")
        origin = [float(s - b + p) for s, b, p in zip(start, box_lo, pad_origin)]
        displacement = torch.as_tensor(field_part).unsqueeze(0).to(t.dtype)
        grid = displacement_to_grid(displacement, padded.shape[2:], origin=origin)
        out = grid_sample(padded, grid.to(t.dtype), "linear", "grid-constant")
    out = out.reshape(*lead, *out_shape).numpy()
    return out.astype(block.dtype, copy=False) if np.issubdtype(block.dtype, np.floating) else out
