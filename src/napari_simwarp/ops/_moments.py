"""One engine for every metric built on five windowed moments of two images.

SSIM and local NCC share one structure: the windowed moments

    M = (W⋆a, W⋆b, W⋆a², W⋆b², W⋆ab)          (five maps, one batched separable pass)

then a per-pixel function ``F(M)`` (the metric map), and a backward that needs only the
per-pixel partials ``p_m = ∂L/∂M_m`` and ONE more window pass, the adjoint of the first:

    ∂L/∂a = Wᵀ⋆p_a + 2a · (Wᵀ⋆p_aa) + b · (Wᵀ⋆p_ab)
    ∂L/∂b = Wᵀ⋆p_b + 2b · (Wᵀ⋆p_bb) + a · (Wᵀ⋆p_ab)

(SPEC §5: the products are correlated, never multiplied by ``W⋆1``.) ``Wᵀ`` is the
transpose of a "valid" pass: it scatters each output back over its window, so it maps
the valid domain ``S`` onto the padded domain ``S + k - 1``. The padding (SciPy
"reflect", as ``_padding.pad_spatial`` does it) is fused into the engine: the centred
images are written once into the interior of the padded buffer and the strips mirrored
from it, and the backward folds the strips of its own gradient buffer back in place.
That saves the two gathers of ``pad_spatial`` and their ``index_add`` adjoints (about
a fifth of the forward+backward time at 2048²).

A metric is a :class:`MomentMetric`: its ``pointwise`` computes the map and, when a
gradient will be needed, the partial maps, in as few element-wise passes as it can
(every pass over a 2048² float32 map costs ~4.5 ms on a 2-core CPU, about as much as two
window taps). Several moments may share one partial map (SSIM: ``p_aa == p_bb``), which
saves a whole adjoint pass; :attr:`MomentMetric.slots` says which map serves which moment.

Both images are centred on their own per-(N, C) mean ``m`` (detached) before the moments:
without the shift ``W⋆a² - (W⋆a)²`` cancels catastrophically in float32 on data with a
large offset (microscopy; SPEC §1 "Numerics"). Variances and covariances are invariant
to the shift, the local means are not (SSIM's luminance term needs them), so metrics get
the shifts too and give their partials with respect to the centred moments; the engine
then combines with the centred ``a`` and ``b``. With ``M`` the centred moments and ``U``
the plain ones (``U_a = M_a + m_a``, ``U_aa = M_aa + 2 m_a M_a + m_a²``,
``U_ab = M_ab + m_b M_a + m_a M_b + m_a m_b``), the chain rule gives

    ∂F/∂M_a = ∂F/∂U_a + 2 m_a ∂F/∂U_aa + m_b ∂F/∂U_ab

which a metric that works with plain moments uses to convert (a shift-invariant one,
like local NCC, needs nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from . import _backend
from ._accumulate import accumulate_dtype
from ._filters import box_sum_valid, correlate_separable_valid, gaussian_kernel1d
from ._padding import centred_pads, pad_spatial
from ._validation import (
    check_choice,
    check_image,
    check_same_device,
    check_same_shape,
    compute_dtype,
)

#: reductions every moment metric accepts.
REDUCTIONS = ("none", "mean")
#: window kernels every moment metric accepts.
KERNELS = ("box", "gaussian")
#: longest box whose adjoint scatters directly (k adds per element); longer ones use
#: prefix sums. Same crossover as ``_filters.box_sum_valid``'s "auto" (kept here so the
#: adjoint does not depend on that module's internals).
DIRECT_TRANSPOSE_MAX_WINDOW = 17


# --------------------------------------------------------------------------------------
# Windows: a "valid" separable pass and its transpose.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """A separable window over the trailing spatial axes.

    ``taps[i]`` are the 1-D weights of axis ``i`` (array-axis order). A box window has
    all-ones taps (local sums, ``total = Π k_i``); a Gaussian window has normalised taps
    (local weighted means, ``total = 1``). Every window here is symmetric, so its
    correlation and convolution agree, but :meth:`transpose_valid` does not rely on it.
    """

    taps: tuple[tuple[float, ...], ...]
    is_box: bool

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(t) for t in self.taps)

    @property
    def total(self) -> float:
        """Sum of all weights: the ``N`` of the box, 1 for a normalised Gaussian."""
        out = 1.0
        for t in self.taps:
            out *= sum(t)
        return out

    def correlate_valid(self, x: torch.Tensor, compiled: bool = False) -> torch.Tensor:
        """``(..., *P) -> (..., *(P - k + 1))``: the window pass, valid mode.

        ``compiled``: run the kernels (running sums for a box, one pass per axis).
        """
        if compiled:
            from . import _compiled

            if self.is_box:
                return _compiled.box_sum(x.contiguous(), self.sizes)
            return _compiled.correlate(x.contiguous(), self.taps)
        if self.is_box:
            return box_sum_valid(x, self.sizes)
        return correlate_separable_valid(x, self.taps)

    def transpose_valid(self, y: torch.Tensor, scale: float = 1.0,
                        compiled: bool = False) -> torch.Tensor:
        """Adjoint of ``scale ×`` :meth:`correlate_valid`: ``(..., *S) -> (..., *(S + k - 1))``.

        ``scale`` is folded into the taps of the first axis (free: a mean reduction's
        ``1/numel`` costs no pass).
        """
        if compiled:
            from . import _compiled

            if self.is_box:
                out = _compiled.box_sum(y.contiguous(), self.sizes, full=True)
                return out.mul_(scale) if scale != 1.0 else out
            taps = [tuple(t * scale for t in self.taps[0]), *self.taps[1:]]
            return _compiled.correlate(y.contiguous(), taps, transpose=True)
        d = len(self.taps)
        out = y
        for axis, taps in enumerate(self.taps):
            if axis == 0 and scale != 1.0:
                taps = tuple(t * scale for t in taps)
            dim = y.dim() - d + axis
            if self.is_box and len(taps) > DIRECT_TRANSPOSE_MAX_WINDOW:
                # Long boxes: the O(1) prefix route on the zero-padded map (the full
                # correlation with a constant kernel is its own transpose).
                out = _box_transpose_prefix(out, len(taps), dim, taps[0])
            else:
                out = _transpose1d_valid(out, taps, dim)
        return out


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
    padded = pad_spatial(y, pads, mode="zeros")
    window = [1] * y.dim()
    window[dim] = k
    out = box_sum_valid(padded, window)
    return out.mul_(weight) if weight != 1.0 else out


def make_window(kind: str, sizes: Sequence[int], sigma: Sequence[float] | None = None) -> Window:
    """A :class:`Window` of odd ``sizes`` per axis; ``sigma`` per axis for ``"gaussian"``."""
    if kind == "box":
        return Window(tuple((1.0,) * k for k in sizes), is_box=True)
    taps = tuple(
        (1.0,) if k == 1 else tuple(gaussian_kernel1d(k, s)) for k, s in zip(sizes, sigma)
    )
    return Window(taps, is_box=False)


# --------------------------------------------------------------------------------------
# Metrics: per-pixel maths of the five moments.
# --------------------------------------------------------------------------------------


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

    #: the public op's name, for the backend choice (``_backend.use_compiled``).
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
            of the centred images. They are scratch buffers the metric may overwrite.
        shifts : two Tensors, shape ``(N, C, 1, ...)``: the means ``(m_a, m_b)`` that were
            subtracted (the plain local mean is ``W⋆a + m_a`` for a normalised window).
        total : float
            Sum of the window weights (the box's element count, 1 for a Gaussian).
        need_partials : bool
            Whether to return the partial maps (a backward will follow).

        Returns
        -------
        map : Tensor, shape ``(N, C, *S)``
        partials : Tensor, shape ``(P, N, C, *S)``, or None when not needed; partials with
            respect to the centred moments, laid out as :attr:`slots` says.
        """
        raise NotImplementedError


# --------------------------------------------------------------------------------------
# The autograd function.
# --------------------------------------------------------------------------------------


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
        (region(slice(before + n, before + n + after)), region(slice(before + n - after, before + n))),
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


def _centred_moments(
    a: torch.Tensor, b: torch.Tensor, window: Window, compiled: bool = False
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], list[torch.Tensor]]:
    """Centred, reflect-padded images and their five windowed moments.

    Centring and padding are fused: the centred images are written once into the
    interior of the padded buffer and the strips are mirrored from there.

    Parameters
    ----------
    a, b : Tensor, shape ``(N, C, *S)``.

    Returns
    -------
    centred : Tensor, shape ``(2, N, C, *P)``, ``P = S + k - 1``: ``a`` and ``b`` minus
        their per-(N, C) means, padded with SciPy "reflect".
    shifts : two Tensors, shape ``(N, C, 1, ...)``: those means.
    moments : five Tensors, shape ``(N, C, *S)``: ``W⋆a, W⋆b, W⋆a², W⋆b², W⋆ab`` of the
        centred images (views of two fresh buffers the caller owns).
    """
    spatial = tuple(a.shape[2:])
    pads = centred_pads(window.sizes)
    dims = tuple(range(2, a.dim()))
    shifts = (a.mean(dims, keepdim=True), b.mean(dims, keepdim=True))
    padded_shape = [n + lo + hi for n, (lo, hi) in zip(spatial, pads)]
    centred = a.new_empty((2, *a.shape[:2], *padded_shape))
    interior = (Ellipsis, *[slice(lo, lo + n) for n, (lo, _) in zip(spatial, pads)])
    torch.sub(a, shifts[0], out=centred[0][interior])
    torch.sub(b, shifts[1], out=centred[1][interior])
    _reflect_fill_(centred, spatial, pads)
    if compiled:
        # One fused pass: the products are formed line by line, never as full maps.
        from . import _compiled

        moments = _compiled.moments5(centred, window.taps)
        return centred, shifts, list(moments.unbind(0))
    a_c, b_c = centred[0], centred[1]
    products = a.new_empty((3, *a_c.shape))
    torch.mul(a_c, a_c, out=products[0])
    torch.mul(b_c, b_c, out=products[1])
    torch.mul(a_c, b_c, out=products[2])
    # Two stacked passes (the products are freed right after theirs; the centred images
    # are kept for the backward).
    first = window.correlate_valid(centred)
    second = window.correlate_valid(products)
    del products
    return centred, shifts, [first[0], first[1], second[0], second[1], second[2]]


class _MomentMap(torch.autograd.Function):
    """``(a, b) -> F(moments)`` with the one-adjoint-pass backward.

    Inputs ``(N, C, *S)`` in the compute dtype; padding (SciPy "reflect") happens inside,
    fused with the centring, and its adjoint folds the strips of the (fresh) gradient
    buffers in place. ``reduction="mean"`` returns the mean of the map (0-dim), so that
    its backward folds ``1/numel`` into the adjoint taps.
    """

    @staticmethod
    def forward(ctx, a, b, window: Window, metric: MomentMetric, reduction: str,
                compiled: bool = False):
        need_partials = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        with torch.no_grad():
            centred, shifts, moments = _centred_moments(a, b, window, compiled)
            out, partials = metric.pointwise(moments, shifts, window.total, need_partials)
            del moments
            if reduction == "mean":
                ctx.numel = out.numel()
                out = out.mean()
        ctx.window, ctx.metric, ctx.reduction, ctx.compiled = window, metric, reduction, compiled
        ctx.spatial = tuple(a.shape[2:])
        if need_partials:
            ctx.save_for_backward(centred, partials)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        centred, partials = ctx.saved_tensors
        window, metric = ctx.window, ctx.metric
        if ctx.reduction == "mean":
            # Scalar upstream gradient: 1/numel rides on the adjoint taps; g itself is
            # applied to the two final maps, and skipped when it is a CPU 1 (the usual
            # loss.backward()) to save two passes without a device sync elsewhere.
            adjoint = window.transpose_valid(partials, scale=1.0 / ctx.numel,
                                             compiled=ctx.compiled)
            g = grad_out
            if g.device.type == "cpu" and float(g) == 1.0:
                g = None
        else:
            adjoint = window.transpose_valid(partials * grad_out, compiled=ctx.compiled)
            g = None
        grad_a = grad_b = None
        i_a, i_b, i_aa, i_bb, i_ab = metric.slots
        c_aa, c_ab = metric.coefficients
        a_c, b_c = centred[0], centred[1]
        # ``adjoint`` is ours: build each gradient in place in its own slot (i_a != i_b).
        if ctx.needs_input_grad[0]:
            grad_a = adjoint[i_a].addcmul_(a_c, adjoint[i_aa], value=c_aa)
            grad_a.addcmul_(b_c, adjoint[i_ab], value=c_ab)
        if ctx.needs_input_grad[1]:
            grad_b = adjoint[i_b].addcmul_(b_c, adjoint[i_bb], value=c_aa)
            grad_b.addcmul_(a_c, adjoint[i_ab], value=c_ab)
        pads = centred_pads(window.sizes)
        if grad_a is not None:
            grad_a = _reflect_fold_(grad_a, ctx.spatial, pads)
            grad_a = grad_a.mul_(g) if g is not None else grad_a
        if grad_b is not None:
            grad_b = _reflect_fold_(grad_b, ctx.spatial, pads)
            grad_b = grad_b.mul_(g) if g is not None else grad_b
        return grad_a, grad_b, None, None, None, None


def moment_map(
    a: torch.Tensor, b: torch.Tensor, window: Window, metric: MomentMetric, reduction: str
) -> torch.Tensor:
    """Evaluate ``metric`` on the windowed moments of ``a`` and ``b`` (reflect-padded).

    Parameters
    ----------
    a, b : Tensor, shape ``(N, C, *S)``, already validated, in the compute dtype.
    window : Window with ``len(S)`` axes of odd sizes, each no longer than the image.
    metric : MomentMetric
    reduction : {"none", "mean"}

    Returns
    -------
    Tensor, shape ``(N, C, *S)`` ("none") or ``()`` ("mean"), in the compute dtype.
    """
    check_choice(reduction, "reduction", REDUCTIONS)
    compiled = _backend.use_compiled(metric.name, a)
    # Centring on the image mean is not enough where a window's mean sits far from it
    # (microscopy: bright blobs, smooth backgrounds): Σa² - (Σa)²/n then cancels in
    # float32 (SPEC §1 "Numerics"). The moments and the metric run in float64 wherever
    # the device has it, as local_std's sums do; the result returns in a's dtype.
    acc = accumulate_dtype(a.dtype, a.device)
    out = _MomentMap.apply(a.to(acc), b.to(acc), window, metric, reduction, compiled)
    return out.to(a.dtype)


# --------------------------------------------------------------------------------------
# Argument checks shared by the public wrappers.
# --------------------------------------------------------------------------------------


def check_pair(a, b) -> tuple[torch.dtype, torch.dtype]:
    """Validate two images of one shape and device.

    Returns ``(out_dtype, compute_dtype)``: the promoted input dtype the result is
    returned in, and the dtype the maths runs in (float32 for half types).
    """
    check_image(a, "a")
    check_image(b, "b")
    check_same_shape(a, b, "a", "b")
    check_same_device(a, b, "a", "b")
    out_dtype = torch.promote_types(a.dtype, b.dtype)
    return out_dtype, compute_dtype(out_dtype)


def check_positive(value, name: str) -> float:
    """A finite, strictly positive real number, as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a positive number, got {value!r}")
    value = float(value)
    if not (value > 0.0 and value < float("inf")):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return value


def check_sigma(sigma, ndim: int, name: str = "sigma") -> tuple[float, ...]:
    """One positive standard deviation per spatial axis, from a number or a sequence."""
    if isinstance(sigma, Sequence) and not isinstance(sigma, str):
        if len(sigma) != ndim:
            raise ValueError(
                f"{name} must have one value per spatial axis ({ndim}), got {len(sigma)}: "
                f"{sigma!r}"
            )
        return tuple(check_positive(s, name) for s in sigma)
    return (check_positive(sigma, name),) * ndim
