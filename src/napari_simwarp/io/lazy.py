"""Arrays as napari hands them over: NumPy, dask, zarr, and multiscale sequences.

napari gives a plugin ``layer.data`` as it is: a NumPy array, a dask array, a zarr array,
or for a multiscale layer a sequence of levels (largest first) whose ``np.asarray`` would
silently stack or pick a level. Nothing here turns a lazy array into memory whole: a
multiscale input is refused unless a level is picked (:func:`pick_level`), and reading
happens region by region (:func:`read`), after the caller has checked the memory budget.

No torch, no Qt.
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def is_dask(x) -> bool:
    """Whether ``x`` is a ``dask.array.Array`` (without importing dask when it is not)."""
    return type(x).__module__.startswith("dask.") and hasattr(x, "chunks")


def is_zarr(x) -> bool:
    """Whether ``x`` is a zarr array (v2 or v3)."""
    return type(x).__module__.startswith("zarr.") and hasattr(x, "chunks")


def is_lazy(x) -> bool:
    """Whether ``x`` is an array that is read on demand (dask or zarr), not held in memory."""
    return is_dask(x) or is_zarr(x)


def is_multiscale(x) -> bool:
    """Whether ``x`` is multiscale data: a sequence of two or more arrays (not lists of
    numbers) of one dimensionality whose sizes shrink, as napari's multiscale layers hold.

    napari's ``MultiScaleData`` is a sequence of this kind; a list of equal-shaped arrays
    (a stack given as a list) is not multiscale.
    """
    if not (isinstance(x, (list, tuple)) or type(x).__name__ == "MultiScaleData"):
        return False
    try:
        levels = [x[i] for i in range(len(x))]
    except Exception:
        return False
    if len(levels) < 2 or not all(hasattr(a, "shape") and hasattr(a, "dtype") for a in levels):
        return False
    shapes = [tuple(a.shape) for a in levels]
    if len({len(s) for s in shapes}) != 1:
        return False
    sizes = [math.prod(s) for s in shapes]
    return all(b < a for a, b in itertools.pairwise(sizes))


def levels_of(x) -> list:
    """The levels of multiscale data, largest first."""
    return [x[i] for i in range(len(x))]


def pick_level(x, level, name: str = "data"):
    """Level ``level`` (0: full resolution) of multiscale ``x``; ``x`` itself otherwise.

    Raises a ValueError naming ``name`` when ``x`` is multiscale and no level was given
    (never a silent choice), or when ``level`` is out of range.
    """
    if not is_multiscale(x):
        if level not in (None, 0):
            raise ValueError(f"{name} is not multiscale, so level must be None or 0, got {level!r}")
        return x
    levels = levels_of(x)
    shapes = ", ".join(str(tuple(a.shape)) for a in levels)
    if level is None:
        raise ValueError(
            f"{name} is multiscale ({len(levels)} levels: {shapes}); pick one explicitly "
            "(level=0 is full resolution, e.g. data[0] or level=0)"
        )
    if isinstance(level, bool) or not isinstance(level, (int, np.integer)):
        raise ValueError(f"level must be an int, got {level!r}")
    if not 0 <= int(level) < len(levels):
        raise ValueError(f"level {level} is out of range for {name}'s {len(levels)} levels")
    return levels[int(level)]


def check_array(x, name: str):
    """``x`` checked as a readable numeric array (NumPy, torch, dask or zarr); returned.

    Refused, with a message naming ``name``: multiscale data (pick a level first), a dask
    array whose chunk sizes are unknown (NaN: the result of boolean indexing), and dtypes
    that are not real numbers or booleans.
    """
    if is_multiscale(x):
        pick_level(x, None, name)
    if is_dask(x) and any(math.isnan(c) for chunks in x.chunks for c in chunks):
        raise ValueError(
            f"{name} is a dask array with unknown chunk sizes (shape {x.shape}); call "
            f"{name}.compute_chunk_sizes() first"
        )
    if is_lazy(x):
        dtype = np.dtype(x.dtype)
        if dtype.kind not in "biuf":
            what = "real numbers" if dtype.kind == "c" else "numbers"
            raise TypeError(f"{name} must hold {what}, got dtype {dtype}")
    return x


def shape_of(x) -> tuple[int, ...]:
    return tuple(int(n) for n in x.shape)


def read(x, region=...) -> np.ndarray:
    """``x[region]`` as a NumPy array (dask: computed with the active scheduler)."""
    part = x[region]
    if is_dask(part):
        part = part.compute()
    return np.asarray(part)


def as_dask(x, chunks="auto"):
    """``x`` as a dask array (dask arrays unchanged unless ``chunks`` is given explicitly;
    zarr arrays keep their own chunks by default)."""
    import dask.array as da

    if is_dask(x):
        return x if chunks == "auto" else x.rechunk(chunks)
    if is_zarr(x) and chunks == "auto":
        return da.from_array(x, chunks=x.chunks)
    return da.from_array(x, chunks=chunks)


class ReopenedArray:
    """An array in a file, read by path: ``opener(path)`` opens it afresh in each process
    that reads it, and it pickles as its path (and opener).

    A dask array over it (``dask.array.from_array(ReopenedArray(...), chunks=...)``) can
    be sent to ``dask.distributed`` workers, which read the frames they need themselves:
    an open file's Zarr view (tifffile's) cannot be pickled, and a memory map would be
    pickled as all its pixels. ``opener`` must be a module-level function (picklable).
    """

    def __init__(self, path, opener):
        self.path = str(path)
        self.opener = opener
        self._array = None
        array = self._open()
        self.shape = tuple(int(n) for n in array.shape)
        self.dtype = np.dtype(array.dtype)
        self.ndim = len(self.shape)

    def _open(self):
        if self._array is None:
            self._array = self.opener(self.path)
        return self._array

    def __getitem__(self, region) -> np.ndarray:
        array = self._open()
        if isinstance(array, np.memmap):
            # A memory map kept open keeps every page read through it in this process's
            # resident set (file-backed, but counted: a register-stack of a 96 MiB .npy
            # grew by 102 MiB with a 32 MiB budget). Mapped afresh for each read instead
            # (well under a millisecond), so each frame's pages go with its read.
            self._array = None
        part = np.asarray(array[region])
        # a view of a memory map is read-only and keeps the file open: a copy is neither
        return part if part.flags.writeable else part.copy()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_array"] = None  # opened again where it is read
        return state


def block_regions(chunks) -> dict[tuple[int, ...], tuple[slice, ...]]:
    """Every block of a dask ``chunks`` tuple (sizes per axis): its index → its region."""
    starts = [[0, *itertools.accumulate(sizes)] for sizes in chunks]
    return {
        index: tuple(slice(s[i], s[i + 1]) for s, i in zip(starts, index))
        for index in itertools.product(*(range(len(sizes)) for sizes in chunks))
    }


def from_blocks(blocks: dict, counts: tuple[int, ...]):
    """One dask array of ``blocks`` (block index → dask array), ``counts`` blocks per axis."""
    import dask.array as da

    def nest(prefix: tuple):
        if len(prefix) == len(counts):
            return blocks[prefix]
        return [nest((*prefix, i)) for i in range(counts[len(prefix)])]

    return da.block(nest(()))
