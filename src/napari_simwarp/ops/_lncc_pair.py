"""The registration loop's local NCC loss: the fixed image's half worked out once.

:class:`PairLocalNCCLoss` is :class:`~.losses.LocalNCCLoss` (box window) for a loop that
evaluates one fixed image against a moving image that changes at every iteration. It
computes what :func:`~.local_ncc.local_ncc` computes (docs/maths.md §2.2), the per-pair
weighted mean of the local NCC, in a few launches (one GPU kernel each, /work/shared/
GPU.md), where the general operator spends about 125 and three host reads:

- the fixed image's side (its reflect-padded centered copy, its window sums ``Σa`` and
  ``1/Va``, its flat windows) is worked out on the first call and kept while the same
  fixed tensor comes back (:class:`_FixedSide`);
- the moving image is centered on its mean and scaled by a power of two, both taken at
  the first call and kept (exact shifts and scalings: the NCC does not depend on them;
  they only keep the sums well conditioned), padded by one gather, and its moments
  ``(Σb, Σb², Σab)`` summed in one pass (``moments5``: one op, kernel or pure torch);
- the backward is analytic: the partials of the three moments, one adjoint window pass,
  and the padding's adjoint as one ``index_add``;
- no input check reads anything back: a non-finite pixel makes its pair's loss NaN (as
  :class:`~.losses.LocalNCCLoss` gives it: NaN times a zero weight is NaN), which the
  optimizer's own reads catch.

Precision. The sums run in :func:`~._numerics.moment_dtype` (float64 on the CPU, float32
on GPUs) after centering each image on its mean, as the general operator does on the CPU.
On GPUs the general operator also centers each tile of the output on its own mean and
redoes the tiles float32 cannot resolve in float64; this loss does not (a window's
variance carries a relative error of about ``eps · (local mean / local std)²``, largest in
nearly flat windows, which weigh little in the mean). tests/ops/test_lncc_pair.py measures
both against float64.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np
import torch

from . import _kernels
from ._autograd import first_order_backward
from ._numerics import compute_dtype, flat_threshold_factor, moment_dtype
from ._padding import centered_pads
from ._validation import check_pair, check_window
from .losses import LocalNCCLoss

#: added to a pair's weight sum Σw (about its pixel count, or 0 where no pixel counts):
#: LocalNCCLoss's floor (there a clamp; here one launch fewer, and a relative change of
#: 1e-8 / Σw where any pixel counts)
WEIGHT_FLOOR = 1e-8


def reflect_index(shape: Sequence[int], window: Sequence[int]) -> np.ndarray:
    """The flat index into an image of ``shape`` of every pixel of its SciPy "reflect"
    (half-sample symmetric) padding for a centered ``window``: ``(prod(shape + k - 1),)``,
    C order."""
    axes = []
    for n, (lo, hi) in zip(shape, centered_pads(window)):
        p = np.arange(-lo, n + hi)
        p = np.where(p < 0, -p - 1, np.where(p >= n, 2 * n - 1 - p, p))
        axes.append(p)
    grids = np.meshgrid(*axes, indexing="ij")
    return np.ravel_multi_index(grids, tuple(shape)).ravel()


def power_of_two(x: torch.Tensor) -> float:
    """``2**-e`` with ``2**(e-1) <= max |x| < 2**e`` (1 for an all-zero or non-finite
    ``x``): an exact scaling into ``[-1, 1]`` (one host read)."""
    peak = float(x.detach().abs().amax())
    if not (0.0 < peak < float("inf")):
        return 1.0
    _, e = np.frexp(peak)
    return float(2.0 ** -int(np.clip(e, -120, 120)))


def covers(fixed, moving, weight=None, *, weighted: bool = True) -> bool:
    """Whether a pair loss of the loop (this module's, ``_ncc_pair``'s, ``_mse_pair``'s)
    takes its fast path for these arguments; anything else goes to the general loss.

    ``fixed`` ``(N or 1, 1, *S)`` tensor with no gradient, ``S`` 2-D or 3-D; ``moving``
    ``(N, 1, *S)``; both floating point on one device. With ``weighted`` (the NCC and MSE
    losses), ``weight`` too: a tensor ``(N or 1, 1, *S)`` with no gradient on that device;
    without it (the local NCC loss) ``weight`` is not looked at.
    """
    if (
        not isinstance(fixed, torch.Tensor)
        or not isinstance(moving, torch.Tensor)
        or fixed.requires_grad
        or fixed.dim() not in (4, 5)
        or fixed.shape[1] != 1
        or moving.shape[1:] != fixed.shape[1:]
        or fixed.shape[0] not in (1, moving.shape[0])
        or fixed.device != moving.device
        or not fixed.dtype.is_floating_point
        or not moving.dtype.is_floating_point
    ):
        return False
    return not weighted or (
        isinstance(weight, torch.Tensor)
        and not weight.requires_grad
        and weight.shape[1:] == fixed.shape[1:]
        and weight.shape[0] in (1, moving.shape[0])
        and weight.device == fixed.device
    )


class BufferLease:
    """Tensors a call writes into and saves for its backward, lent to one call at a time.

    :meth:`free` says whether the last holder is done with them: its backward has run
    (:meth:`release`) or its graph is gone. A call that finds them held (a second forward
    before the first one's backward, as gradcheck makes) takes new tensors instead, and
    so does a call whose backward will not come (no gradient asked); the loop, which runs
    a forward and its backward in turn, writes into the same tensors at every iteration.
    """

    def __init__(self):
        self._holder = None

    def free(self) -> bool:
        return self._holder is None or self._holder() is None

    def hold(self, ctx) -> None:
        self._holder = weakref.ref(ctx)

    def release(self, ctx) -> None:
        if self._holder is not None and self._holder() is ctx:
            self._holder = None


class _FixedSide:
    """What the loss needs of a fixed image ``(N_f, 1, *S)``, in the sums' dtype ``acc``.

    padded : ``(1, N_f, P)`` the centered, scaled image, reflect-padded and flattened
    sa : ``(N_f, *S)`` its window sums; ``va`` : ``(N_f, *S)`` its window variances, +inf
    where flat (so that ``1 / sqrt(Va Vb)`` is 0 there)
    index : ``(P,)`` the padding's gather index

    and, per number of pairs ``N`` (:meth:`buffers`), the tensors each call writes into.
    """

    def __init__(self, fixed: torch.Tensor, sizes: tuple[int, ...], acc: torch.dtype, impl):
        self.fixed = fixed  # kept: its identity is the cache's key
        self.version = fixed._version
        self.sizes, self.acc, self.impl = sizes, acc, impl
        spatial = tuple(fixed.shape[2:])
        self.spatial = spatial
        self.total = float(np.prod(sizes))
        self.taps = [(1.0,) * k for k in sizes]
        self.index = torch.as_tensor(reflect_index(spatial, sizes), device=fixed.device)
        self.padded_shape = tuple(n + k - 1 for n, k in zip(spatial, sizes))
        self.flat = flat_threshold_factor(acc)
        with torch.no_grad():
            f = fixed.detach().to(acc)
            dims = tuple(range(2, f.dim()))
            scale = power_of_two(f - f.mean(dims, keepdim=True))
            centered = (f - f.mean(dims, keepdim=True)) * scale
            padded = centered.flatten(1).index_select(1, self.index)  # (N_f, P)
            self.padded = padded[None]
            sums = impl.box_sum(
                torch.stack([padded, padded * padded]).view(2, -1, *self.padded_shape),
                sizes,
            )
            self.sa = sums[0]
            va = torch.addcmul(sums[1], sums[0], sums[0], value=-1.0 / self.total)
            flat = va <= sums[1] * self.flat
            self.va = va.masked_fill_(flat, torch.inf)
            self.inf = va.new_full((), torch.inf)
            self.zero = va.new_zeros(())
        self.moving = None  # (pairs, shift, scale) of the moving images, from the first call
        self._buffers = None
        self.lease = BufferLease()

    def matches(self, fixed, sizes, acc) -> bool:
        return (
            fixed is self.fixed
            and fixed._version == self.version
            and sizes == self.sizes
            and acc == self.acc
        )

    def moving_constants(self, moving: torch.Tensor):
        """``(shift (N, 1, ...), scale)``: ``b ↦ shift + scale · b`` centers and scales the
        moving images; taken from the first batch of ``N`` pairs and kept."""
        n = moving.shape[0]
        if self.moving is None or self.moving[0] != n:
            with torch.no_grad():
                b = moving.detach().to(self.acc)
                mean = b.mean(tuple(range(1, b.dim())), keepdim=True)
                scale = power_of_two(b - mean)
                self.moving = (n, -mean * scale, scale)
        return self.moving[1], self.moving[2]

    def buffers(self, n: int, fresh: bool = False):
        """``(pair (2, N, *P), rho (N, 2, S'), q (3, N, *S), partials (3, N, *S), unit
        (N,), floor (N, 1, 2))`` for ``N`` pairs, made once: ``pair[0]`` holds the fixed
        image's padded copy and ``pair[1]`` takes the moving image's; ``rho[:, 0]`` takes
        the local NCC beside a row of ones (``S'``: the pixel count), so that one product
        gives the weighted sum and the weight's sum (plus ``floor``: 0 and
        :data:`WEIGHT_FLOOR`); ``q`` takes the gradient's three maps per unit ``∂L/∂ρ``
        (:class:`_PairLocalNCC`) and ``partials`` their products in the backward.

        Lent to one call at a time (:class:`BufferLease`); ``fresh``: new ones, not kept.
        """
        if fresh or self._buffers is None or self._buffers[-1].shape[0] != n:
            p = self.padded
            # made by factories, not from the fixed side's tensors: written by the device
            # at each call (tests/_dispatch_count.py takes what is made from a tensor of
            # NumPy data alone for the host's)
            like = dict(dtype=p.dtype, device=p.device)
            pair = torch.empty((2, n, p.shape[-1]), **like)
            pair[0] = p[0].expand(n, -1)
            pixels = int(np.prod(self.spatial))
            rho = torch.empty((n, 2, pixels), **like)
            rho[:, 1] = 1.0
            q = torch.empty((3, n, *self.spatial), **like)
            partials = torch.empty_like(q)
            # added to (Σwρ, Σw): LocalNCCLoss's floor of Σw (a clamp there), in the
            # weighted sums' own launch
            floor = torch.zeros((n, 1, 2), **like)
            floor[..., 1] = WEIGHT_FLOOR
            made = (pair, rho, q, partials, p.new_ones((n,)), floor)
            if fresh:
                return made
            self._buffers = made
        return self._buffers


class _PairLocalNCC(torch.autograd.Function):
    """``b (N, 1, *S)`` ↦ ``base −`` the weighted mean of the local NCC of each pair
    ``(N,)`` (``base``: 1, or a tensor ``(N,)`` the loss is added to).

    With ``M = (Σb, Σb², Σab)`` the window sums of the centered, padded ``b`` and the fixed
    side's ``Σa``, ``Va``: ``Vb = Σb² − (Σb)²/n`` (+inf where ``Vb <= f Σb²``, flat),
    ``C = Σab − ΣaΣb/n``, ``r = 1 / sqrt(Va Vb)``, ``ρ = C r`` (0 where either window is
    flat), and per pair ``L = 1 − Σ w ρ / Σ w``. With ``c = ∂L/∂ρ = −g w / Σw``:

        ∂L/∂Σab = c r,   ∂L/∂Σb² = −½ c ρ / Vb,   ∂L/∂Σb = (Σb · c ρ / Vb − Σa c r) / n

    i.e. ``c`` times three maps ``q`` that do not depend on ``g``, worked out in the
    forward; then one adjoint window pass ``Q = Wᵀ⋆(c q)`` and
    ``∂L/∂b_pad = Q_b + 2 b Q_bb + a Q_ab`` (the ``−½`` folded in: the second map holds
    ``c ρ / Vb``), folded back through the padding by one ``index_add``.
    """

    @staticmethod
    def forward(ctx, moving, weight, side: _FixedSide, prepared: bool, base):
        acc, impl, total = side.acc, side.impl, side.total
        n = moving.shape[0]
        keep = side.lease.free()
        pair, rho_rows, q, partials, unit, floor = side.buffers(n, fresh=not keep)
        if keep and any(ctx.needs_input_grad):
            side.lease.hold(ctx)
        ctx.partials = partials
        if prepared:  # centered and scaled before the warp (prepare_moving)
            b, scale = moving.to(acc), 1.0
        else:
            shift, scale = side.moving_constants(moving)
            b = torch.add(shift, moving.to(acc), alpha=scale)  # centered, scaled
        torch.index_select(b.reshape(n, -1), 1, side.index, out=pair[1])
        # one pass for the five moments (two of them, the fixed image's, already known: one
        # launch where forming the three products takes two more)
        _, sb, _, sbb, sab = impl.moments5(pair.view(2, n, *side.padded_shape), side.taps)
        vb = torch.addcmul(sbb, sb, sb, value=-1.0 / total)
        cov = torch.addcmul(sab, side.sa, sb, value=-1.0 / total)
        # Vb > f Σb² (not flat) ⇔ Σb² − (Σb)² / (n (1 − f)) > 0
        test = torch.addcmul(sbb, sb, sb, value=-1.0 / (total * (1.0 - side.flat)))
        vb = torch.where(test > 0, vb, side.inf)
        r = torch.rsqrt(torch.mul(side.va, vb), out=q[2])
        spatial = tuple(moving.shape[2:])
        rho = torch.mul(cov, r, out=rho_rows[:, 0].view(n, *spatial))
        torch.div(rho, vb, out=q[1])
        torch.addcmul(side.zero, sb, q[1], value=1.0 / total, out=q[0])
        q[0].addcmul_(side.sa, r, value=-1.0 / total)
        base = unit if base is None else base.to(acc)
        if weight is None:
            loss = torch.sub(base, rho.flatten(1).mean(1))
            w = wsum = None
        else:
            w = weight.to(acc).expand(n, 1, *spatial).reshape(n, 1, -1)
            sums = torch.baddbmm(floor, w, rho_rows.transpose(1, 2)).view(n, 2)  # Σwρ, Σw
            wsum = sums[:, 1]
            loss = torch.addcdiv(base, sums[:, 0], wsum, value=-1.0)
        ctx.side, ctx.scale, ctx.n = side, scale, n
        ctx.save_for_backward(pair, q, w, wsum)
        ctx.out_dtype = moving.dtype
        return loss.to(moving.dtype)

    @staticmethod
    @first_order_backward("lncc pair loss")
    def backward(ctx, grad):
        pair, q, w, wsum = ctx.saved_tensors
        side, n = ctx.side, ctx.n
        spatial = side.spatial
        partials = ctx.partials
        side.lease.release(ctx)
        g = grad.to(side.acc)
        # c = ∂L/∂ρ times the scale of b (∂b/∂moving), folded in here: index_add_ with an
        # alpha other than 1 takes a slow path on the CPU (100 times slower)
        factor = -ctx.scale
        if w is None:
            c = (g * (factor / int(np.prod(spatial)))).view(n, *[1] * len(spatial))
        else:
            coef = torch.addcdiv(side.zero, g, wsum, value=factor)
            c = torch.mul(w.view(n, *spatial), coef.view(n, *[1] * len(spatial)))
        torch.mul(q, c, out=partials)
        adjoint = side.impl.box_sum(partials, side.sizes, full=True).view(3, n, -1)
        grad_bp = adjoint[0].addcmul_(side.padded[0], adjoint[2])
        grad_bp.addcmul_(pair[1], adjoint[1], value=-1.0)
        grad_b = grad_bp.new_zeros((n, int(np.prod(spatial))))
        grad_b.index_add_(1, side.index, grad_bp)
        grad_base = grad if ctx.needs_input_grad[4] else None
        return grad_b.view(n, 1, *spatial).to(ctx.out_dtype), None, None, None, grad_base


class PairLocalNCCLoss(LocalNCCLoss):
    """``1 −`` the weighted mean local NCC per pair (box window), for a loop that calls it
    with one fixed image again and again (see the module's docstring).

    ``forward(fixed, moving, weight=None, base=None)``: ``fixed`` ``(N or 1, 1, *S)`` (no
    gradient), ``moving`` ``(N, 1, *S)``, ``weight`` ``(N or 1, 1, *S)`` or None; returns
    ``(N,)`` (``reduction="none"``), the mean or the sum. ``base`` ``(N,)``, with
    ``reduction="none"``: the losses are ``base −`` the mean local NCC, i.e. the loss plus
    ``base − 1`` (the loop's regularizer, made as ``1 + λ R``: no launch to add it).
    Anything it does not cover (several channels, a fixed image that needs a gradient)
    goes to :class:`~.losses.LocalNCCLoss`'s general path.

    :meth:`prepare_moving` centers and scales the moving image before the loop warps it
    (the local NCC does not depend on either), which saves a launch at every call.
    """

    @staticmethod
    def takes_base(fixed: torch.Tensor) -> bool:
        """Whether the loop should hand its regularizer to ``forward`` as ``base`` (``1 +``
        the term, in the field's dtype): where the sums run in float32 (GPUs), whose loss
        ``1 − score`` is float32 near 1 anyway; in float64 (the CPU) the loss keeps
        float64's resolution and the loop adds the term to it."""
        return moment_dtype(compute_dtype(fixed.dtype), fixed.device) == torch.float32

    def __init__(self, window: int | Sequence[int] = 9, reduction: str = "none"):
        super().__init__(window=window, reduction=reduction)
        self._side: _FixedSide | None = None
        self._prepared = False

    def prepare_moving(self, moving: torch.Tensor) -> torch.Tensor:
        """``moving`` ``(N or 1, C, *S)`` centered on each image's mean and scaled by a
        power of two (a new tensor, same dtype): the images this loss's ``forward`` then
        takes as they are (warped), without centering them again at each call."""
        with torch.no_grad():
            m = moving.detach()
            mean = m.mean(tuple(range(1, m.dim())), keepdim=True)
            scale = power_of_two(m - mean)
            out = (m - mean) * scale
        self._prepared = True
        return out

    def forward(self, fixed, moving, weight=None, base=None):
        if base is not None and self.reduction != "none":
            raise ValueError(f"base needs reduction='none', got {self.reduction!r}")
        if not covers(fixed, moving, weighted=False):
            out = super().forward(fixed, moving, weight)
            return out if base is None else out + (base - 1.0)
        side = self._side
        acc = moment_dtype(
            compute_dtype(torch.promote_types(fixed.dtype, moving.dtype)), fixed.device
        )
        if side is None or not side.matches(fixed, side.sizes, acc):
            check_pair(fixed.expand_as(moving), moving, "fixed", "moving")
            sizes = check_window(self.window, fixed.shape[2:])
            impl = _kernels.implementation("local_ncc", fixed)
            side = self._side = _FixedSide(fixed, sizes, acc, impl)
        losses = _PairLocalNCC.apply(moving, weight, side, self._prepared, base)
        if self.reduction == "mean":
            return losses.mean()
        if self.reduction == "sum":
            return losses.sum()
        return losses
