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

from collections.abc import Sequence

import numpy as np
import torch

from . import _kernels
from ._autograd import first_order_backward
from ._numerics import compute_dtype, flat_threshold_factor, moment_dtype
from ._padding import centered_pads
from ._validation import check_pair, check_window
from .losses import LocalNCCLoss


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


class _FixedSide:
    """What the loss needs of a fixed image ``(N_f, 1, *S)``, in the sums' dtype ``acc``.

    padded : ``(1, N_f, P)`` the centered, scaled image, reflect-padded and flattened
    sa : ``(N_f, *S)`` its window sums; ``inv_va`` : ``(N_f, *S)`` ``1 / Va`` (0 where flat)
    index : ``(P,)`` the padding's gather index
    """

    def __init__(self, fixed: torch.Tensor, sizes: tuple[int, ...], acc: torch.dtype, impl):
        self.fixed = fixed  # kept: its identity is the cache's key
        self.version = fixed._version
        self.sizes, self.acc, self.impl = sizes, acc, impl
        spatial = tuple(fixed.shape[2:])
        self.total = float(np.prod(sizes))
        self.taps = [(1.0,) * k for k in sizes]
        self.index = torch.as_tensor(reflect_index(spatial, sizes), device=fixed.device)
        self.padded_shape = tuple(n + k - 1 for n, k in zip(spatial, sizes))
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
            flat = va <= sums[1] * flat_threshold_factor(acc)
            self.inv_va = va.reciprocal().masked_fill_(flat, 0.0)
        self.moving = None  # (pairs, shift, scale) of the moving images, from the first call

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
                self.unit = self.padded.new_ones((n,))  # 1 per pair: the loss is 1 − score
                self.zero = self.padded.new_zeros(())
        return self.moving[1], self.moving[2]


class _PairLocalNCC(torch.autograd.Function):
    """``b (N, 1, *S)`` ↦ ``1 −`` the weighted mean of the local NCC of each pair ``(N,)``.

    With ``M = (Σb, Σb², Σab)`` the window sums of the centered, padded ``b`` and the fixed
    side's ``Σa``, ``1/Va``: ``Vb = Σb² − (Σb)²/n``, ``C = Σab − ΣaΣb/n``,
    ``ρ = C · sqrt(1/Va · 1/Vb)`` (0 where either window is flat), and per pair
    ``L = 1 − Σ w ρ / Σ w``. With ``c = ∂L/∂ρ = −g w / Σw``, ``r = sqrt(1/(Va Vb))``:

        ∂L/∂Σab = c r,   ∂L/∂Σb² = −½ c ρ / Vb,   ∂L/∂Σb = (Σb · c ρ / Vb − Σa c r) / n

    then one adjoint window pass ``Q = Wᵀ⋆(partials)`` and
    ``∂L/∂b_pad = Q_b + 2 b Q_bb + a Q_ab`` (the ``−½`` folded in: the second map holds
    ``c ρ / Vb``), folded back through the padding by one ``index_add``.
    """

    @staticmethod
    def forward(ctx, moving, weight, side: _FixedSide):
        acc, impl, total = side.acc, side.impl, side.total
        n = moving.shape[0]
        shift, scale = side.moving_constants(moving)
        b = torch.add(shift, moving.to(acc), alpha=scale)  # centered, scaled
        bp = b.view(n, -1).index_select(1, side.index)[None]  # (1, N, P)
        pair = torch.cat([side.padded.expand(1, n, -1), bp]).view(2, n, *side.padded_shape)
        # one pass for the five moments (two of them, the fixed image's, already known: one
        # launch where forming the three products takes two more)
        _, sb, _, sbb, sab = impl.moments5(pair, side.taps)
        vb = torch.addcmul(sbb, sb, sb, value=-1.0 / total)
        cov = torch.addcmul(sab, side.sa, sb, value=-1.0 / total)
        flat = vb <= sbb.mul_(flat_threshold_factor(acc))
        inv_vb = vb.reciprocal_().masked_fill_(flat, 0.0)
        r = torch.mul(side.inv_va, inv_vb).sqrt_()
        rho = cov.mul_(r)
        spatial = tuple(moving.shape[2:])
        rho = rho.view(n, 1, *spatial)
        if weight is None:
            loss = torch.sub(side.unit, rho.flatten(1).mean(1))
            wsum = None
        else:
            w = weight.to(acc).expand(n, 1, *spatial)
            wsum = w.flatten(1).sum(1).clamp_min_(1e-8)  # LocalNCCLoss's floor
            weighted = torch.bmm(w.reshape(n, 1, -1), rho.view(n, -1, 1)).view(n)
            loss = torch.addcdiv(side.unit, weighted, wsum, value=-1.0)
        ctx.side, ctx.scale, ctx.n = side, scale, n
        ctx.has_weight = weight is not None
        ctx.save_for_backward(bp, sb, rho, r, inv_vb, w if weight is not None else None, wsum)
        ctx.out_dtype = moving.dtype
        return loss.to(moving.dtype)

    @staticmethod
    @first_order_backward("lncc pair loss")
    def backward(ctx, grad):
        bp, sb, rho, r, inv_vb, w, wsum = ctx.saved_tensors
        side, n = ctx.side, ctx.n
        acc, total = side.acc, side.total
        spatial = tuple(rho.shape[2:])
        grad = grad.to(acc)
        # c = ∂L/∂ρ times the scale of b (∂b/∂moving), folded in here: index_add_ with an
        # alpha other than 1 takes a slow path on the CPU (100 times slower)
        factor = -ctx.scale
        if w is None:
            c = (grad * (factor / rho[0].numel())).view(n, *[1] * len(spatial))
            c = c.expand(n, *spatial)
        else:
            coef = torch.addcdiv(side.zero, grad, wsum, value=factor)
            c = torch.mul(w.view(n, *spatial), coef.view(n, *[1] * len(spatial)))
        partials = sb.new_empty((3, n, *spatial))
        torch.mul(c, r, out=partials[2])
        torch.mul(c, rho.view(n, *spatial), out=partials[1])
        partials[1].mul_(inv_vb)
        torch.addcmul(side.zero, sb, partials[1], value=1.0 / total, out=partials[0])
        partials[0].addcmul_(side.sa, partials[2], value=-1.0 / total)
        adjoint = side.impl.box_sum(partials, side.sizes, full=True).view(3, n, -1)
        grad_bp = adjoint[0].addcmul_(side.padded[0], adjoint[2])
        grad_bp.addcmul_(bp[0], adjoint[1], value=-1.0)
        grad_b = grad_bp.new_zeros((n, int(np.prod(spatial))))
        grad_b.index_add_(1, side.index, grad_bp)
        return grad_b.view(n, 1, *spatial).to(ctx.out_dtype), None, None


class PairLocalNCCLoss(LocalNCCLoss):
    """``1 −`` the weighted mean local NCC per pair (box window), for a loop that calls it
    with one fixed image again and again (see the module's docstring).

    ``forward(fixed, moving, weight=None)``: ``fixed`` ``(N or 1, 1, *S)`` (no gradient),
    ``moving`` ``(N, 1, *S)``, ``weight`` ``(N or 1, 1, *S)`` or None; returns ``(N,)``
    (``reduction="none"``), the mean or the sum. Anything it does not cover (several
    channels, a fixed image that needs a gradient) goes to :class:`~.losses.LocalNCCLoss`'s
    general path.
    """

    def __init__(self, window: int | Sequence[int] = 9, reduction: str = "none"):
        super().__init__(window=window, reduction=reduction)
        self._side: _FixedSide | None = None

    def forward(self, fixed, moving, weight=None):
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
            return super().forward(fixed, moving, weight)
        side = self._side
        acc = moment_dtype(
            compute_dtype(torch.promote_types(fixed.dtype, moving.dtype)), fixed.device
        )
        if side is None or not side.matches(fixed, side.sizes, acc):
            check_pair(fixed.expand_as(moving), moving, "fixed", "moving")
            sizes = check_window(self.window, fixed.shape[2:])
            impl = _kernels.implementation("local_ncc", fixed)
            side = self._side = _FixedSide(fixed, sizes, acc, impl)
        losses = _PairLocalNCC.apply(moving, weight, side)
        if self.reduction == "mean":
            return losses.mean()
        if self.reduction == "sum":
            return losses.sum()
        return losses
