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
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from . import _kernels
from ._autograd import first_order_backward
from ._nonfinite import fill_nonfinite, nonfinite_mask, windows_seeing
from ._numerics import accumulate_dtype, compute_dtype
from ._padding import centered_pads
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
    spatial = tuple(a.shape[2:])
    pads = centered_pads(window.sizes)
    dims = tuple(range(2, a.dim()))
    shifts = (a.mean(dims, keepdim=True), b.mean(dims, keepdim=True))
    padded_shape = [n + lo + hi for n, (lo, hi) in zip(spatial, pads)]
    centered = a.new_empty((2, *a.shape[:2], *padded_shape))
    interior = (Ellipsis, *[slice(lo, lo + n) for n, (lo, _) in zip(spatial, pads)])
    torch.sub(a, shifts[0], out=centered[0][interior])
    torch.sub(b, shifts[1], out=centered[1][interior])
    _reflect_fill_(centered, spatial, pads)
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


class _MomentMap(torch.autograd.Function):
    """``(a, b) -> F(moments)`` with the one-adjoint-pass backward.

    Inputs ``(N, C, *S)`` in the compute dtype; padding (SciPy "reflect") happens inside,
    fused with the centering, and its adjoint folds the strips of the (fresh) gradient
    buffers in place. ``reduction="mean"`` returns the mean of the map (0-dim), so that
    its backward can fold ``1/numel`` into the adjoint pass.
    """

    @staticmethod
    def forward(ctx, a, b, window: Window, metric: MomentMetric, reduction: str, impl: ModuleType):
        need_partials = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        with torch.no_grad():
            centered, shifts, moments = _centered_moments(a, b, window, impl)
            out, partials = metric.pointwise(moments, shifts, window.total, need_partials)
            del moments
            if reduction == "mean":
                ctx.numel = out.numel()
                out = out.mean()
        ctx.window, ctx.metric, ctx.reduction, ctx.impl = window, metric, reduction, impl
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
            grad_a = _reflect_fold_(grad_a, ctx.spatial, pads)
            grad_a = grad_a.mul_(g) if g is not None else grad_a
        if grad_b is not None:
            grad_b = _reflect_fold_(grad_b, ctx.spatial, pads)
            grad_b = grad_b.mul_(g) if g is not None else grad_b
        return grad_a, grad_b, None, None, None, None


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
    # float32 (docs/maths.md §1.3). The moments and the metric run in float64 wherever
    # the device has it, as local_std's sums do (float32 for half types on MPS).
    acc = accumulate_dtype(compute_dtype(out_dtype), a.device)
    invalid = (
        invalid_a
        if invalid_b is None
        else (invalid_b if invalid_a is None else invalid_a | invalid_b)
    )
    if invalid is None:
        return _MomentMap.apply(a.to(acc), b.to(acc), window, metric, reduction, impl).to(out_dtype)
    # NaN exactly where a window (through the reflected border) saw a non-finite pixel.
    out = _MomentMap.apply(a.to(acc), b.to(acc), window, metric, "none", impl)
    out = out.masked_fill(windows_seeing(invalid, window.sizes, "reflect"), float("nan"))
    return (out.mean() if reduction == "mean" else out).to(out_dtype)
