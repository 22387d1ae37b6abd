"""Writing images and maps as OME-Zarr (NGFF 0.4), chunk by chunk, resumably.

The result of a registration or a map may be larger than memory (a lazy dask array): it
is written block by block (one dask block is one Zarr chunk), never held whole. The store
is a multiscale pyramid (each level the previous one halved over the spatial axes, read
back from the store, averaged for images and subsampled for labels), chunked, compressed
(Blosc zstd) and carries the pixel sizes and the origin (``scale`` and ``translation`` per
level).

The metadata is built from ``ngff-zarr``'s data model (the OME-NGFF 0.4 ``Metadata``,
``Axis``, ``Dataset`` and ``Scale`` classes, so it follows the specification as that
library keeps it) and read back by it (:func:`read_ome_zarr`).

Resuming: the store records, level by level, the blocks already written (a journal in
``.simwarp/`` appended only after a group of blocks is stored) and the arguments of the
write (a key). A write that was interrupted and is run again with the same arguments
skips those blocks; a store written with other arguments, or complete, is never touched
without ``overwrite``. Input paths are never written over.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
from typing import NamedTuple

import numpy as np

from .._extras import require
from . import budget as _budget
from . import lazy, trim
from .images import ImageFileError

#: the optional modules (the large extra) behind writing and reading OME-Zarr images
MODULES = ["zarr", "dask.array", "ngff_zarr"]

JOURNAL = ".simwarp"
#: the key under which the store's own attributes record a write in progress
MARK = "napari_simwarp"
#: levels="auto": halve until the largest spatial side is below this
PYRAMID_MIN_SIDE = 256
MAX_LEVELS = 6
_AXIS_TYPES = {"t": "time", "c": "channel", "z": "space", "y": "space", "x": "space"}


def _axes_info(axes: str, ndim: int) -> list[str]:
    if not isinstance(axes, str) or len(axes) != ndim or len(set(axes)) != ndim:
        raise ValueError(f"axes must be {ndim} distinct letters (e.g. 'tyx'), got {axes!r}")
    axes = axes.lower()
    if any(a not in _AXIS_TYPES for a in axes) or "y" not in axes or "x" not in axes:
        raise ValueError(f"axes must use the letters t, c, z, y, x and hold y and x, got {axes!r}")
    return list(axes)


def _level_shapes(shape, axes, levels) -> list[tuple[int, ...]]:
    spatial = [i for i, a in enumerate(axes) if _AXIS_TYPES[a] == "space"]
    shapes = [tuple(shape)]
    want = MAX_LEVELS if levels == "auto" else int(levels)
    while len(shapes) < want:
        last = shapes[-1]
        if levels == "auto" and max(last[i] for i in spatial) < 2 * PYRAMID_MIN_SIDE:
            break
        if min(last[i] for i in spatial) < 2:
            break
        shapes.append(tuple(n // 2 if i in spatial else n for i, n in enumerate(last)))
    return shapes


def _metadata(axes, shapes, pixel_size, unit, name, origin) -> dict:
    """The NGFF 0.4 ``multiscales`` entry, through ngff-zarr's data model."""
    from ngff_zarr.v04.zarr_metadata import Axis, Dataset, Metadata, Scale, Translation

    spatial = [a for a in axes if _AXIS_TYPES[a] == "space"]
    sizes = dict(zip(spatial, pixel_size))
    starts = dict(zip(spatial, origin))
    datasets = []
    for level, shape in enumerate(shapes):
        factor = [
            shapes[0][i] // shape[i] if _AXIS_TYPES[a] == "space" else 1 for i, a in enumerate(axes)
        ]
        scale = [sizes.get(a, 1.0) * f for a, f in zip(axes, factor)]
        # a pixel of level k averages 2^k pixels: its center is half a span further in
        shift = [starts.get(a, 0.0) + sizes.get(a, 1.0) * (f - 1) / 2 for a, f in zip(axes, factor)]
        transforms = [Scale(scale)] + ([Translation(shift)] if any(shift) else [])
        datasets.append(Dataset(path=str(level), coordinateTransformations=transforms))
    metadata = Metadata(
        axes=[
            Axis(name=a, type=_AXIS_TYPES[a], unit=unit if _AXIS_TYPES[a] == "space" else None)
            for a in axes
        ],
        datasets=datasets,
        coordinateTransformations=None,
        name=name,
    )
    entry = dataclasses.asdict(metadata)
    entry.pop("extra", None)
    entry.pop("omero", None)
    entry.pop("coordinateTransformations", None)
    for key in ("type", "metadata"):
        if entry.get(key) is None:
            entry.pop(key, None)
    for axis in entry["axes"]:
        for key in [k for k, v in axis.items() if v is None]:
            axis.pop(key)
    return entry


def _same_path(a: pathlib.Path, b: pathlib.Path) -> bool:
    try:
        if a.exists() and b.exists() and os.path.samefile(a, b):
            return True
    except OSError:
        pass
    return a.resolve() == b.resolve()


def _writable(folder: pathlib.Path, where: str) -> None:
    existing = folder
    while not existing.exists():
        existing = existing.parent
    try:  # the only sure test of a folder: write in it
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise ImageFileError(
            f"{where} cannot be written: {str(existing)!r} is not a writable folder "
            f"({exc.strerror or exc})"
        ) from exc


def _store_state(path: pathlib.Path):
    """``None`` (no store), or the store's own record ``{"key", "complete"}`` ({} for a
    Zarr store written by something else)."""
    for name in (".zattrs", "zarr.json"):
        attrs = path / name
        if attrs.exists():
            try:
                data = json.loads(attrs.read_text())
            except (OSError, ValueError):
                return {}
            data = data.get("attributes", data)
            return data.get(MARK, {})
    return None


def check_store(path, *, key: str, what: str = "-o", inputs=None, overwrite=False, identity=None):
    """Check, before any work, that an OME-Zarr store may be written at ``path``.

    Returns ``"new"``, ``"resume"`` (an interrupted write with the same ``key``) or
    ``"replace"`` (an existing store, with ``overwrite``). Raises an
    :class:`~.images.ImageFileError` naming ``what`` for an input path, a folder or file
    that is not a store written here (never deleted), an existing store without
    ``overwrite``, an interrupted write from another version of the input (``identity``:
    ``{"name": ..., "identity": io.identity.input_identity(...)}``, recorded with the
    write), and a folder that cannot be written.
    """
    path = pathlib.Path(path)
    where = f"{what}: {str(path)!r}"
    for name, source in (inputs or {}).items():
        if source is not None and _same_path(path, pathlib.Path(source)):
            raise ImageFileError(
                f"{where} is an input ({name}); inputs are never written over: "
                "choose another output"
            )
    _writable(path if path.is_dir() else path.parent, where)
    if not path.exists():
        return "new"
    if not path.is_dir():
        raise ImageFileError(f"{where} exists and is a file, not a Zarr store")
    state = _store_state(path)
    if state is None:
        if any(path.iterdir()):
            raise ImageFileError(
                f"{where} is a folder that is not a Zarr store; it is never replaced: "
                "choose another output"
            )
        return "new"
    recorded = state.get("input")
    if (
        identity is not None
        and isinstance(recorded, dict)
        and not state.get("complete", False)
        and not overwrite
        and recorded != identity["identity"]
    ):
        from .identity import describe

        raise ImageFileError(
            f"{where} holds an interrupted write, but "
            f"{describe(recorded, identity['identity'], identity['name'])}; pass "
            "--overwrite (overwrite=True) to start the write again from the new input"
        )
    if state.get("key") == key and not state.get("complete", False) and not overwrite:
        return "resume"
    if overwrite:
        return "replace"
    done = "a complete store" if state.get("complete") else "a store written with other arguments"
    raise ImageFileError(
        f"{where} exists ({done}); pass --overwrite (overwrite=True) to replace it"
    )


def write_key(
    shape, dtype, axes, chunks, levels, pixel_size, unit, name, labels, extra="", origin=None
) -> str:
    """The identity of a write: a rerun with the same key resumes it."""
    fields = [list(shape), str(dtype), axes, chunks, levels, pixel_size, unit, name, labels, extra]
    if origin is not None and any(origin):  # (stores without an origin keep their key)
        fields.append(list(origin))
    text = json.dumps(fields, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_ome_zarr(
    path,
    data,
    *,
    axes: str,
    pixel_size=None,
    origin=None,
    unit=None,
    chunks=None,
    levels="auto",
    name="image",
    labels=False,
    dtype=None,
    overwrite=False,
    inputs=None,
    key_extra="",
    progress=None,
    memory_budget=None,
    identity=None,
) -> pathlib.Path:
    """Write ``data`` (NumPy, dask or zarr, never read whole) to an OME-Zarr store.

    Parameters
    ----------
    path : the store (a folder, conventionally ``*.zarr``)
    data : array ``(*L, *S)`` as ``axes`` names them
    axes : one letter per axis among t, c, z, y, x (e.g. ``"tyx"``, ``"zyx"``)
    pixel_size : the spatial axes' pixel sizes (default 1), in ``unit`` (e.g.
        "micrometer")
    origin : the physical position of pixel 0's center on the spatial axes (default 0), in
        ``unit``: the stores' ``translation`` (each coarser level's shifted by half its span)
    chunks : the Zarr chunk shape (default: ``data``'s dask chunks, or one plane of at
        most 1024² per chunk for NumPy input)
    levels : "auto" (halve until the largest side is below 256) or the number of levels
    labels : subsample instead of averaging for the pyramid (label images)
    dtype : the stored dtype (default ``data``'s); integers are rounded and clipped
    overwrite : replace an existing store (never an input)
    inputs : ``{name: path}`` of input files, never written over
    key_extra : anything else that identifies the write (for resuming)
    progress : ``callable(done, total)`` called as blocks are stored
    memory_budget : a group of blocks in flight must fit
    identity : ``{"name": ..., "identity": ...}`` of the input ``data`` comes from
        (:func:`~.identity.input_identity`), recorded with the write: a resume from an
        input that changed since is refused, saying what changed (put it in ``key_extra``
        too)

    Returns the store's path. An interrupted write rerun with the same arguments resumes.
    """
    # the large extra's install line, not a raw ModuleNotFoundError (dask) in a base install
    require({f"writing an OME-Zarr store ({path})": MODULES})
    path = pathlib.Path(path)
    lazy.check_array(data, "data")
    shape = lazy.shape_of(data)
    ax = _axes_info(axes, len(shape))
    d = sum(_AXIS_TYPES[a] == "space" for a in ax)
    pixel_size = [1.0] * d if pixel_size is None else [float(p) for p in pixel_size]
    if len(pixel_size) != d or not all(np.isfinite(pixel_size)) or min(pixel_size) <= 0:
        raise ValueError(f"pixel_size must be {d} positive numbers, got {pixel_size!r}")
    origin = _origin(origin, d)
    if levels != "auto" and (isinstance(levels, bool) or int(levels) < 1):
        raise ValueError(f"levels must be 'auto' or a positive int, got {levels!r}")
    out_dtype = np.dtype(dtype) if dtype is not None else np.dtype(data.dtype)
    source = _as_blocks(data, chunks, ax)
    block_shape = tuple(c[0] for c in source.chunks)
    key = write_key(
        shape,
        out_dtype,
        axes,
        block_shape,
        levels,
        pixel_size,
        unit,
        name,
        labels,
        key_extra,
        origin,
    )
    state = check_store(path, key=key, inputs=inputs, overwrite=overwrite, identity=identity)
    budget = _budget.memory_budget(memory_budget)
    block_bytes = int(np.prod(block_shape)) * max(out_dtype.itemsize, 4) * 3
    _budget.refuse(
        block_bytes, budget, what="one block of the output", advice="choose smaller chunks"
    )
    if state == "replace":
        shutil.rmtree(path)
    shapes = _level_shapes(shape, ax, levels)
    record = {"key": key} if identity is None else {"key": key, "input": identity["identity"]}
    root = _open_root(path, state, shapes, block_shape, out_dtype, record)
    if state != "resume":
        root.attrs["multiscales"] = [_metadata(ax, shapes, pixel_size, unit, name, origin)]
    group = max(1, min(64, budget.bytes // (2 * block_bytes)))
    totals = [_count_blocks(s, block_shape) for s in shapes]
    done = [0]

    def report(n):
        done[0] += n
        if progress is not None:
            progress(done[0], sum(totals))

    for level in range(len(shapes)):
        if level:
            source = _downsample(path, level, ax, labels, block_shape, out_dtype)
        _write_level(path, level, source, out_dtype, group, report)
    attrs = dict(root.attrs)
    attrs[MARK] = {**record, "complete": True}
    root.attrs.update(attrs)
    shutil.rmtree(path / JOURNAL, ignore_errors=True)
    return path


def _origin(origin, d: int) -> list[float]:
    """``origin`` checked: ``d`` finite numbers (None: zeros)."""
    if origin is None:
        return [0.0] * d
    try:
        values = [float(v) for v in np.asarray(origin, dtype=np.float64).reshape(-1)]
    except (TypeError, ValueError):
        raise TypeError(f"origin must be {d} numbers, got {origin!r}") from None
    if len(values) != d or not all(np.isfinite(values)):
        raise ValueError(f"origin must be {d} finite numbers, got {origin!r}")
    return values


def _as_blocks(data, chunks, axes):
    """``data`` as a dask array with regular chunks (one block, one Zarr chunk)."""
    if chunks is not None:
        return lazy.as_dask(data, tuple(chunks))
    if lazy.is_lazy(data):
        x = lazy.as_dask(data)
        return x.rechunk(tuple(max(c) for c in x.chunks))
    plane = tuple(
        min(n, 1024) if _AXIS_TYPES[a] == "space" and a != "z" else 1
        for a, n in zip(axes, data.shape)
    )
    return lazy.as_dask(np.asarray(data), plane)


def _open_root(path, state, shapes, block_shape, dtype, record):
    import numcodecs
    import zarr

    if state == "resume":
        return zarr.open_group(str(path), mode="r+", zarr_format=2)
    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    root.attrs[MARK] = {**record, "complete": False}
    compressor = numcodecs.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.BITSHUFFLE)
    for level, shape in enumerate(shapes):
        root.create_array(
            str(level),
            shape=shape,
            chunks=tuple(min(c, n) for c, n in zip(block_shape, shape)),
            dtype=dtype,
            compressors=compressor,
            chunk_key_encoding={"name": "v2", "separator": "/"},
            fill_value=0,
        )
    (path / JOURNAL).mkdir(exist_ok=True)
    return root


def _count_blocks(shape, block_shape) -> int:
    return int(np.prod([-(-n // min(c, n)) for n, c in zip(shape, block_shape)]))


def _journal(path, level) -> pathlib.Path:
    return path / JOURNAL / f"level{level}.txt"


def _store_block(block, path: str, level: int, region, dtype) -> int:
    """Write one block into the store (a task: opens the array by path, so it runs on any
    worker that sees the folder)."""
    import zarr

    values = np.asarray(block)
    if np.issubdtype(dtype, np.integer) and not np.issubdtype(values.dtype, np.integer):
        info = np.iinfo(dtype)
        values = np.clip(np.rint(values), info.min, info.max)
    zarr.open_array(f"{path}/{level}", mode="r+", zarr_format=2)[region] = values.astype(dtype)
    return 1


def _write_level(path, level, source, dtype, group, report):
    import dask

    journal = _journal(path, level)
    written = set(journal.read_text().split()) if journal.exists() else set()
    starts = [np.cumsum((0, *c))[:-1] for c in source.chunks]
    blocks = source.to_delayed()
    pending = []
    for index in np.ndindex(*blocks.shape):
        name = ",".join(map(str, index))
        if name in written:
            report(1)
            continue
        region = tuple(
            slice(int(s[i]), int(s[i]) + source.chunks[a][i])
            for a, (s, i) in enumerate(zip(starts, index))
        )
        pending.append(
            (name, dask.delayed(_store_block)(blocks[index], str(path), level, region, dtype))
        )
    for first in range(0, len(pending), group):
        part = pending[first : first + group]
        dask.compute(*[task for _, task in part])
        trim.release()  # the group's blocks, freed in the scheduler's threads (io/trim.py)
        with open(journal, "a") as f:
            f.write("".join(f"{name}\n" for name, _ in part))
            f.flush()
            os.fsync(f.fileno())
        report(len(part))


def _mean_dtype(dtype) -> type:
    """The dtype box means of ``dtype`` values are computed in: float32 for integers of at
    most 16 bits (a sum of up to 8 of them stays below 2**24, so every partial sum and the
    mean, a division by a power of two, are exact: the same values as in float64 at half
    the memory traffic), float64 otherwise."""
    dtype = np.dtype(dtype)
    return np.float32 if dtype.kind in "biu" and dtype.itemsize <= 2 else np.float64


def _downsample(path, level, axes, labels, block_shape, dtype):
    """Level ``level`` from level ``level - 1`` as stored: spatial axes halved (a 2×… box
    mean for images, every other pixel for labels), chunked as the store's arrays."""
    import dask.array as da

    prev = da.from_zarr(str(path / str(level - 1)))
    factors = {i: 2 if _AXIS_TYPES[a] == "space" else 1 for i, a in enumerate(axes)}
    if labels:
        out = prev[
            tuple(slice(None, (n // f) * f, f) for n, f in zip(prev.shape, factors.values()))
        ]
    else:
        out = da.coarsen(np.mean, prev.astype(_mean_dtype(prev.dtype)), factors, trim_excess=True)
    shape = out.shape
    return out.rechunk(tuple(min(c, n) for c, n in zip(block_shape, shape)))


class OmeZarrImage(NamedTuple):
    """One level of an OME-Zarr image: its data (a lazy dask array), axis letters, and the
    spatial axes' pixel sizes and origin (the physical position of pixel 0's center), both
    in array order."""

    data: object
    axes: str
    pixel_size: list[float]
    origin: list[float]


def read_ome_zarr(path, level=0, *, partial: bool = False) -> OmeZarrImage:
    """Level ``level`` of an OME-Zarr image (read by ngff-zarr), as an
    :class:`OmeZarrImage` ``(data, axes, pixel_size, origin)``.

    A coarser level's origin is its own (half its span further in than level 0's), so its
    pixels sit where the store says they do. A store whose write by napari-simwarp was
    interrupted (marked ``complete: false``) holds zeros where blocks are missing: it is
    refused (a ValueError saying so) unless ``partial=True``.
    """
    require({f"reading an OME-Zarr image ({path})": MODULES})
    from ngff_zarr import from_ngff_zarr

    state = _store_state(pathlib.Path(path))
    if state and state.get("complete") is False and not partial:
        raise ValueError(
            f"{str(path)!r} is a partial store: the napari-simwarp write that made it was "
            "interrupted (complete: false), and its missing blocks read as zeros. Rerun "
            "the command that wrote it to finish it (it resumes), or pass partial=True to "
            "read what is there"
        )

    multiscales = from_ngff_zarr(str(path))
    images = multiscales.images
    if not 0 <= level < len(images):
        raise ValueError(f"level {level} is out of range for the {len(images)} levels of {path}")
    image = images[level]
    axes = "".join(str(d) for d in image.dims)
    spatial = [a for a in axes if _AXIS_TYPES.get(a) == "space"]
    shift = image.translation or {}
    return OmeZarrImage(
        image.data,
        axes,
        [float(image.scale.get(a, 1.0)) for a in spatial],
        [float(shift.get(a, 0.0)) for a in spatial],
    )
