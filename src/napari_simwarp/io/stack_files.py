"""Stacks in plain files: TIFF and NumPy ``.npy``, read and written with no optional package.

``register-stack`` in a base install (no zarr, no dask) reads a ``.npy`` stack
memory-mapped and a TIFF stack memory-mapped where its pixels lie uncompressed in one
run (what tifffile and ImageJ write by default), else into memory after a check against
the memory budget. It writes the aligned stack frame by frame into a ``.tif``/``.tiff``
or ``.npy`` file, atomically (a partial file in the same folder, renamed when complete),
so a stack is never half written under its final name. No torch, no Qt.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from . import budget as _budget
from .images import (
    ImageFileError,
    _quiet_tifffile,
    check_target,
    check_tiff_complete,
    refuse_color_last_axis,
)

#: suffixes of the stack files read and written without optional packages
FILE_SUFFIXES = (".tif", ".tiff", ".npy")


def is_stack_file(path) -> bool:
    """Whether ``path`` names a TIFF or ``.npy`` file (by its suffix)."""
    return pathlib.Path(path).suffix.lower() in FILE_SUFFIXES


def check_tiff_stack(path, *, where: str) -> str:
    """Refuse, before anything is read, a TIFF that is no grey stack: truncated (its pixels
    run past the end of the file), or holding color samples or several channels per frame
    (tifffile's axes ``S``, ``C``), which would be taken for a spatial axis: an RGB
    ``(Y, X, 3)`` image read as 128 frames 3 pixels wide. Raises an :class:`ImageFileError`
    naming ``where``; returns tifffile's axes of the first series (e.g. ``"QYX"``)."""
    import tifffile

    try:
        with _quiet_tifffile(), tifffile.TiffFile(path) as tif:
            check_tiff_complete(tif, path, where)
            series = tif.series[0]
            axes, shape = series.axes, series.shape
    except ImageFileError:
        raise
    except Exception as exc:  # not a TIFF, or a damaged one: say which and why
        reason = " ".join(str(exc).split())[:160]
        raise ImageFileError(
            f"{where} could not be opened ({type(exc).__name__}: {reason})"
        ) from exc
    # Samples interleaved in each pixel (axes ending in S) are color; planar ones (a
    # leading S) are how tifffile stores a (3, Y, X) or (4, Y, X) array it is given
    # without a photometric: a short stack more likely than a planar RGB picture, read
    # as frames as before.
    color = axes.endswith("S") and shape[-1] > 1
    for axis, what in (("S", "color samples (RGB, RGBA)"), ("C", "channels")):
        if color if axis == "S" else axis in axes and shape[axes.index(axis)] > 1:
            raise ImageFileError(
                f"{where} has {shape[axes.index(axis)]} {what} per pixel (axes {axes!r}, "
                f"shape {tuple(shape)}); register-stack aligns a grey (T, Y, X) or "
                "(T, Z, Y, X) stack: save one channel, or the luminance, as its own file"
            )
    return axes


def check_stack_shape(shape, *, where: str, labelled: bool = False) -> None:
    """Refuse a stack that is not ``(T, Y, X)`` or ``(T, Z, Y, X)``; an array without axis
    labels (``labelled=False``: ``.npy``, Zarr) also when its last axis looks like color
    samples (see :func:`~.images.refuse_color_last_axis`)."""
    shape = tuple(int(n) for n in shape)
    if len(shape) not in (3, 4):
        raise ImageFileError(
            f"{where} has shape {shape}; expected a (T, Y, X) or (T, Z, Y, X) stack"
        )
    if not labelled:
        refuse_color_last_axis(
            shape,
            where,
            spatial=len(shape) - 1,
            advice="save the stack as grey (one channel or its luminance)",
        )


def open_tiff_in_memory(path, *, where: str, memory_budget=None) -> np.ndarray:
    """The first image series of a TIFF file as NumPy ``(T, *S)``: memory-mapped when its
    pixels are stored uncompressed in one run, else read whole, after checking that it
    fits the memory budget (``memory_budget``: bytes or a size string, as
    :func:`~.budget.memory_budget`). Raises an :class:`ImageFileError` naming ``where``."""
    import tifffile

    try:
        return tifffile.memmap(path, mode="r")
    except ValueError:  # compressed, tiled or scattered pages: not a memory map
        pass
    try:
        with tifffile.TiffFile(path) as tif:
            series = tif.series[0]
            need = int(np.prod(series.shape)) * np.dtype(series.dtype).itemsize
    except Exception as exc:
        raise ImageFileError(f"{where} could not be read as TIFF ({exc})") from exc
    _budget.refuse(
        need,
        _budget.memory_budget(memory_budget),
        what=f"reading {where} (compressed or tiled, so not memory-mapped) into memory",
        advice="pip install 'napari-simwarp[large]' to read it frame by frame instead",
    )
    return tifffile.imread(path, series=0)


def check_stack_output(path, *, what: str, inputs: dict, overwrite: bool = False):
    """:func:`~.images.check_target` for a stack file (``.tif``, ``.tiff``, ``.npy``)."""
    path = pathlib.Path(path)
    if not is_stack_file(path):
        raise ImageFileError(
            f"{what}: {str(path)!r} is not a stack file; use one of {', '.join(FILE_SUFFIXES)}"
        )
    return check_target(path, what=what, inputs=inputs, overwrite=overwrite)


def _cast(frame: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``frame`` as ``dtype``: integers rounded and clipped to the type's range, never
    rescaled (as :func:`~.images.write_image`)."""
    if frame.dtype == dtype:
        return frame
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        frame = np.clip(np.rint(frame), info.min, info.max)
    return frame.astype(dtype)


def write_stack(path, stack, *, dtype=None, progress=None) -> pathlib.Path:
    """Write ``stack`` ``(T, *S)`` (NumPy, or dask: computed one frame at a time) to a
    ``.tif``/``.tiff`` or ``.npy`` file, frame by frame, atomically.

    ``dtype``: the file's dtype (default: the stack's; integers are rounded and clipped).
    ``progress``: called ``progress(done, total)`` after each frame. Check the path with
    :func:`check_stack_output` first: this function does not re-check.
    """
    from .atomic import partial_path
    from .lazy import read

    path = pathlib.Path(path)
    shape = tuple(int(n) for n in stack.shape)
    dtype = np.dtype(stack.dtype if dtype is None else dtype)
    suffix = path.suffix.lower()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(path)  # short: a name that fits leaves room for it

    def frames():
        for t in range(shape[0]):
            yield _cast(read(stack, t), dtype)
            if progress is not None:
                progress(t + 1, shape[0])

    try:
        if suffix == ".npy":
            # Written through the file, not a memory map: a map's dirty pages stay in the
            # resident set until it is closed (a 64 MiB output grew it by 64 MiB).
            with open(partial, "wb") as f:
                header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False}
                np.lib.format.write_array_header_1_0(f, {**header, "shape": shape})
                for frame in frames():
                    f.write(np.ascontiguousarray(frame, dtype).tobytes())
        else:
            import tifffile

            pages = (page for frame in frames() for page in frame.reshape(-1, *shape[-2:]))
            big = int(np.prod(shape)) * dtype.itemsize > 2**32 - 2**25  # past classic TIFF
            with tifffile.TiffWriter(partial, bigtiff=big) as tif:
                tif.write(pages, shape=shape, dtype=dtype, photometric="minisblack")
        os.replace(partial, path)
    finally:
        if partial.exists():
            partial.unlink()
    return path
