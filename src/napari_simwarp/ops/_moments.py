"""One engine for every metric built on five windowed moments of two images.

SSIM and local NCC share one structure (docs/maths.md §5.2): the windowed moments

    M = (W⋆a, W⋆b, W⋆a², W⋆b², W⋆ab)          (five maps, one batched separable pass)

then a per-pixel function ``F(M)`` (the metric map), and a backward that needs only the
per-pixel partials ``p_m = ∂L/∂M_m`` and ONE more window pass, the adjoint of the first:

    ∂L/∂a = Wᵀ⋆p_a + 2a · (Wᵀ⋆p_aa) + b · (Wᵀ⋆p_ab)
    ∂L/∂b = Wᵀ⋆p_b + 2b · (Wᵀ⋆p_bb) + a · (Wᵀ⋆p_ab)

(the products are correlated, never multiplied by ``W⋆1``). ``Wᵀ`` is the transpose of a
"valid" pass: it scatters each output back over its window, so it maps the valid domain
``S`` onto the padded domain ``S + k - 1``. The padding (SciPy "reflect") is fused into the
engine: the centered images are written once into the interior of the padded buffer and
the strips mirrored from it, and the backward folds the strips of its own gradient buffer
back in place. That saves two gathers and their ``index_add`` adjoints (about a fifth of
the forward+backward time at 2048²). The passes themselves are the ``moments5``,
``box_sum`` and ``correlate`` primitives of the kernels or of their pure torch twins.

A metric is a :class:`MomentMetric`: its ``pointwise`` computes the map and, when a
gradient will be needed, the partial maps, in as few element-wise passes as it can
(every pass over a 2048² float32 map costs ~4.5 ms on a 2-core CPU, about as much as two
window taps). Several moments may share one partial map (SSIM: ``p_aa == p_bb``), which
saves a whole adjoint pass; :attr:`MomentMetric.slots` says which map serves which moment.

Both images are centered on their own per-(N, C) mean ``m`` (detached) before the moments:
without the shift ``W⋆a² - (W⋆a)²`` cancels catastrophically in float32 on data with a
large offset (docs/maths.md §1.3). Variances and covariances are invariant to the shift,
the local means are not (SSIM's luminance term needs them), so metrics get the shifts too
and give their partials with respect to the centered moments; the engine then combines
with the centered ``a`` and ``b``. With ``M`` the centered moments and ``U`` the plain ones
(``U_a = M_a + m_a``, ``U_aa = M_aa + 2 m_a M_a + m_a²``,
``U_ab = M_ab + m_b M_a + m_a M_b + m_a m_b``), the chain rule gives

    ∂F/∂M_a = ∂F/∂U_a + 2 m_a ∂F/∂U_aa + m_b ∂F/∂U_ab

which a metric that works with plain moments uses to convert (a shift-invariant one,
like local NCC, needs nothing).

Precision. On the CPU float32 data is summed in float64. On GPUs (float64 at 1/64 of the
float32 rate on most) and MPS it stays float32 and the shift moves closer to each window:
the output is cut into tiles (:class:`~._tiles.TileGrid`), each tile's input (with its
halo) is centered on its own mean (not on the image's first, which would round dim
regions beside bright ones coarser than the data), and ``m`` becomes a per-tile map
``(N, C, *n, 1, ...)``;
the work runs in the tiled layout and only the final map is untiled. Tiles where float32
could still cancel (:func:`_risky_windows`) are redone two-pass in float32, about their own
means, as the fused CUDA kernels do (docs/maths.md §1.3): no float64 on the device.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from types import ModuleType

import torch

from . import _kernels
from ._autograd import first_order_backward
from ._nonfinite import fill_nonfinite, nonfinite_mask, windows_seeing
from ._numerics import compute_dtype, moment_dtype
from ._padding import centered_pads
from ._tiles import TileGrid
from ._validation import check_choice, check_pair, check_window
from ._windows import Window

#: reductions every moment metric accepts.
REDUCTIONS = ("none", "mean")


class MomentMetric:
    """Per-pixel function of the five moments, with its partials.

    Subclasses set :attr:`slots` and :attr:`coefficients` and implement :meth:`pointwise`.

    ``slots = (i_a, i_b, i_aa, i_bb, i_ab)``: index in the partials stack of the map that
    holds ``∂F/∂M`` for each moment, up to the constant factors in ``coefficients =
    (c_aa, c_ab)``; the engine combines

        ∂L/∂a = Q[i_a] + c_aa · a · Q[i_aa] + c_ab · b · Q[i_ab],   Q = Wᵀ⋆(g · partials)

    so a metric may store ``-p_aa/2`` (say) and fold the constant into ``c_aa``. The
    exact coefficients are ``(2, 1)``.
    """

    #: the public op's name, for the backend choice (``_kernels.implementation``).
    name: str = ""
    slots: tuple[int, int, int, int, int] = (0, 1, 2, 3, 4)
    coefficients: tuple[float, float] = (2.0, 1.0)
    #: a constant the metric adds to the window variances (per unit of window weight)
    #: before dividing by them; rounding well below it does not show (SSIM: C2 / 2).
    variance_floor: float = 0.0

    def pointwise(
        self,
        moments: Sequence[torch.Tensor],
        shifts: tuple[torch.Tensor, torch.Tensor],
        total: float,
        need_partials: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Metric map and partials from the moments.

        Parameters
        ----------
        moments : five Tensors, shape ``(N, C, *S)`` each: ``(W⋆a, W⋆b, W⋆a², W⋆b², W⋆ab)``
            of the centered images. They are scratch buffers the metric may overwrite.
        shifts : two Tensors, shape ``(N, C, 1, ...)``: the means ``(m_a, m_b)`` that were
            subtracted (the plain local mean is ``W⋆a + m_a`` for a normalized window).
        total : float
            Sum of the window weights (the box's element count, 1 for a Gaussian).
        need_partials : bool
            Whether to return the partial maps (a backward will follow).

        Returns
        -------
        map : Tensor, shape ``(N, C, *S)``
        partials : Tensor, shape ``(P, N, C, *S)``, or None when not needed; partials with
            respect to the centered moments, laid out as :attr:`slots` says.
        """
        raise NotImplementedError


def _strip_regions(spatial: Sequence[int], pads: Sequence[tuple[int, int]], axis: int):
    """Index tuples (over the trailing axes) of the two pad strips of ``axis`` and their
    mirror sources, in the padded domain.

    Axes before ``axis`` span their whole padded length (already filled when ``axis`` is
    filled, so corners come out right), axes after it only their interior.
    """

    def region(along: slice):
        idx = []
        for j, (n, (before, _)) in enumerate(zip(spatial, pads)):
            if j < axis:
                idx.append(slice(None))
            elif j > axis:
                idx.append(slice(before, before + n))
            else:
                idx.append(along)
        return (Ellipsis, *idx)

    n, (before, after) = spatial[axis], pads[axis]
    return (
        (region(slice(0, before)), region(slice(before, 2 * before))),
        (
            region(slice(before + n, before + n + after)),
            region(slice(before + n - after, before + n)),
        ),
    )


def _reflect_fill_(buf: torch.Tensor, spatial: Sequence[int], pads) -> None:
    """Fill the pad strips of ``buf`` (interior already written) by SciPy "reflect".

    Half-sample symmetric: the strip before the data is the first ``before`` samples
    reversed. Needs ``before, after <= n`` (an odd window no larger than the image).
    """
    d = len(spatial)
    for axis in range(d):
        dim = buf.dim() - d + axis
        for strip, source in _strip_regions(spatial, pads, axis):
            if buf[strip].numel():
                buf[strip].copy_(buf[source].flip(dim))


def _reflect_fold_(grad: torch.Tensor, spatial: Sequence[int], pads) -> torch.Tensor:
    """Adjoint of :func:`_reflect_fill_` plus the interior embedding, in place on ``grad``.

    Adds each strip's gradient back onto its mirror source, axes in reverse order, and
    returns the interior view, shape ``(..., *spatial)``.
    """
    d = len(spatial)
    for axis in reversed(range(d)):
        dim = grad.dim() - d + axis
        for strip, source in _strip_regions(spatial, pads, axis):
            if grad[strip].numel():
                grad[source].add_(grad[strip].flip(dim))
    return grad[(Ellipsis, *[slice(b, b + n) for n, (b, _) in zip(spatial, pads)])]


def _centered_padded(
    a: torch.Tensor, b: torch.Tensor, pads, shape: Sequence[int], center: bool = True
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``[a, b]`` minus their per-(N, C) means, reflect-padded, in a ``(2, N, C, *shape)``
    buffer: the padded image ``P = S + k - 1`` at its start, zeros past it (a tiled
    layout's extension, :class:`~._tiles.TileGrid`). Returns the buffer and the means
    (with ``center=False`` the images as they are, and shifts of 0).
    """
    spatial = tuple(a.shape[2:])
    dims = tuple(range(2, a.dim()))
    buf = a.new_empty((2, *a.shape[:2], *shape))
    padded_size = [n + lo + hi for n, (lo, hi) in zip(spatial, pads)]
    padded = buf[(Ellipsis, *[slice(0, p) for p in padded_size])]
    interior = (Ellipsis, *[slice(lo, lo + n) for n, (lo, _) in zip(spatial, pads)])
    shifts = []
    for image, x in zip(padded, (a, b)):
        if center:
            shifts.append(x.mean(dims, keepdim=True))
            torch.sub(x, shifts[-1], out=image[interior])
        else:  # the tiles' own shifts follow (no layout-dependent float32 mean here)
            image[interior].copy_(x)
            shifts.append(x.new_zeros((*x.shape[:2], *(1,) * len(dims))))
    shifts = tuple(shifts)
    _reflect_fill_(padded, spatial, pads)
    for axis, (p, e) in enumerate(zip(padded_size, shape)):
        if e > p:  # the extension: only outputs past S read it
            buf.narrow(buf.dim() - len(spatial) + axis, p, e - p).zero_()
    return buf, shifts


def _centered_moments(
    a: torch.Tensor, b: torch.Tensor, window: Window, impl: ModuleType
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], list[torch.Tensor]]:
    """Centered, reflect-padded images and their five windowed moments.

    Centering and padding are fused: the centered images are written once into the
    interior of the padded buffer and the strips are mirrored from there.

    Parameters
    ----------
    a, b : Tensor, shape ``(N, C, *S)``.
    impl : the module of primitives (:mod:`._kernels.calls` or :mod:`._reference`).

    Returns
    -------
    centered : Tensor, shape ``(2, N, C, *P)``, ``P = S + k - 1``: ``a`` and ``b`` minus
        their per-(N, C) means, padded with SciPy "reflect".
    shifts : two Tensors, shape ``(N, C, 1, ...)``: those means.
    moments : five Tensors, shape ``(N, C, *S)``: ``W⋆a, W⋆b, W⋆a², W⋆b², W⋆ab`` of the
        centered images (buffers the caller owns).
    """
    pads = centered_pads(window.sizes)
    padded = [n + k - 1 for n, k in zip(a.shape[2:], window.sizes)]
    centered, shifts = _centered_padded(a, b, pads, padded)
    return centered, shifts, impl.moments5(centered, window.taps)


def _tile_inputs(
    a: torch.Tensor, b: torch.Tensor, window: Window, grid: TileGrid
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The images reflect-padded as they are, and each tile's input centered on its mean.

    No shift on the whole image first: ``a - m`` rounds to the spacing of ``|a - m|``,
    coarser than ``a``'s own wherever the image mean is over twice the local values (a
    bright region beside a dim one), and the tile's shift would keep that loss.

    Returns
    -------
    padded : Tensor, shape ``(2, N, C, *(n T + k - 1))``: ``a`` and ``b`` reflect-padded,
        zeros past ``P`` (the grid's extension).
    centered : Tensor, shape ``(2, N, C, *n, *(T + k - 1))``: each tile's input minus the
        tile's mean.
    shifts : two Tensors, shape ``(N, C, *n, 1, ...)``: what was subtracted, per tile.
    """
    d = grid.dims
    buf, _ = _centered_padded(a, b, centered_pads(window.sizes), grid.extended, center=False)
    tiles = grid.tiles(buf)
    # The mean of each tile's samples inside P (the extension is 0): near every window's.
    tile_means = tiles.sum(tuple(range(-d, 0)), keepdim=True).div_(grid.valid_counts(buf))
    centered = torch.sub(tiles, tile_means, out=buf.new_empty(tiles.shape))
    return buf, centered, (tile_means[0], tile_means[1])


def _tile_centered_moments(
    a: torch.Tensor, b: torch.Tensor, window: Window, impl: ModuleType, grid: TileGrid
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], list[torch.Tensor]]:
    """:func:`_centered_moments` with each tile centered on its own mean (``_tiles``).

    Returns
    -------
    centered : Tensor, shape ``(2, N, C, *n, *(T + k - 1))``: each tile's input (the
        reflect-padded images) minus the tile's mean.
    shifts : two Tensors, shape ``(N, C, *n, 1, ...)``: what was subtracted, per tile.
    moments : five Tensors, shape ``(N, C, *n, *T)``, the moments of the centered tiles
        (outputs past ``S`` included: :meth:`TileGrid.zero_outside_`, ``untile``).
    """
    _, centered, shifts = _tile_inputs(a, b, window, grid)
    return centered, shifts, impl.moments5(centered, window.taps)


def _window_adjoint(impl: ModuleType, window: Window, y: torch.Tensor, scale: float):
    """``scale · Wᵀ⋆y``, ``(..., *S) -> (..., *(S + k - 1))``, and a factor still owed.

    A weighted window takes ``scale`` in its first axis's taps (free); a box has no taps,
    so its factor is returned for the caller to apply to its (fewer) final maps.
    """
    if window.is_box:
        return impl.box_sum(y, window.sizes, full=True), scale
    taps = [tuple(t * scale for t in window.taps[0]), *window.taps[1:]]
    return impl.correlate(y, taps, transpose=True), 1.0


#: A window whose sum of squares (about its tile's shift) exceeds ``FLOAT32_RISK`` times
#: its variance (plus the metric's floor) loses about ``8 u · ratio`` of the variance to
#: float32 rounding (u = 2^-24; measured, docs/maths.md §1.3): at 128, up to about 6e-5.
#: Such windows (step edges, bright blobs on a flat, nearly noiseless background, very
#: narrow Gaussian windows) are redone two-pass in float32, as the fused kernels do
#: (``csrc/cuda/ssim.cu``): their mean first, then the moments about it.
FLOAT32_RISK = 128.0

#: Window samples gathered at once by the two-pass redo (risky windows x window size):
#: about 16 MB per gathered float32 map.
REDO_CHUNK = 1 << 22


def _risky_windows(moments: Sequence[torch.Tensor], total: float, floor: float) -> torch.Tensor:
    """Windows ``(N, C, *n, *T)`` where float32 moments are too close to cancelling.

    ``moments`` are the float32 moments ``(N, C, *n, *T)`` of the centered tiles.
    """
    risky = None
    for first, second in ((moments[0], moments[2]), (moments[1], moments[3])):
        variance = torch.addcmul(second, first, first, value=-1.0 / total).add_(floor * total)
        window_risky = second > variance.mul_(FLOAT32_RISK)
        risky = window_risky if risky is None else risky.logical_or_(window_risky)
    return risky


def _risky_tiles(moments: Sequence[torch.Tensor], total: float, floor: float) -> torch.Tensor:
    """Tiles ``(N, C, *n)`` holding a window of :func:`_risky_windows`."""
    d = (moments[0].dim() - 2) // 2
    return _risky_windows(moments, total, floor).flatten(-d).any(-1)


def _window_offsets(grid_input: Sequence[int], sizes: Sequence[int], device) -> torch.Tensor:
    """Linear offsets ``(K,)``, ``K = Π k``, of a window's samples in a tile's input of
    shape ``grid_input`` (row-major), from the window's first sample."""
    offsets = torch.zeros((), dtype=torch.int64, device=device)
    stride = 1
    for extent, k in zip(reversed(grid_input), reversed(sizes)):
        along = torch.arange(k, dtype=torch.int64, device=device) * stride
        offsets = (along.reshape(-1, *(1,) * offsets.dim()) + offsets).reshape(-1)
        stride *= extent
    return offsets


def _window_weights(window: Window, dtype, device) -> torch.Tensor:
    """The window's weights ``(K,)`` in the order of :func:`_window_offsets`."""
    weights = [math.prod(w) for w in itertools.product(*window.taps)]  # Python floats
    return torch.tensor(weights, dtype=dtype, device=device)


def _two_pass_moments(padded, grid, shifts, moments, redo, window):
    """Moments of the windows ``redo`` about their own means, two-pass, in float32.

    Parameters
    ----------
    padded : Tensor ``(2, N, C, *(n T + k - 1))``: the images as they are, padded
        (:func:`_tile_inputs`): differences from a window's own mean round no coarser
        than the data.
    shifts : two Tensors ``(N, C, *n, 1, ...)``: the tiles' shifts.
    moments : five Tensors ``(N, C, *n, *T)``: the one-pass moments about the tiles'
        shifts (read, not changed).
    redo : Tensor ``(R,)`` of int64: flat indices of windows into ``(N, C, *n, *T)``.

    Returns
    -------
    moments : five Tensors ``(R,)``: ``Σw(a-μa), Σw(b-μb), Σw(a-μa)², Σw(b-μb)²,
        Σw(a-μa)(b-μb)`` with ``μ`` the one-pass window means (float32); the first two are
        the (tiny) residuals of those means.
    centers : two Tensors ``(R,)``: ``μa, μb``.
    deltas : two Tensors ``(R,)``: ``μ`` minus the tile's shift.
    """
    d = grid.dims
    extended = padded.shape[-d:]
    inputs = padded.reshape(2, -1)
    per_out = math.prod(grid.tile)
    # The index of each window's first sample in the flattened padded images: the output's
    # coordinate (tile · T + position) per axis, in its (N, C) image.
    tile_id, position = redo // per_out, redo % per_out
    coords = [None] * d
    tile_rest = tile_id
    for axis in reversed(range(d)):
        t, c = grid.tile[axis], grid.counts[axis]
        coords[axis] = (tile_rest % c) * t + position % t
        tile_rest, position = tile_rest // c, position // t
    first = tile_rest * math.prod(extended)  # tile_rest is now the (N, C) image index
    stride = 1
    for axis in reversed(range(d)):
        first += coords[axis] * stride
        stride *= extended[axis]
    offsets = _window_offsets(extended, window.sizes, padded.device)
    weights = _window_weights(window, padded.dtype, padded.device)
    tile_shifts = [s.reshape(-1).index_select(0, tile_id) for s in shifts]
    centers = [
        m.reshape(-1).index_select(0, redo).div_(window.total).add_(s)
        for m, s in zip(moments[:2], tile_shifts)
    ]
    deltas = [c - s for c, s in zip(centers, tile_shifts)]
    out = [padded.new_empty(redo.shape) for _ in range(5)]
    step = max(1, REDO_CHUNK // offsets.numel())
    for lo in range(0, redo.numel(), step):
        index = (first[lo : lo + step, None] + offsets).reshape(-1)
        da = inputs[0].index_select(0, index).view(-1, offsets.numel())
        db = inputs[1].index_select(0, index).view(-1, offsets.numel())
        da.sub_(centers[0][lo : lo + step, None])
        db.sub_(centers[1][lo : lo + step, None])
        wa, wb = da * weights, db * weights
        torch.sum(wa, 1, out=out[0][lo : lo + step])
        torch.sum(wb, 1, out=out[1][lo : lo + step])
        torch.sum(wa.mul_(da), 1, out=out[2][lo : lo + step])
        torch.sum(wb.mul_(db), 1, out=out[3][lo : lo + step])
        torch.sum(da.mul_(db).mul_(weights), 1, out=out[4][lo : lo + step])
    return out, centers, deltas


def _tiled_pointwise(padded, grid, shifts, moments, window, metric, need_partials):
    """The metric of float32 tile moments, with the risky windows (:func:`_risky_windows`)
    redone two-pass in float32 from the padded images (:func:`_two_pass_moments`).

    ``padded`` ``(2, N, C, *(n T + k - 1))``, ``shifts`` two ``(N, C, *n, 1, ...)``,
    ``moments`` five ``(N, C, *n, *T)`` (overwritten). Returns the map ``(N, C, *n, *T)``
    and the partials ``(P, N, C, *n, *T)`` (or None), float32.

    A redone window's moments are taken about its own mean ``μ``, so its variances come
    out of float32 whole; the metric gets ``μ`` as the shift, and its partials are
    converted back to moments about the tile's shift ``m``, which the backward uses (with
    ``δ = μ - m``, a constant):

        ∂F/∂M_a = ∂F/∂M'_a - 2 δ_a ∂F/∂M'_aa - δ_b ∂F/∂M'_ab    (b likewise)
    """
    # One device sync: the index of the windows to redo (usually none, or a few).
    risky = _risky_windows(moments, window.total, metric.variance_floor)
    redo = risky.flatten().nonzero().squeeze(1)
    if redo.numel():
        redone, centers, deltas = _two_pass_moments(padded, grid, shifts, moments, redo, window)
    out, partials = metric.pointwise(moments, shifts, window.total, need_partials)
    if not redo.numel():
        return out, partials
    out_r, partials_r = metric.pointwise(redone, centers, window.total, need_partials)
    out.view(-1).index_copy_(0, redo, out_r.to(out.dtype))
    if partials is not None:
        i_a, i_b, i_aa, i_bb, i_ab = metric.slots
        c_aa, c_ab = metric.coefficients
        delta_a, delta_b = deltas
        # The metric stores ∂F/∂M_aa as c_aa/2 · partials[i_aa], ∂F/∂M_ab as c_ab · ....
        to_a = (
            partials_r[i_a] - c_aa * delta_a * partials_r[i_aa] - c_ab * delta_b * partials_r[i_ab]
        )
        to_b = (
            partials_r[i_b] - c_aa * delta_b * partials_r[i_bb] - c_ab * delta_a * partials_r[i_ab]
        )
        partials_r[i_a], partials_r[i_b] = to_a, to_b
        flat = partials.view(partials.shape[0], -1)
        flat.index_copy_(1, redo, partials_r.to(partials.dtype))
    return out, partials


class _MomentMap(torch.autograd.Function):
    """``(a, b) -> F(moments)`` with the one-adjoint-pass backward.

    Inputs ``(N, C, *S)`` in the dtype the sums run in; padding (SciPy "reflect") happens
    inside, fused with the centering, and its adjoint folds the strips of the (fresh)
    gradient buffers in place. With a ``grid`` every tile is centered on its own mean
    (:func:`_tile_centered_moments`) and the work runs in the tiled layout, the map
    untiled at the end. ``reduction="mean"`` returns the mean of the map (0-dim), so that
    its backward can fold ``1/numel`` into the adjoint pass.
    """

    @staticmethod
    def forward(
        ctx,
        a,
        b,
        window: Window,
        metric: MomentMetric,
        reduction: str,
        impl: ModuleType,
        grid: TileGrid | None,
    ):
        need_partials = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        with torch.no_grad():
            if grid is None:
                centered, shifts, moments = _centered_moments(a, b, window, impl)
                out, partials = metric.pointwise(moments, shifts, window.total, need_partials)
            else:
                padded, centered, shifts = _tile_inputs(a, b, window, grid)
                moments = impl.moments5(centered, window.taps)
                out, partials = _tiled_pointwise(
                    padded, grid, shifts, moments, window, metric, need_partials
                )
                del padded
                out = grid.untile(out)
                if partials is not None:  # outputs past the image must send nothing back
                    grid.zero_outside_(partials)
            del moments
            if reduction == "mean":
                ctx.numel = out.numel()
                out = out.mean()
        ctx.window, ctx.metric, ctx.reduction, ctx.impl = window, metric, reduction, impl
        ctx.grid = grid
        ctx.spatial = tuple(a.shape[2:])
        if need_partials:
            ctx.save_for_backward(centered, partials)
        return out

    @staticmethod
    @first_order_backward("ssim/local_ncc")
    def backward(ctx, grad_out):
        centered, partials = ctx.saved_tensors
        window, metric = ctx.window, ctx.metric
        if ctx.reduction == "mean":
            # Scalar upstream gradient: 1/numel rides on the adjoint pass; g itself is
            # applied to the two final maps, and skipped when it is a CPU 1 (the usual
            # loss.backward()) to save two passes without a device sync elsewhere.
            adjoint, factor = _window_adjoint(ctx.impl, window, partials, 1.0 / ctx.numel)
            g = grad_out if factor == 1.0 else grad_out * factor
            if g.device.type == "cpu" and float(g) == 1.0:
                g = None
        else:
            if ctx.grid is not None:
                grad_out = ctx.grid.split(grad_out)
            adjoint, _ = _window_adjoint(ctx.impl, window, partials * grad_out, 1.0)
            g = None
        grad_a = grad_b = None
        i_a, i_b, i_aa, i_bb, i_ab = metric.slots
        c_aa, c_ab = metric.coefficients
        a_c, b_c = centered[0], centered[1]
        # ``adjoint`` is ours: build each gradient in place in its own slot (i_a != i_b).
        if ctx.needs_input_grad[0]:
            grad_a = adjoint[i_a].addcmul_(a_c, adjoint[i_aa], value=c_aa)
            grad_a.addcmul_(b_c, adjoint[i_ab], value=c_ab)
        if ctx.needs_input_grad[1]:
            grad_b = adjoint[i_b].addcmul_(b_c, adjoint[i_bb], value=c_aa)
            grad_b.addcmul_(a_c, adjoint[i_ab], value=c_ab)
        pads = centered_pads(window.sizes)
        if grad_a is not None:
            grad_a = _to_image(grad_a, ctx.grid, ctx.spatial, pads)
            grad_a = grad_a.mul_(g) if g is not None else grad_a
        if grad_b is not None:
            grad_b = _to_image(grad_b, ctx.grid, ctx.spatial, pads)
            grad_b = grad_b.mul_(g) if g is not None else grad_b
        return grad_a, grad_b, None, None, None, None, None


def _to_image(grad: torch.Tensor, grid: TileGrid | None, spatial, pads) -> torch.Tensor:
    """A gradient over the padded image (or over the tiles' inputs) back onto ``(N, C, *S)``."""
    if grid is not None:
        grad = grid.overlap_add(grad)
    return _reflect_fold_(grad, spatial, pads)


def check_moment_inputs(a, b, window, reduction: str) -> tuple[int, ...]:
    """Validate what every moment metric takes; returns the window's odd sizes per axis."""
    check_pair(a, b)
    check_choice(reduction, "reduction", REDUCTIONS)
    return check_window(window, a.shape[2:])


def moment_map(
    a: torch.Tensor, b: torch.Tensor, window: Window, metric: MomentMetric, reduction: str
) -> torch.Tensor:
    """Evaluate ``metric`` on the windowed moments of ``a`` and ``b`` (reflect-padded).

    Parameters
    ----------
    a, b : Tensor, shape ``(N, C, *S)``, validated (:func:`check_moment_inputs`).
    window : Window with ``len(S)`` axes of odd sizes, each no longer than the image.
    metric : MomentMetric
    reduction : {"none", "mean"}

    Returns
    -------
    Tensor, shape ``(N, C, *S)`` ("none") or ``()`` ("mean"), in the promoted dtype of
    ``a`` and ``b``; NaN exactly where a window holds a non-finite pixel of either image
    (and a NaN mean then).
    """
    out_dtype = torch.promote_types(a.dtype, b.dtype)
    invalid_a, invalid_b = nonfinite_mask(a), nonfinite_mask(b)
    if invalid_a is not None:
        a = fill_nonfinite(a, invalid_a)
    if invalid_b is not None:
        b = fill_nonfinite(b, invalid_b)
    impl = _kernels.implementation(metric.name, a)
    # Centering on the image mean is not enough where a window's mean sits far from it
    # (microscopy: bright blobs, smooth backgrounds): Σa² - (Σa)²/n then cancels in
    # float32 (docs/maths.md §1.3). On the CPU the moments and the metric run in float64
    # for float32 data; on GPUs (float64 at 1/64 rate on most) and MPS they stay in
    # float32 and each tile of the output is centered on its own mean instead.
    acc = moment_dtype(compute_dtype(out_dtype), a.device)
    grid = TileGrid.for_window(a.shape[2:], window.sizes) if acc == torch.float32 else None
    invalid = (
        invalid_a
        if invalid_b is None
        else (invalid_b if invalid_a is None else invalid_a | invalid_b)
    )
    if invalid is None:
        out = _MomentMap.apply(a.to(acc), b.to(acc), window, metric, reduction, impl, grid)
        return out.to(out_dtype)
    # NaN exactly where a window (through the reflected border) saw a non-finite pixel.
    out = _MomentMap.apply(a.to(acc), b.to(acc), window, metric, "none", impl, grid)
    out = out.masked_fill(windows_seeing(invalid, window.sizes, "reflect"), float("nan"))
    return (out.mean() if reduction == "mean" else out).to(out_dtype)
