"""The registration loop's mean squared difference: :class:`~.losses.MSELoss` (weighted) as
one autograd Function, in nine launches forward and backward where autograd's form takes
twelve (one GPU kernel each, /work/shared/GPU.md).

Per pair ``L = Σ w d² / Σw`` with ``d = moving − fixed`` (``Σw`` at least 1e-8, as
:class:`~.losses.MSELoss` floors it): the two sums are one batched product per image line
of the weight with the rows ``[d², 1]``, then a sum over the lines (as accurate as
MSELoss's own sums in float32); the backward is ``∂L/∂moving = 2 g w d / Σw``. Sums in the
images' compute dtype, as MSELoss's. No input check reads anything back: a non-finite
pixel makes its pair's loss NaN, which the optimizer's own reads catch.
"""

from __future__ import annotations

import numpy as np
import torch

from ._autograd import first_order_backward
from ._lncc_pair import BufferLease, covers
from ._numerics import compute_dtype
from .losses import MSELoss

_TINY = 1e-8  # MSELoss's floor of Σw


class _Rows:
    """The rows ``(N, B, 2, L)`` the sums take, per image line (``L``: the last axis's
    length, ``B``: the number of lines): ``[d², 1]``, the ones written once."""

    def __init__(self):
        self.rows = None
        self.lease = BufferLease()

    def get(self, n: int, spatial, dtype, device) -> torch.Tensor:
        lines = (int(np.prod(spatial[:-1])), int(spatial[-1]))
        shape = (n, lines[0], 2, lines[1])
        rows = self.rows
        if rows is None or rows.shape != shape or rows.dtype != dtype or rows.device != device:
            rows = self.rows = torch.empty(shape, dtype=dtype, device=device)
            rows[:, :, 1] = 1.0
            self.zero = rows.new_zeros(())
        if not self.lease.free():  # a second call before the first one's backward
            return rows.clone()
        return rows


class _PairMSE(torch.autograd.Function):
    """``moving (N, 1, *S)``, ``fixed (N or 1, 1, *S)``, ``weight (N or 1, 1, *S)`` ↦ the
    weighted mean squared difference per pair ``(N,)``."""

    @staticmethod
    def forward(ctx, moving, fixed, weight, side: _Rows):
        n = moving.shape[0]
        spatial = tuple(moving.shape[2:])
        dtype = compute_dtype(torch.promote_types(fixed.dtype, moving.dtype))
        rows = side.get(n, spatial, dtype, moving.device)
        if side.lease.free() and any(ctx.needs_input_grad):
            side.lease.hold(ctx)
        lines, length = rows.shape[1], rows.shape[3]
        d = torch.sub(moving.to(dtype), fixed.to(dtype))  # (N, 1, *S)
        torch.mul(d, d, out=rows[:, :, 0].view(n, 1, *spatial))
        w = weight.to(dtype).expand(n, *weight.shape[1:]).reshape(n * lines, length, 1)
        # Σw d², Σw: per line, then over the lines
        sums = torch.bmm(rows.view(n * lines, 2, length), w).view(n, lines, 2).sum(1)
        total = sums[:, 1].clamp_min(_TINY)
        loss = torch.div(sums[:, 0], total)
        ctx.save_for_backward(d, w, total)
        ctx.side, ctx.out_dtype = side, moving.dtype
        return loss.to(moving.dtype)

    @staticmethod
    @first_order_backward("mse pair loss")
    def backward(ctx, grad):
        d, w, total = ctx.saved_tensors
        ctx.side.lease.release(ctx)
        n = d.shape[0]
        coef = torch.addcdiv(ctx.side.zero, grad.to(d.dtype), total, value=2.0)  # 2 g / Σw
        grad_m = torch.mul(w.view_as(d), coef.view(n, *[1] * (d.dim() - 1))).mul_(d)
        return grad_m.to(ctx.out_dtype), None, None, None


class PairMSELoss(MSELoss):
    """The weighted mean squared difference per pair, for the registration loop (see the
    module's docstring).

    ``forward(fixed, moving, weight)``: ``fixed`` ``(N or 1, 1, *S)`` (no gradient),
    ``moving`` ``(N, 1, *S)``, ``weight`` ``(N or 1, 1, *S)``; returns ``(N,)``
    (``reduction="none"``), the mean or the sum. Anything it does not cover (no weight,
    several channels, a fixed image that needs a gradient) goes to
    :class:`~.losses.MSELoss`.
    """

    def __init__(self, reduction: str = "none"):
        super().__init__(reduction=reduction)
        self._rows = _Rows()

    def forward(self, fixed, moving, weight=None):
        if not covers(fixed, moving, weight):
            return super().forward(fixed, moving, weight)
        losses = _PairMSE.apply(moving, fixed, weight, self._rows)
        if self.reduction == "mean":
            return losses.mean()
        if self.reduction == "sum":
            return losses.sum()
        return losses
