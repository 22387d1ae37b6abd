"""Separable window passes in pure torch: the ``box_sum`` and ``correlate`` primitives.

"Valid" passes (output ``k - 1`` shorter per axis) over an input padded beforehand, and
their adjoints ("full", ``k - 1`` longer): docs/maths.md §1.2. Why shifted in-place adds
rather than ``conv2d``: on CPU, PyTorch's single-channel and depthwise convolutions run
6-8x slower than ``k`` fused multiply-adds over views of the same tensor (measured at
2048², 11 taps, 2 cores: 64 ms per axis for five maps against 430-540 ms for
``conv1d``/``conv2d``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .._padding import pad_spatial


def correlate1d_valid(x: torch.Tensor, weights: Sequence[float], dim: int) -> torch.Tensor:
    """Valid cross-correlation of ``x`` along ``dim`` with 1-D taps ``weights``.

    ``out[i] = Σ_j weights[j] · x[i + j]``; output length ``x.shape[dim] - len(weights) + 1``.
    Differentiable through autograd (the taps are constants).
    """
    k = len(weights)
    n = x.shape[dim] - k + 1
    if n <= 0:
        raise ValueError(f"axis {dim} of length {x.shape[dim]} is shorter than {k} taps")
    out = x.narrow(dim, 0, n) * weights[0]
    for j in range(1, k):
        out.add_(x.narrow(dim, j, n), alpha=weights[j])
    return out


def correlate_separable_valid(
    x: torch.Tensor, kernels: Sequence[Sequence[float] | None]
) -> torch.Tensor:
    """Valid correlation over the trailing ``len(kernels)`` axes, one 1-D kernel per axis.

    Parameters
    ----------
    x : Tensor, shape ``(..., *S)``
    kernels : one sequence of taps per trailing axis (array-axis order), or ``None`` to
        leave an axis alone.

    Returns
    -------
    Tensor, shape ``(..., *[S_i - k_i + 1])``
    """
    d = len(kernels)
    out = x
    for axis, taps in enumerate(kernels):
        if taps is not None and len(taps) > 1:
            out = correlate1d_valid(out, taps, x.dim() - d + axis)
        elif taps is not None:
            out = out * taps[0]
    return out


def _finish(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``result`` written into ``out`` when one is given (one copy), else ``result``."""
    if out is None:
        return result
    return out.copy_(result)


def _box_sum1d_direct(
    x: torch.Tensor, k: int, dim: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Window sum along ``dim`` by ``k - 1`` in-place adds of shifted views."""
    n = x.shape[dim] - k + 1
    if k == 1:
        return _finish(x, out) if out is not None else x.clone()
    if out is None:
        out = torch.add(x.narrow(dim, 0, n), x.narrow(dim, 1, n))
    else:
        torch.add(x.narrow(dim, 0, n), x.narrow(dim, 1, n), out=out)
    for j in range(2, k):
        out.add_(x.narrow(dim, j, n))
    return out


def _box_sum1d_tree(
    x: torch.Tensor, k: int, dim: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Window sum along ``dim`` from power-of-two partial sums: O(log k) passes.

    ``p_w[i] = x[i] + ... + x[i + w - 1]`` for ``w = 1, 2, 4, ...`` costs one add per
    doubling; a window of ``k = Σ 2^b`` is the sum of the ``p_{2^b}`` at consecutive
    offsets. For ``k = 15`` that is 3 doublings + 3 adds instead of the 14 adds of the
    direct route, and every partial sum is a pairwise sum (more accurate, too).
    """
    n = x.shape[dim] - k + 1
    parts = []  # views of length n whose sum is the window sum
    offset = 0
    power, width = x, 1
    while True:
        if k & width:
            parts.append(power.narrow(dim, offset, n))
            offset += width
        if 2 * width > k:
            break
        m = power.shape[dim] - width
        power = torch.add(power.narrow(dim, 0, m), power.narrow(dim, width, m))
        width *= 2
    if len(parts) == 1:
        return _finish(parts[0], out) if out is not None else parts[0].contiguous()
    if out is None:
        out = torch.add(parts[-1], parts[-2])
    else:
        torch.add(parts[-1], parts[-2], out=out)
    for part in parts[-3::-1]:
        out.add_(part)
    return out


def _box_sum1d_prefix(
    x: torch.Tensor, k: int, dim: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """O(1)-per-element window sum from prefix sums restarted every ``k`` elements.

    A plain prefix sum subtracts two ever-growing partial sums and loses float32 accuracy
    on long axes; restarting at block boundaries keeps every partial sum to at most ``k``
    terms, so the error is that of summing the window directly. With ``P`` the inclusive
    prefix within each block and ``Pex = P - x`` the exclusive one, the window starting at
    ``i`` is ``(blocksum(i) - Pex[i]) + Pex[i + k]``.
    """
    length = x.shape[dim]
    n = length - k + 1
    nblocks = -(-(length + 1) // k) + 1  # room for index i + k of the last window
    extra = nblocks * k - length
    zeros = x.new_zeros(*x.shape[:dim], extra, *x.shape[dim + 1 :])
    xp = torch.cat([x, zeros], dim)
    blocked_shape = list(xp.shape)
    blocked_shape[dim : dim + 1] = [nblocks, k]
    xb = xp.view(blocked_shape)
    prefix = xb.cumsum(dim + 1)
    # A copy: ``prefix`` becomes the exclusive prefix in place just below (1/k of the size).
    block_sum = prefix.narrow(dim + 1, k - 1, 1).clone()
    exclusive = prefix.sub_(xb)
    suffix = exclusive.neg().add_(block_sum).reshape(xp.shape)
    exclusive = exclusive.reshape(xp.shape)
    if out is None:
        return suffix.narrow(dim, 0, n).add_(exclusive.narrow(dim, k, n))
    return torch.add(suffix.narrow(dim, 0, n), exclusive.narrow(dim, k, n), out=out)


#: box-sum routes: "direct" is k - 1 adds per element and axis, "tree" about 2 log2(k),
#: "prefix" a constant ~6 passes (a cumulative sum among them).
BOX_SUM_METHODS = ("direct", "tree", "prefix")


#: largest window for which "auto" sums by shifted adds (the "tree" route) rather than
#: by prefix sums (measured crossover on a 2-core CPU).
DIRECT_MAX_WINDOW = 31


#: bytes of input per chunk when ``box_sum_valid`` works through a large tensor in pieces
#: (a few MiB: the temporaries of one chunk stay in cache and are recycled by the heap).
CHUNK_BYTES = 2 << 20


_BOX_SUM_1D = {"direct": _box_sum1d_direct, "tree": _box_sum1d_tree, "prefix": _box_sum1d_prefix}


def _pick_route(k: int, method: str) -> str:
    if method == "auto":
        return "tree" if k <= DIRECT_MAX_WINDOW else "prefix"
    if method not in _BOX_SUM_METHODS_SET:
        raise ValueError(f"method must be one of {BOX_SUM_METHODS} or 'auto', got {method!r}")
    return method


_BOX_SUM_METHODS_SET = frozenset(BOX_SUM_METHODS)


def _box_sum_separable(
    x: torch.Tensor, window: Sequence[int], routes: Sequence[str], out: torch.Tensor | None
) -> torch.Tensor:
    """One 1-D pass per trailing axis, the last one written into ``out`` if given."""
    d = len(window)
    axes = [axis for axis, k in enumerate(window) if k > 1]
    if not axes:
        return _finish(x, out) if out is not None else x.clone()
    result = x
    for axis in axes:
        dim = x.dim() - d + axis
        target = out if axis == axes[-1] else None
        result = _BOX_SUM_1D[routes[axis]](result, window[axis], dim, out=target)
    return result


def box_sum_valid(x: torch.Tensor, window: Sequence[int], method: str = "auto") -> torch.Tensor:
    """Sum over a box window on the trailing ``len(window)`` axes, valid mode.

    Parameters
    ----------
    x : Tensor, shape ``(..., *S)``
    window : sizes per trailing axis (any positive size; odd is not required here).
    method : {"auto", "direct", "tree", "prefix"}
        "prefix" is O(1) per element whatever the window; "direct" is ``k - 1`` adds per
        element and axis; "tree" ``~2 log2(k)`` adds; "auto" picks "tree" or "prefix" per
        axis.

    Returns
    -------
    Tensor, shape ``(..., *[S_i - k_i + 1])``, a new tensor (never a view of ``x``).

    Notes
    -----
    Without autograd, a large input on the CPU is processed in chunks of about
    :data:`CHUNK_BYTES` (several small images at once; or one image at a time, in slabs of
    the first spatial axis with a ``k - 1`` halo), each written into its slice of one
    output. Why: the route's temporaries are
    then small enough to stay in cache and to be recycled by the allocator; whole-image
    temporaries of more than 32 MiB are fresh ``mmap`` pages on glibc and cost a page
    fault per 4 KiB each time (measured 2-3x slower at 2 x 2048²).
    """
    d = len(window)
    if x.dim() < d:
        raise ValueError(f"x has {x.dim()} dimensions, fewer than the window's {d}")
    routes = [_pick_route(k, method) for k in window]
    spatial = x.shape[x.dim() - d :]
    out_spatial = [n - k + 1 for n, k in zip(spatial, window)]
    if any(n <= 0 for n in out_spatial):
        raise ValueError(
            f"window {tuple(window)} is larger than the spatial shape {tuple(spatial)}"
        )
    if (torch.is_grad_enabled() and x.requires_grad) or x.device.type != "cpu":
        # Autograd cannot follow out=; other devices take it all at once (fewer launches).
        return _box_sum_separable(x, window, routes, None)
    lead = x.shape[: x.dim() - d]
    out = x.new_empty((*lead, *out_spatial))
    x_flat = x.reshape(-1, *spatial)
    out_flat = out.view(-1, *out_spatial)
    slab_bytes = x.element_size() * math.prod(spatial[1:])
    images = CHUNK_BYTES // max(slab_bytes * spatial[0], 1)
    if images > 1:  # small images (the moment engine's tiles): several per chunk
        for b in range(0, x_flat.shape[0], images):
            _box_sum_separable(x_flat[b : b + images], window, routes, out_flat[b : b + images])
        return out
    rows = max(CHUNK_BYTES // max(slab_bytes, 1), 4 * (window[0] - 1), 1)
    for b in range(x_flat.shape[0]):
        for r0 in range(0, out_spatial[0], rows):
            r = min(rows, out_spatial[0] - r0)
            piece = x_flat[b].narrow(0, r0, r + window[0] - 1)
            _box_sum_separable(piece, window, routes, out_flat[b].narrow(0, r0, r))
    return out


#: longest box whose adjoint scatters directly (``k`` adds per element); longer boxes take
#: the prefix route on the zero-padded map. Lower than :data:`DIRECT_MAX_WINDOW` because
#: the scatter writes a longer output than the forward's tree reads (measured crossover of
#: the adjoint alone on a 2-core CPU).
DIRECT_TRANSPOSE_MAX_WINDOW = 17


def _transpose1d_valid(y: torch.Tensor, taps: Sequence[float], dim: int) -> torch.Tensor:
    """Adjoint of ``correlate1d_valid(·, taps, dim)``: ``x[i + j] += taps[j] · y[i]``.

    Scatters with ``k`` in-place adds over views (no padded copy, no kernel flip to get
    wrong); the output is ``k - 1`` longer than ``y`` along ``dim``. The first tap writes
    instead of adding, so only the ``k - 1`` uncovered entries need zeroing.
    """
    k = len(taps)
    n = y.shape[dim]
    shape = list(y.shape)
    shape[dim] = n + k - 1
    out = y.new_empty(shape)
    torch.mul(y, taps[0], out=out.narrow(dim, 0, n))
    out.narrow(dim, n, k - 1).zero_()
    for j in range(1, k):
        out.narrow(dim, j, n).add_(y, alpha=taps[j])
    return out


def _box_transpose_prefix(y: torch.Tensor, k: int, dim: int, weight: float) -> torch.Tensor:
    """Adjoint of a length-``k`` box sum (taps all ``weight``) by prefix sums.

    The full correlation with a constant kernel is a valid box sum of the input padded by
    ``k - 1`` zeros on both sides; ``box_sum_valid`` picks its O(1)-per-element route.
    """
    pads = [(0, 0)] * y.dim()
    pads[dim] = (k - 1, k - 1)
    padded = pad_spatial(y, pads, mode="constant")
    window = [1] * y.dim()
    window[dim] = k
    out = box_sum_valid(padded, window)
    return out.mul_(weight) if weight != 1.0 else out


def box_sum(x: torch.Tensor, window: Sequence[int], full: bool = False) -> torch.Tensor:
    """Window sums of ``x (..., *S)`` over the trailing ``len(window)`` axes.

    Valid mode gives ``(..., *(S - k + 1))``; ``full=True`` gives ``(..., *(S + k - 1))``
    with zeros outside ``x``, the adjoint of the valid sum (a box is its own flip).
    Differentiable. The pure torch twin of ``simwarp::box_sum``.
    """
    if not full:
        return box_sum_valid(x, window)
    out = x
    d = len(window)
    for axis, k in enumerate(window):
        if k == 1:
            continue
        dim = x.dim() - d + axis
        if k > DIRECT_TRANSPOSE_MAX_WINDOW:
            out = _box_transpose_prefix(out, k, dim, 1.0)
        else:
            out = _transpose1d_valid(out, (1.0,) * k, dim)
    return out if out is not x else x.clone()


def correlate(
    x: torch.Tensor, taps: Sequence[Sequence[float]], transpose: bool = False
) -> torch.Tensor:
    """Separable correlation of ``x (..., *S)`` over the trailing ``len(taps)`` axes.

    ``taps[i]`` are the 1-D weights of axis ``i``. Valid mode gives ``(..., *(S - k + 1))``;
    ``transpose=True`` is its adjoint ``(..., *(S + k - 1))``. Differentiable. The pure
    torch twin of ``simwarp::correlate``.
    """
    if not transpose:
        out = correlate_separable_valid(x, taps)
        return out if out is not x else x.clone()
    d = len(taps)
    out = x
    for axis, weights in enumerate(taps):
        out = _transpose1d_valid(out, tuple(weights), x.dim() - d + axis)
    return out
