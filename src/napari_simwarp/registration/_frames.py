"""The frames of a stack, read batch by batch: NumPy, torch, dask or zarr alike.

A drift correction never holds the stack as float32: it reads the frames it works on
(a batch, and the one or two the reference needs) and converts only those. NumPy and
torch stacks are sliced in place; dask and zarr stacks are read region by region, so a
stack larger than memory streams through.
"""

from __future__ import annotations

import numpy as np
import torch

from ..io import budget as _budget
from ..io import lazy
from . import _inputs

#: values the intensity range is estimated from (as ``_inputs.robust_range``)
RANGE_SAMPLES = 200_000
#: frames the intensity range is sampled from, evenly spaced over the stack
RANGE_FRAMES = 16


class FrameSource:
    """A ``(T, *S)`` stack (``S`` 2-D or 3-D) read as float tensors, batch by batch.

    Parameters
    ----------
    stack : NumPy array (or array-like), torch tensor, dask or zarr array; not modified
    device : torch.device the batches are read onto
    name : the argument's name, for messages

    The shape and dtype are checked here, before anything is read; the values (finite,
    frames that vary) are checked as each batch is read.
    """

    def __init__(self, stack, device, name: str = "stack"):
        self.name = name
        self.device = device
        if isinstance(stack, torch.Tensor):
            data = stack.detach()
        elif lazy.is_lazy(stack) or lazy.is_multiscale(stack):
            data = lazy.check_array(stack, name)
        else:
            try:
                data = np.asarray(stack)
            except Exception as exc:
                raise TypeError(
                    f"{name} must be an array-like, got {type(stack).__name__}"
                ) from exc
        self.data = data
        self.lazy = lazy.is_lazy(data)
        self.shape = tuple(int(n) for n in data.shape)
        if len(self.shape) not in (3, 4):
            raise ValueError(
                f"{name} must be a (T, *S) stack of 2-D or 3-D frames (3-D or 4-D), got "
                f"shape {self.shape}"
            )
        if 0 in self.shape:
            raise ValueError(f"{name} must not be empty, got shape {self.shape}")
        self._keep = 0  # bytes of frames kept between passes (see keep)
        self._kept: dict[int, np.ndarray] = {}
        self._kept_bytes = 0
        if not self.lazy:  # lazy stacks had their dtype checked without reading
            self.raw(slice(0, 1))  # dtype checks (numbers, real) on one frame, in memory

    @property
    def total(self) -> int:
        return self.shape[0]

    @property
    def frame_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def frame_bytes(self) -> int:
        """Bytes of one frame as it is computed on (float32, or float64)."""
        return int(np.prod(self.frame_shape)) * (8 if self.is_float64 else 4)

    @property
    def field_bytes(self) -> int:
        """Bytes of one frame's dense transform (a ``(D, *S)`` displacement, as the frame's
        float dtype): what a deformable or diffeomorphic run holds per frame until it
        returns."""
        return len(self.frame_shape) * self.frame_bytes

    @property
    def is_float64(self) -> bool:
        return np.dtype(getattr(self.data, "dtype", np.float32)) == np.float64 or (
            isinstance(self.data, torch.Tensor) and self.data.dtype == torch.float64
        )

    @property
    def chunk_shape(self) -> tuple[int, ...] | None:
        """The largest chunk of a lazy stack (dask or zarr), as read whole to get any of
        its frames; None for a stack in memory."""
        if not self.lazy:
            return None
        chunks = self.data.chunks
        if chunks and isinstance(chunks[0], tuple):  # dask: the sizes along each axis
            return tuple(max(c) for c in chunks)
        return tuple(int(c) for c in chunks)

    def check_chunks(self, budget) -> None:
        """Refuse, before reading, a lazy stack whose one chunk does not fit in ``budget``
        (a :class:`~napari_simwarp.io.budget.Budget`): reading any frame reads its whole
        chunk, so no batch could be read within the budget."""
        shape = self.chunk_shape
        if shape is None:
            return
        size = int(np.prod(shape)) * np.dtype(self.data.dtype).itemsize
        if size > budget.bytes:
            _budget.refuse(
                size,
                budget,
                what=f"one chunk of {self.name} (shape {shape}, {shape[0]} frame(s)), read "
                "whole to get any of its frames,",
                advice=f"rechunk {self.name} to one frame per chunk (dask: "
                f"{self.name}.rechunk((1, ...)); Zarr: chunks (1, *frame shape))",
            )

    def keep(self, limit: int) -> None:
        """Keep up to ``limit`` bytes of a lazy stack's frames, as read (their own dtype),
        for the passes after the first: a drift correction reads the stack two to five
        times (registration, a mean, the scores), each read of a slow store paid again.

        The first frames read are kept and never evicted (the passes scan the stack in
        order, so a least-recently-used cache would lose every frame before it is read
        again); a stack that fits is then read once. ``limit`` is the part of the memory
        budget the run does not otherwise use; 0 (the default) keeps nothing. Not kept
        on a ``dask.distributed`` worker (a copy sent there keeps nothing): its memory is
        the worker's, and each task reads its own frames.
        """
        self._keep = max(0, int(limit)) if self.lazy else 0
        self._kept, self._kept_bytes = {}, 0

    def _read_kept(self, frames: slice) -> np.ndarray:
        """Frames ``frames`` of a lazy stack as NumPy ``(n, *S)``, from the kept frames
        where all of them are kept, else read (and kept while the limit allows)."""
        index = range(*frames.indices(self.total))
        if index.step != 1 or not any(t in self._kept for t in index):
            part = lazy.read(self.data, frames)
        else:  # the runs of frames not kept read, each once
            part = np.empty((len(index), *self.frame_shape), np.dtype(self.data.dtype))
            t = index.start
            while t < index.stop:
                if t in self._kept:
                    part[t - index.start] = self._kept[t]
                    t += 1
                    continue
                end = next((u for u in range(t, index.stop) if u in self._kept), index.stop)
                part[t - index.start : end - index.start] = lazy.read(self.data, slice(t, end))
                t = end
        size = int(np.prod(self.frame_shape)) * part.dtype.itemsize
        for i, t in enumerate(index):
            if t not in self._kept and self._kept_bytes + size <= self._keep:
                frame = part[i].copy()  # not a view: it would hold the whole batch
                frame.flags.writeable = False
                self._kept[t] = frame
                self._kept_bytes += size
        return part

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_keep=0, _kept={}, _kept_bytes=0)  # frames stay in this process
        return state

    def raw(self, frames: slice) -> torch.Tensor:
        """Frames ``frames`` as given (float32, or float64 for float64 stacks), on the device,
        ``(n, *S)``; raises for NaN/Inf or non-numeric values."""
        if isinstance(self.data, torch.Tensor):
            part = self.data[frames]
        elif self._keep:
            part = self._read_kept(frames)
        else:
            part = lazy.read(self.data, frames)
        return _inputs.to_tensor(part, self.name, leading=1).to(self.device)

    def value_range(self) -> tuple[float, float]:
        """The stack's robust intensity range ``(lo, hi)`` (0.5th and 99.5th percentiles),
        from a strided sample of :data:`RANGE_FRAMES` evenly spaced frames, read one at a
        time: a statistic no batch can know alone, computed once, the same way for every
        kind of input."""
        picks = np.unique(np.linspace(0, self.total - 1, min(self.total, RANGE_FRAMES)).round())
        step = max(1, int(np.prod(self.frame_shape)) * len(picks) // RANGE_SAMPLES)
        sample = torch.cat([self.raw(slice(int(t), int(t) + 1)).reshape(-1)[::step] for t in picks])
        return _inputs.robust_range(sample, self.name)

    def normalized(self, frames: slice, value_range) -> torch.Tensor:
        """Frames rescaled so that ``value_range`` maps to ``[0, 1]``: float32
        ``(n, 1, *S)``. Raises a ValueError naming the first constant frame."""
        lo, hi = value_range
        out = ((self.raw(frames) - lo) / (hi - lo)).to(torch.float32)[:, None]
        flat = out.reshape(out.shape[0], -1)
        constant = (flat.amax(dim=1) - flat.amin(dim=1)) <= 0
        if bool(constant.any()):
            t = frames.start + int(constant.nonzero()[0, 0])
            raise ValueError(
                f"frame {t} of {self.name} is constant; there is nothing to align it by"
            )
        return out
