"""Similarity maps of arrays of any size: NumPy or dask in, the same kind out.

The operators of :mod:`napari_simwarp.ops` take whole torch tensors; these functions take
the arrays a viewer or a script holds (NumPy, dask, zarr) and compute the map tile by
tile, each tile read with a halo of half the window and cropped back (overlap-and-crop,
one task per tile reading only its box), so the result equals the whole-array operator.
A dask or zarr input gives a lazy dask array (nothing is computed until asked); a NumPy
input gives NumPy.

Which axes are space is said explicitly by ``axes``: a string with one letter per axis,
``z``, ``y`` and ``x`` for space (the last two or three axes), anything else (``t``,
``c``...) for axes whose planes are separate images, e.g. ``"tyx"`` for a time-lapse of 2-D
frames (a stack of frames, never a volume) or ``"zyx"`` for a volume. 2-D arrays default
to ``"yx"``; 3-D and larger ones must say.

:func:`plane` computes the map of one plane only (the plane a viewer shows), reading only
the slab of the input it needs.

    from napari_simwarp import maps
    std = maps.local_std(dask_stack, window=15, axes="tyx")   # lazy, frame by frame
    ncc = maps.plane("local_ncc", a, b, index=(42,), axes="tyx", window=9)  # frame 42
"""

from __future__ import annotations

import math

import numpy as np

from .io import budget as _budget
from .io import lazy, trim
from .io.tasks import device_slot, local_tasks

SPATIAL = "zyx"
#: float32 maps per pixel of a tile alive while each map is computed (inputs, moment
#: sums, outputs; FFT spectra for ZNCC), rounded up
MAPS_PER_PIXEL = {"local_std": 8, "local_ncc": 24, "ssim": 28, "zncc": 24}
#: default tile side per spatial axis (2-D, 3-D) for NumPy input
TILE = {2: 1024, 3: 128}
KINDS = tuple(MAPS_PER_PIXEL)
#: the working set one tile's task may take unless chunks are given (the default tiling is
#: split until it fits): a few tasks at once stay well within a GiB
TILE_WORK_BYTES = 128 * 2**20


def local_std(x, *, window, axes=None, normalize=True, padding="reflect", device="cpu", **kw):
    """Local standard deviation map (:func:`napari_simwarp.ops.local_std`), tile by tile.

    Parameters
    ----------
    x : NumPy, dask or zarr array ``(*L, *S)``; ``axes`` says which axes are ``S``
    window, normalize, padding : as :func:`~napari_simwarp.ops.local_std`
    axes : str, e.g. ``"yx"``, ``"tyx"`` (frames), ``"zyx"`` (a volume), ``"tczyx"``
    device : torch device of the tiles' computation ("cpu", "cuda"...)
    chunks, memory_budget : tile shape (spatial) and budget, see :func:`tiled`

    Returns
    -------
    float32 (float64 for float64 input) map of ``x``'s shape: NumPy for NumPy input,
    a lazy dask array otherwise.
    """
    return tiled(
        "local_std", x, window=window, axes=axes, device=device,
        options=dict(window=window, normalize=normalize, padding=padding), **kw,
    )  # fmt: skip


def local_ncc(a, b, *, window=9, kernel="box", sigma=None, axes=None, device="cpu", **kw):
    """Local normalized cross-correlation map of ``a`` and ``b`` (same shape), tile by tile
    (:func:`napari_simwarp.ops.local_ncc`; see :func:`local_std` for the arguments)."""
    return tiled(
        "local_ncc", a, b, window=window, axes=axes, device=device,
        options=dict(window=window, kernel=kernel, sigma=sigma), **kw,
    )  # fmt: skip


def ssim(a, b, *, window=11, sigma=1.5, data_range=1.0, axes=None, device="cpu", **kw):
    """SSIM map of ``a`` and ``b`` (same shape), tile by tile
    (:func:`napari_simwarp.ops.ssim`; see :func:`local_std` for the arguments)."""
    return tiled(
        "ssim", a, b, window=window, axes=axes, device=device,
        options=dict(window=window, sigma=sigma, data_range=data_range), **kw,
    )  # fmt: skip


def zncc(image, template, *, axes=None, device="cpu", **kw):
    """ZNCC of ``template`` (NumPy, the spatial dimensions of ``image``) at every pixel of
    ``image``, the template centered on the pixel (``match_template(pad_input=True)``,
    scikit-image's convention), tile by tile (see :func:`local_std` for the arguments)."""
    template = np.asarray(template)
    return tiled(
        "zncc", image, window=template.shape, axes=axes, device=device,
        options=dict(template=template), **kw,
    )  # fmt: skip


# -- the machinery ------------------------------------------------------------------------


def parse_axes(axes, ndim: int) -> int:
    """The number of spatial axes ``D`` (trailing) that ``axes`` names, checked."""
    if axes is None:
        if ndim == 2:
            return 2
        raise ValueError(
            f"axes is required for {ndim}-D data: say which axes are space, e.g. 'tyx' (a "
            "stack of 2-D frames), 'zyx' (a volume) or 'tzyx'"
        )
    if not isinstance(axes, str) or len(axes) != ndim or len(set(axes)) != ndim:
        raise ValueError(
            f"axes must be {ndim} distinct letters, one per axis (e.g. 'tyx'), got {axes!r}"
        )
    spatial = [a in SPATIAL for a in axes.lower()]
    d = sum(spatial)
    if d not in (2, 3) or not all(spatial[ndim - d :]):
        raise ValueError(
            f"axes must end with the 2 or 3 spatial axes ('yx' or 'zyx'), got {axes!r}"
        )
    return d


def _halo(window, d: int) -> tuple[int, ...]:
    sizes = (window,) * d if isinstance(window, (int, np.integer)) else tuple(window)
    if len(sizes) != d:
        raise ValueError(f"window must be one int or {d} ints, got {window!r}")
    return tuple(int(n) // 2 for n in sizes)


def _compute(kind: str, blocks, d: int, device: str, options: dict) -> np.ndarray:
    """The map of NumPy ``blocks`` ``(*L, *S)`` (one per input), every leading plane a
    separate image: the torch operator on ``(N, 1, *S)`` tensors."""
    import torch

    from . import ops

    first = blocks[0]
    lead, spatial = first.shape[: first.ndim - d], first.shape[first.ndim - d :]
    dtype = np.float64 if first.dtype == np.float64 else np.float32
    dev = torch.device(device)
    with device_slot(dev):
        ts = [
            torch.as_tensor(np.asarray(b, dtype=dtype)).reshape(-1, 1, *spatial).to(dev)
            for b in blocks
        ]
        if kind == "local_std":
            out = ops.local_std(ts[0], **options)
        elif kind == "local_ncc":
            out = ops.local_ncc(ts[0], ts[1], **options)
        elif kind == "ssim":
            out = ops.ssim(ts[0], ts[1], **options)
        else:
            template = torch.as_tensor(options["template"].astype(dtype)).to(dev)
            out = ops.match_template(ts[0], template[None, None], pad_input=True)
        return out.reshape(*lead, *spatial).cpu().numpy()


def _tile_chunks(shape, d: int, chunks, halo) -> tuple:
    """Chunks: one plane per leading axis, ``chunks`` (or :data:`TILE`) per spatial axis."""
    lead = (1,) * (len(shape) - d)
    if chunks is None:
        return lead + (TILE[d],) * d
    sizes = (chunks,) * d if isinstance(chunks, (int, np.integer)) else tuple(chunks)
    if len(sizes) != d or any(int(n) < 1 for n in sizes):
        raise ValueError(f"chunks must be a positive int or {d} positive ints, got {chunks!r}")
    return lead + tuple(int(c) for c in sizes)


def _no_thin_tiles(chunks, d: int, halo) -> tuple:
    """``chunks`` (dask's sizes per axis) with no spatial tile thinner than the window (a
    thin tile joins its neighbor): every tile's box then holds a whole window, as the
    operators require."""
    out = list(chunks)
    for axis in range(len(chunks) - d, len(chunks)):
        least = 2 * halo[axis - (len(chunks) - d)] + 1
        merged = []
        for n in chunks[axis]:
            if merged and (n < least or merged[-1] < least):
                merged[-1] += n
            else:
                merged.append(n)
        out[axis] = tuple(merged)
    return tuple(out)


def _split_to_fit(chunks, d: int, halo, kind: str, limit: int = TILE_WORK_BYTES) -> tuple:
    """``chunks`` with each spatial tile split evenly (halves, then quarters...) along its
    longest side until one tile's working set fits ``limit`` bytes, sides staying a window
    wide: a store's chunks (often 64 × 512² or whole planes) would otherwise make tasks of
    a GiB each, two of them at once on two threads."""
    lead = len(chunks) - d
    parts = [1] * d

    def side(a):
        return -(-max(chunks[lead + a]) // parts[a])

    def work():
        return math.prod(side(a) + 2 * h for a, h in enumerate(halo)) * 4 * MAPS_PER_PIXEL[kind]

    while work() > limit:
        longest = max(range(d), key=side)
        if side(longest) // 2 < 2 * halo[longest] + 1:
            break
        parts[longest] *= 2
    out = list(chunks)
    for a, p in enumerate(parts):
        out[lead + a] = tuple(
            n // p + (i < n % p) for n in chunks[lead + a] for i in range(p) if n // p + (i < n % p)
        )
    return tuple(out)


def _output_chunks(arrays, shape, d: int, chunks, halo, kind: str, limit: int) -> tuple:
    """The map's chunks: one plane per leading axis; spatially, the lazy input's own
    chunks (split until a tile's work fits ``limit``) unless ``chunks`` is given (NumPy
    input: ``chunks``, or :data:`TILE` split to fit)."""
    import dask.array as da

    first = next((a for a in arrays if lazy.is_lazy(a)), None)
    if first is None or chunks is not None:
        sizes = _tile_chunks(shape, d, chunks, halo)
    else:
        own = lazy.as_dask(first).chunks
        sizes = (1,) * (len(shape) - d) + tuple(own[len(shape) - d :])
    sizes = da.core.normalize_chunks(sizes, shape)
    if chunks is None:
        sizes = _split_to_fit(sizes, d, halo, kind, limit)
    return _no_thin_tiles(sizes, d, halo)


def _tile(kind, boxes, crop, d, device, options) -> np.ndarray:
    """One tile of the map (a task): the map of its ``boxes`` (the tile and its halo,
    clipped to the image), cropped back to the tile: a copy, so that the box-sized map is
    freed (a view would keep it alive while dask holds the tile), and the memory freed in
    this dask thread handed back to the system (:mod:`napari_simwarp.io.trim`)."""
    out = np.array(_compute(kind, boxes, d, device, options)[crop])
    trim.release()
    return out


def tiled(kind, *arrays, window, axes, device="cpu", options, chunks=None, memory_budget=None):
    """The ``kind`` map of ``arrays`` computed tile by tile with a halo of half the window.

    ``chunks``: the spatial tile shape (NumPy input; default :data:`TILE`) or, for dask and
    zarr input, a new spatial chunking (default: the input's own). ``memory_budget``: one
    tile must fit (checked before anything is read); the default tiles are split until
    the tiles dask runs at once (its threads) fit it together.

    Each tile is one task that reads only its box (the tile widened by the halo, clipped
    to the image, where the operator's own padding applies as on the whole array) and
    keeps the tile's part of the map: the input is never rechunked or overlapped as a
    whole, so computing the map holds a few boxes at a time, whatever its chunking (dask's
    ``map_overlap`` held the whole overlapped volume: 2.5 GiB for a 0.5 GiB uint16 one).

    Needs dask (the ``large`` extra), for NumPy input too; :func:`plane` and the operators
    of :mod:`napari_simwarp.ops` need none.
    """
    from ._extras import require

    # the extra's install line, not a raw ModuleNotFoundError, in a base install
    require({f"maps.{kind} (tiles computed as dask tasks)": ["dask.array"]})
    import dask
    import dask.array as da

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    for name, a in zip(("a", "b"), arrays):
        lazy.check_array(a, name if len(arrays) > 1 else "x")
    shape = lazy.shape_of(arrays[0])
    for a in arrays[1:]:
        if lazy.shape_of(a) != shape:
            raise ValueError(f"a and b must have the same shape, got {shape} and {a.shape}")
    d = parse_axes(axes, len(shape))
    halo = (0,) * (len(shape) - d) + _halo(window, d)
    is_lazy = any(lazy.is_lazy(a) for a in arrays)
    budget = _budget.memory_budget(memory_budget)
    # the default tiles are split until the tiles dask runs at once fit the budget together
    limit = min(TILE_WORK_BYTES, budget.bytes // local_tasks())
    out_chunks = _output_chunks(arrays, shape, d, chunks, halo[len(shape) - d :], kind, limit)
    biggest = math.prod(max(c) + 2 * h for c, h in zip(out_chunks, halo))
    _budget.refuse(
        biggest * 4 * MAPS_PER_PIXEL[kind],
        budget,
        what=f"one tile of the {kind} map (with its halo)",
        advice="choose smaller chunks",
    )
    dtype = np.float64 if np.dtype(arrays[0].dtype) == np.float64 else np.float32
    sources = [lazy.as_dask(a) if lazy.is_lazy(a) else a for a in arrays]
    blocks = {}
    for index, region in lazy.block_regions(out_chunks).items():
        box = tuple(
            slice(max(0, s.start - h), min(n, s.stop + h)) for s, h, n in zip(region, halo, shape)
        )
        crop = tuple(slice(s.start - b.start, s.stop - b.start) for s, b in zip(region, box))
        # NumPy input: the box is cut here (a view), so each task carries its own pixels
        boxes = [src[box] for src in sources]
        task = dask.delayed(_tile, pure=True)(kind, boxes, crop, d, device, options)
        size = tuple(s.stop - s.start for s in region)
        blocks[index] = da.from_delayed(task, shape=size, dtype=dtype)
    out = lazy.from_blocks(blocks, tuple(len(c) for c in out_chunks))
    return out if is_lazy else out.compute()


def plane(kind, *arrays, index, axes, device="cpu", **options) -> np.ndarray:
    """The ``kind`` map of one plane only: the plane at ``index`` of the leading axes (the
    axes a viewer slices), reading only the part of the input it needs.

    Parameters
    ----------
    kind : "local_std", "local_ncc", "ssim" or "zncc"
    arrays : the map's inputs (one, or two of the same shape), NumPy, dask or zarr, or
        the template (NumPy) second for "zncc"
    index : tuple of ints, one per axis before the last two (e.g. ``(t,)`` for ``"tyx"``,
        ``(z,)`` for ``"zyx"``, ``(t, z)`` for ``"tzyx"``)
    axes : as in :func:`local_std`
    options : the map's options (``window``...)

    Returns
    -------
    NumPy ``(H, W)``: the map of the whole array at that plane (a volume's plane is
    computed from the slab of planes its windows reach, so it equals the volume's map).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    inputs = arrays[:1] if kind == "zncc" else arrays
    for a in inputs:
        lazy.check_array(a, "arrays")
    shape = lazy.shape_of(inputs[0])
    d = parse_axes(axes, len(shape))
    index = tuple(int(i) for i in index)
    if len(index) != len(shape) - 2:
        raise ValueError(
            f"index must hold {len(shape) - 2} ints (one per axis before the last two), got "
            f"{index!r}"
        )
    for i, n in zip(index, shape):
        if not 0 <= i < n:
            raise IndexError(f"index {index} is out of range for shape {shape}")
    if kind == "zncc":
        window = np.asarray(arrays[1]).shape
        options = {**options, "template": np.asarray(arrays[1])}
    else:
        window = options.get("window", {"local_ncc": 9, "ssim": 11}.get(kind))
    halo = _halo(window, d)
    region, pick = [], []
    for axis, i in enumerate(index):
        spatial_axis = axis - (len(shape) - d)
        if spatial_axis < 0:  # a plane of its own: read just it
            region.append(slice(i, i + 1))
            pick.append(0)
        else:  # a spatial axis: the slab the windows of plane i reach, a window at least
            h, n = halo[spatial_axis], shape[axis]
            lo = max(0, min(i - h, n - (2 * h + 1)))
            region.append(slice(lo, min(n, max(i + h + 1, lo + 2 * h + 1))))
            pick.append(i - lo)
    blocks = [lazy.read(a, tuple(region)) for a in inputs]
    out = _compute(kind, blocks, d, device, options)
    return out[tuple(pick)]
