"""The aligned stack and its quality: each frame warped by its transform (in memory, or a
lazy dask array warped when computed), and per frame the similarity with the aligned
reference, before and after, and the overlap."""

from __future__ import annotations

import numpy as np
import torch

from ..io.tasks import device_slot
from ..ops import warp, warp_affine
from . import _inputs
from ._batches import batches
from .pyramid import gaussian_blur
from .quality import emit, masked_zncc, problems
from .transforms import AffineTransform


def _warp(images: torch.Tensor, transforms) -> torch.Tensor:
    """``images`` ``(n, C, *S)`` resampled by one transform each (zeros outside)."""
    if isinstance(transforms[0], AffineTransform):
        mats = torch.as_tensor(np.stack([t.matrix for t in transforms])).to(images)
        return warp_affine(images, mats, padding="grid-constant")
    shape = tuple(images.shape[2:])
    disp = torch.as_tensor(np.stack([t.to_displacement(shape) for t in transforms]))
    return warp(images, disp.to(images), padding="grid-constant")


#: a sample this far (pixels) beyond the frame's edge still counts as covering: where the
#: bilinear weight of the pixels inside exceeds 0.999
COVER_MARGIN = 1e-3


def warp_frames(raw: torch.Tensor, transforms) -> tuple[torch.Tensor, torch.Tensor]:
    """Frames ``raw`` ``(n, *S)`` resampled by their transforms (zeros outside), and each
    one's coverage ``(n, *S)`` (True where its pixels landed, to within
    :data:`COVER_MARGIN`). Translations: the coverage follows from the shifts (a box per
    frame); other transforms warp the frame and a plane of ones together, so coverage
    costs no extra pass."""
    shifts = _pixel_shifts(transforms, raw.dim() - 1)
    if shifts is not None:
        cover = _shifted_cover(raw.shape[1:], shifts).to(raw.device)
        return _warp(raw[:, None], transforms)[:, 0], cover
    moved = _warp(torch.stack([raw, torch.ones_like(raw)], dim=1), transforms)
    return moved[:, 0], moved[:, 1] > 1.0 - COVER_MARGIN


def _pixel_shifts(transforms, ndim: int) -> np.ndarray | None:
    """``(n, D)`` pixel shifts when every transform is a pure translation, else None."""
    eye = np.eye(ndim)
    if not all(
        isinstance(t, AffineTransform) and np.array_equal(t.matrix[:ndim, :ndim], eye)
        for t in transforms
    ):
        return None
    return np.stack([t.matrix[:ndim, ndim] for t in transforms])


def _shifted_cover(shape, shifts: np.ndarray) -> torch.Tensor:
    """``(n, *S)``: where output pixel ``x`` samples ``x + s`` inside the frame (within
    :data:`COVER_MARGIN` of its edge), for each frame's shift ``s``; one box per frame."""
    cover = None
    for axis, size in enumerate(shape):
        x = np.arange(size)[None] + shifts[:, axis, None]  # (n, size), float64 on the host
        inside = (x > -COVER_MARGIN) & (x < size - 1 + COVER_MARGIN)
        view = inside.reshape(len(shifts), *[size if a == axis else 1 for a in range(len(shape))])
        cover = view if cover is None else cover & view
    return torch.from_numpy(cover).expand(len(shifts), *shape)


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
    x = x.float().clamp(lo, hi)  # scores in float32 (float64 frames too: no float64 maps)
    return gaussian_blur(x.reshape(-1, 1, *x.shape[-ndim:]), 1.0).reshape(x.shape)


def _target_part(src, sl, transforms, value_range):
    """Batch ``sl``'s share of the "mean" target (a job): the sums over its frames of the
    aligned and of the raw frames ``(*S)``, and where all of them landed ``(*S)``."""
    raw = src.raw(sl).float()  # (a float64 stack too: the mean target is float32)
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
    raw = src.raw(slice(index, index + 1)).float()  # scores are float32
    moved, cover = warp_frames(raw, [transform])
    return _score_view(moved, value_range)[None], cover[None], _score_view(raw, value_range)[None]


def _score_batch(src, sl, transforms, value_range, target, keep):
    """Batch ``sl``'s scores (a job): final ZNCC with the aligned reference over the pixels
    both cover, initial ZNCC of the raw frames, overlap (each ``(n,)``); and its aligned
    frames as NumPy when ``keep`` (else None)."""
    target, target_cover, start = target
    raw = src.raw(sl)
    if not keep:  # only scored: float32 (a float64 stack's returned frames stay float64)
        raw = raw.float()
    moved, cover = warp_frames(raw, transforms)
    shared = (cover[:, None] & target_cover).float()
    final = masked_zncc(target, _score_view(moved, value_range)[:, None], shared)
    initial = masked_zncc(start, _score_view(raw, value_range)[:, None], torch.ones_like(shared))
    overlap = cover.flatten(1).float().mean(1).double()  # float32 on the device
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
