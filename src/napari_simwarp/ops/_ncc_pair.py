"""The registration loop's global NCC loss: the fixed image's side worked out once.

:class:`PairNCCLoss` is :class:`~.losses.NCCLoss` (weighted) for a loop that evaluates one
fixed image against a moving image that changes at every iteration, in about twenty
launches forward and backward where autograd's form of the general loss takes about
seventy (one GPU kernel each, /work/shared/GPU.md):

- the images are centered on their means and scaled by powers of two, the fixed image's
  once, the moving image's with the constants of the first call (exact shifts and scalings
  as far as the NCC goes: it does not depend on them; they keep the one-pass sums below
  well conditioned), as ops/_lncc_pair.py does;
- the six weighted sums ``Σw, Σwa, Σwb, Σwa², Σwb², Σwab`` are one batched product of the
  weight with the rows ``[1, a, b, a², b², ab]``, the fixed image's three made once;
- the score and its gradient's three coefficients are worked out on the ``(N, ·)`` sums;
  the backward is one product of the rows ``[1, a, b]`` with the coefficients, times the
  weight;
- no input check reads anything back: a non-finite pixel makes its pair's loss NaN,
  which the optimizer's own reads catch.

The loss is ``1 − C / sqrt(Va Vb)`` per pair with ``V = Σw x² − (Σw x)² / Σw`` and
``C = Σw ab − Σwa Σwb / Σw`` (``Σw`` at least 1e-8, as :class:`~.losses.NCCLoss` floors
it); a pair where either image is flat under the weight (``V <= f · Σw x²``, ``f`` the
flat rule of the sums' dtype: the variance below what the sums resolve) scores 0, with
zero gradient. The sums run in :func:`~._numerics.moment_dtype` (float64 on the CPU,
float32 on GPUs). The gradient, with ``r = 1 / sqrt(Va Vb)``, ``s`` the score and
``μ`` the weighted means:

    ∂s/∂b_j = w_j (r (a_j − μa) − s (b_j − μb) / Vb)
"""

from __future__ import annotations

import numpy as np
import torch

from ._autograd import first_order_backward
from ._lncc_pair import BufferLease, covers, power_of_two
from ._numerics import compute_dtype, flat_threshold_factor, moment_dtype
from .losses import NCCLoss

_TINY = 1e-8  # NCCLoss's floor of Σw


class _FixedRows:
    """What the loss keeps of a fixed image ``(N_f, 1, *S)`` in the sums' dtype ``acc``.

    rows : ``(N, B, 6, L)`` for the ``N`` pairs of the last call: ``[1, a, b, a², b², ab]``
    per image line (``L``: the last axis's length, ``B``: the number of lines), with the
    centered, scaled fixed image ``a`` and its two rows written once; the moving image's
    three rows are written at each call. Summed line by line and then over the lines (a
    float32 sum over a whole image in one product loses a few digits, about ten times
    what :class:`~.losses.NCCLoss`'s sums lose).
    """

    def __init__(self, fixed: torch.Tensor, acc: torch.dtype):
        self.fixed = fixed  # kept: its identity is the cache's key
        self.version = fixed._version
        self.acc = acc
        self.lines = (int(np.prod(fixed.shape[2:-1])), int(fixed.shape[-1]))  # (B, L)
        with torch.no_grad():
            f = fixed.detach().to(acc).flatten(1)  # (N_f, P)
            centered = f - f.mean(1, keepdim=True)
            self.a = (centered * power_of_two(centered)).view(-1, *self.lines)
        self.rows = None
        self.moving = None  # (N, shift (N, 1), scale): from the first call
        self.lease = BufferLease()  # of the rows: written by each call, saved for its backward
        self.flat = flat_threshold_factor(acc)

    def matches(self, fixed, acc) -> bool:
        return fixed is self.fixed and fixed._version == self.version and acc == self.acc

    def prepare(self, moving: torch.Tensor):
        """The rows and the moving images' ``(shift (N, 1), scale)`` for ``N`` pairs (made
        at the first call with ``N`` pairs and kept)."""
        n = moving.shape[0]
        if self.moving is None or self.moving[0] != n:
            with torch.no_grad():
                b = moving.detach().to(self.acc).flatten(1)
                mean = b.mean(1, keepdim=True)
                scale = power_of_two(b - mean)
                self.moving = (n, (-mean * scale)[:, :, None], scale)
                a = self.a.expand(n, -1, -1)
                # made by a factory, not from ``a``: written by the device at each call
                # (tests/_dispatch_count.py takes what is made from a tensor of NumPy
                # data alone for the host's)
                shape = (n, self.lines[0], 6, self.lines[1])
                rows = torch.empty(shape, dtype=a.dtype, device=a.device)
                rows[:, :, 0] = 1.0
                rows[:, :, 1] = a
                rows[:, :, 3] = a * a
                self.rows = rows
                self.unit = rows.new_ones((n,))  # the loss is 1 − score
                self.zero = rows.new_zeros(())
                self.inf = rows.new_full((), torch.inf)
        return self.rows, self.moving[1], self.moving[2]


class _PairNCC(torch.autograd.Function):
    """``moving (N, 1, *S)``, ``weight (N or 1, 1, *S)`` ↦ ``1 −`` the weighted global ZNCC
    per pair ``(N,)`` (see the module's docstring)."""

    @staticmethod
    def forward(ctx, moving, weight, side: _FixedRows, base):
        n = moving.shape[0]
        rows, shift, scale = side.prepare(moving)
        if side.lease.free():
            if any(ctx.needs_input_grad):
                side.lease.hold(ctx)
        else:  # a second call before the first one's backward: rows of its own
            rows = rows.clone()
        lines, length = side.lines
        b = rows[:, :, 2]  # (N, B, L) views of the rows, written in place
        torch.add(shift, moving.reshape(n, lines, length).to(side.acc), alpha=scale, out=b)
        torch.mul(b, b, out=rows[:, :, 4])
        torch.mul(rows[:, :, 1], b, out=rows[:, :, 5])
        w = weight.to(side.acc).expand(n, *weight.shape[1:]).reshape(n * lines, length, 1)
        # Σw, Σwa, Σwb, Σwa², Σwb², Σwab: per line, then over the lines
        sums = torch.bmm(rows.view(n * lines, 6, length), w).view(n, lines, 6).sum(1)
        total = sums[:, 0].clamp_min(_TINY)
        mean = torch.div(sums[:, 1:3], total[:, None])  # (μa, μb)
        raw = sums[:, 3:5]  # (Σwa², Σwb²)
        var = torch.addcmul(raw, sums[:, 1:3], mean, value=-1.0)  # (Va, Vb)
        cov = torch.addcmul(sums[:, 5], sums[:, 1], mean[:, 1], value=-1.0)
        # a flat image's variance is +inf: r = 1/sqrt(Va Vb) and s / Vb are then 0
        fine = var > raw * side.flat
        var = torch.where(fine, var, side.inf)
        r = var.prod(1).rsqrt_()
        score = torch.mul(cov, r)
        loss = torch.sub(side.unit if base is None else base.to(side.acc), score)
        ctx.save_for_backward(rows, w, r, score, var, mean)
        ctx.side, ctx.scale = side, scale
        ctx.out_dtype, ctx.spatial = moving.dtype, tuple(moving.shape[2:])
        return loss.to(moving.dtype)

    @staticmethod
    @first_order_backward("ncc pair loss")
    def backward(ctx, grad):
        rows, w, r, score, var, mean = ctx.saved_tensors
        ctx.side.lease.release(ctx)
        n = rows.shape[0]
        # L = 1 − s and ∂b/∂moving = scale, so with the module's ∂s/∂b_j:
        # ∂L/∂moving_j = scale · g · w_j · (u + v a_j + t b_j) where
        # t = s / Vb, v = −r, u = r μa − t μb
        t = torch.div(score, var[:, 1])
        u = torch.addcmul(r * mean[:, 0], t, mean[:, 1], value=-1.0)
        coef = torch.stack([u, r.neg(), t], 1)[:, None, :, None]  # (N, 1, 3, 1)
        g = grad.to(rows.dtype)[:, None, None, None]
        coef = torch.addcmul(ctx.side.zero, coef, g, value=ctx.scale)
        lines, length = ctx.side.lines
        coef = coef.expand(n, lines, 3, 1).reshape(n * lines, 3, 1)  # (a view for N = 1)
        rows = rows[:, :, :3].reshape(n * lines, 3, length).transpose(1, 2)
        grad_b = torch.bmm(rows, coef).mul_(w)  # (N·B, L, 1)
        grad_base = grad if ctx.needs_input_grad[3] else None
        return grad_b.view(n, 1, *ctx.spatial).to(ctx.out_dtype), None, None, grad_base


class PairNCCLoss(NCCLoss):
    """``1 −`` the weighted global ZNCC per pair, for a loop that calls it with one fixed
    image again and again (see the module's docstring).

    ``forward(fixed, moving, weight, base=None)``: ``fixed`` ``(N or 1, 1, *S)`` (no
    gradient), ``moving`` ``(N, 1, *S)``, ``weight`` ``(N or 1, 1, *S)``; returns ``(N,)``
    (``reduction="none"``), the mean or the sum. ``base`` ``(N,)`` (with
    ``reduction="none"``): ``base −`` the score, i.e. the loss plus ``base − 1`` (as
    :class:`~._lncc_pair.PairLocalNCCLoss` takes it). Anything it does not cover (no weight,
    several channels, a fixed image that needs a gradient) goes to
    :class:`~.losses.NCCLoss`.
    """

    @staticmethod
    def takes_base(fixed: torch.Tensor) -> bool:
        """Whether the loop should hand its regularizer to ``forward`` as ``base`` (``1 +``
        the term, in the field's dtype): where the sums run in float32 (GPUs), whose loss
        ``1 − score`` is float32 near 1 anyway; in float64 (the CPU) the loss keeps
        float64's resolution and the loop adds the term to it."""
        return moment_dtype(compute_dtype(fixed.dtype), fixed.device) == torch.float32

    def __init__(self, reduction: str = "none"):
        super().__init__(reduction=reduction)
        self._side: _FixedRows | None = None

    def forward(self, fixed, moving, weight=None, base=None):
        if base is not None and self.reduction != "none":
            raise ValueError(f"base needs reduction='none', got {self.reduction!r}")
        if not covers(fixed, moving, weight):
            out = super().forward(fixed, moving, weight)
            return out if base is None else out + (base - 1.0)
        acc = moment_dtype(
            compute_dtype(torch.promote_types(fixed.dtype, moving.dtype)), fixed.device
        )
        side = self._side
        if side is None or not side.matches(fixed, acc):
            side = self._side = _FixedRows(fixed, acc)
        losses = _PairNCC.apply(moving, weight, side, base)
        if self.reduction == "mean":
            return losses.mean()
        if self.reduction == "sum":
            return losses.sum()
        return losses
