"""Splatting in pure torch: the twin of ``simwarp::splat_fwd`` / ``splat_bwd``.

docs/maths.md §4. The forward pass is a scatter; the backward pass is written by hand as
gathers only, so it needs no atomics and no index sorting:

    ∂L/∂f(i)  = Σ_j g(p_i, j) · v(j) / den(j)
    ∂L/∂d_i   = Σ_j [Σ_c v_c(j) · (f_c(i) − out_c(j)) / den(j) + v_den(j)] · ∂g(p_i, j)/∂d_i

(plain sum: ``den(j)`` replaced by 1 and ``out`` by 0 in the brackets), with ``v = ∂L/∂out``
and ``v_den = ∂L/∂den`` when the weight map is returned and used.

Layout: the accumulators carry a 2-pixel margin on every side (shares that leave the image
land there and are cropped), and channel ``C`` of the ``(N, C + 1, ·)`` buffers holds the
weight, so each of the 2ᴰ corners costs one scatter forward and one gather backward and
needs no bounds test. The corners are visited one at a time, shifting a view of the
buffer instead of building a per-corner index, so the largest temporaries are the
``(N, C + 1, prod(S + 4))`` accumulator and a few ``(N, prod(S))`` buffers, never a
``(N, C, 2ᴰ, *S)`` int64 index. For the backward it keeps, besides the inputs and the
accumulator, the landing cell (one int64) and the D fractions of every source pixel.

Determinism: ``scatter_add_`` on CPU accumulates each output row serially in index order
(work is split across rows, i.e. across images and channels, never within one), so the
same input gives bitwise the same output.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from .._autograd import first_order_backward

#: Width of the border added around the accumulation buffers. Landing positions are
#: clamped to ``[-2, S]`` along each axis, so all 2ᴰ corners of any landing cell fall in
#: ``[-2, S + 1]``: shares that leave the image land in this border and are cropped away,
#: with no per-corner bounds test and no index masking.
MARGIN = 2


@dataclass
class _Landing:
    """Where the source pixels land, flattened to ``(N, P)`` with ``P = prod(S)``.

    ``base`` is the int64 flat index, in the buffer padded by ``MARGIN``, of each landing
    cell's lowest corner; ``hats[k]`` the 1-D weights ``(1 − frac_k, frac_k)`` of the lower
    and upper neighbor along axis ``k``; ``padded`` the padded spatial shape.
    """

    base: torch.Tensor  # (N, P) int64
    hats: list[tuple[torch.Tensor, torch.Tensor]]  # D pairs of (N, P)
    padded: tuple[int, ...]


def _landing(displacement: torch.Tensor) -> _Landing:
    """Landing cells and fractions of ``q + displacement`` for ``(N, D, *S)`` displacement."""
    n, d, *spatial = displacement.shape
    padded = tuple(s + 2 * MARGIN for s in spatial)
    strides = _strides(padded)
    base, hats = None, []
    for k, size in enumerate(spatial):
        view = [1] * d
        view[k] = size
        # Positions in the padded buffer's coordinates (pixel 0 of the image at MARGIN).
        grid = torch.arange(
            MARGIN, size + MARGIN, device=displacement.device, dtype=displacement.dtype
        )
        position = (displacement[:, k] + grid.view(view)).reshape(n, -1)
        # Positions beyond one pixel outside the image only reach the margin, so they may
        # be clamped; NaN is sent there too (finite weights, zero gradient, not NaN).
        torch.nan_to_num_(position, nan=0.0)
        position.clamp_(0, size + MARGIN)
        cell = torch.floor(position)
        frac = position.sub_(cell)  # reuse the buffer: fractional part in [0, 1)
        index = cell.to(torch.int64)
        if base is None:
            base = index.mul_(strides[k])
        else:
            base.add_(index, alpha=strides[k])
        hats.append((1.0 - frac, frac))
    return _Landing(base, hats, padded)


def _strides(shape) -> list[int]:
    """Row-major strides of a flattened array of shape ``shape``."""
    return [math.prod(shape[k + 1 :]) for k in range(len(shape))]


def _corners(landing: _Landing, weight_out: torch.Tensor):
    """Yield, for each of the 2ᴰ neighbors, how far and how much each share goes.

    Yields ``(bits, offset, weight)``: ``bits`` the corner's 0/1 offset per axis,
    ``offset`` its flat offset from ``landing.base`` in the padded buffer (an int: the
    scatter and the gather address a view shifted by it instead of building a new index),
    and ``weight`` the ``(N, P)`` bilinear weight ``g``, written into ``weight_out``
    (reused across corners: on CPU a fresh large allocation costs more than the
    arithmetic), so it is only valid until the next step.
    """
    strides = _strides(landing.padded)
    hats = landing.hats
    for bits in itertools.product((0, 1), repeat=len(hats)):
        offset = sum(c * s for c, s in zip(bits, strides))
        weight = _product([hat[c] for hat, c in zip(hats, bits)], weight_out)
        yield bits, offset, weight


def _product(factors: list[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Elementwise product of ``factors`` (all ``(N, P)``) written into ``out``."""
    if len(factors) == 1:
        return out.copy_(factors[0])
    torch.mul(factors[0], factors[1], out=out)
    for f in factors[2:]:
        out.mul_(f)
    return out


def _interior(padded: torch.Tensor, dims: int) -> torch.Tensor:
    """The view of the last ``dims`` axes of ``padded`` without the ``MARGIN`` border."""
    return padded[(..., *[slice(MARGIN, -MARGIN)] * dims)]


class _Splat(torch.autograd.Function):
    """Splatting with the hand-written, gather-only backward of docs/maths.md §4.

    Values and weights travel together: channel ``C`` of the ``(N, C + 1, ·)`` buffers is
    the weight (forward: ``den``; backward: the per-destination part of the displacement
    slope), so each corner costs one scatter forward and one gather backward.
    """

    @staticmethod
    def forward(ctx, image, displacement, normalize, eps):
        """image ``(N, C, *S)``, displacement ``(N, D, *S)`` in one dtype.

        Returns ``out`` ``(N, C, *S)`` and ``den`` ``(N, 1, *S)``.
        """
        n, c, *spatial = image.shape
        size = math.prod(spatial)
        values = image.reshape(n, c, size)
        landing = _landing(displacement)
        flat = math.prod(landing.padded)
        accumulated = image.new_zeros(n, c + 1, flat)
        share = image.new_empty(n, c + 1, size)
        # Channels share the weights and the index (expanded, not copied).
        index = landing.base.unsqueeze(1).expand(n, c + 1, size)
        for _, offset, weight in _corners(landing, share[:, c]):
            torch.mul(values, weight.unsqueeze(1), out=share[:, :c])
            accumulated[..., offset:].scatter_add_(2, index, share)
        inner = _interior(accumulated.view(n, c + 1, *landing.padded), len(spatial))
        # Two fresh tensors (not views of one buffer), so callers may modify them in place.
        out = inner[:, :c].contiguous()
        den = inner[:, c:].contiguous()
        hole = den <= eps
        if normalize:
            out.div_(den.masked_fill(hole, 1.0))
        out.masked_fill_(hole, 0.0)
        ctx.normalize, ctx.eps, ctx.padded = normalize, eps, landing.padded
        # The landing cells and fractions are kept rather than recomputed: one int64 and D
        # floats per pixel buy back a third of the backward's passes over memory.
        fracs = [hat[1] for hat in landing.hats]
        ctx.save_for_backward(image, out, den, landing.base, *fracs)
        ctx.set_materialize_grads(False)
        return out, den

    @staticmethod
    @first_order_backward("splat")
    def backward(ctx, v_out, v_den):
        image, out, den, base, *fracs = ctx.saved_tensors
        need_image, need_disp = ctx.needs_input_grad[:2]
        if v_out is None and v_den is None:
            return None, None, None, None
        n, c, *spatial = image.shape
        size = math.prod(spatial)
        landing = _Landing(base, [(1.0 - f, f) for f in fracs], ctx.padded)
        per_dest = _destination_terms(
            v_out,
            v_den,
            out.view(n, c, size),
            den.view(n, 1, size),
            ctx.normalize,
            ctx.eps,
            landing.padded,
        )
        values = image.reshape(n, c, size)
        grad_image = torch.zeros_like(values) if need_image else None
        grad_disp = image.new_zeros(n, len(spatial), size) if need_disp else None
        seen = image.new_empty(n, c + 1, size)
        slope = image.new_empty(n, 1, size)
        # Holds each corner's weight until grad_image has used it, then (in 3D) the
        # products of the other axes' hats for the displacement gradient.
        scratch = image.new_empty(n, size)
        index = landing.base.unsqueeze(1).expand(n, c + 1, size)
        for bits, offset, weight in _corners(landing, scratch):
            # Gathers only: each source pixel reads what the pixels it landed on saw.
            torch.gather(per_dest[..., offset:], 2, index, out=seen)
            if need_image:
                grad_image.addcmul_(seen[:, :c], weight.unsqueeze(1))
            if not need_disp:
                continue
            # slope = Σ_c v_c(j)·(f_c(i) − out_c(j))/den(j) + v_den(j), the factor of ∂g/∂d_i.
            if c == 1:
                torch.addcmul(seen[:, 1:], seen[:, :1], values, out=slope)
            else:
                torch.sum(seen[:, :c] * values, 1, keepdim=True, out=slope).add_(seen[:, c:])
            for k in range(len(spatial)):
                # ∂g/∂d_k = ±Π_{m≠k} hat_m: + for the upper neighbor, − for the lower.
                others = [hat[b] for m, (hat, b) in enumerate(zip(landing.hats, bits)) if m != k]
                product = others[0] if len(others) == 1 else _product(others, scratch)
                grad_disp[:, k].addcmul_(slope[:, 0], product, value=1.0 if bits[k] else -1.0)
        grad_image = grad_image.view(image.shape) if need_image else None
        grad_disp = grad_disp.view(n, len(spatial), *spatial) if need_disp else None
        return grad_image, grad_disp, None, None


def _destination_terms(v_out, v_den, out, den, normalize, eps, padded):
    """Per-destination factors the backward gathers, laid out in the padded buffer.

    v_out : ``(N, C, *S)`` or None; v_den : ``(N, 1, *S)`` or None; out ``(N, C, P)`` and
    den ``(N, 1, P)``: the forward's outputs; padded : the padded spatial shape.

    Returns ``(N, C + 1, P')``, ``P' = prod(padded)``, 0 in the margin: channels ``:C``
    hold ``v / den`` (``v`` in plain mode), 0 at holes; channel ``C`` holds
    ``v_den − Σ_c v_c·out_c/den``, the part of the displacement slope that does not depend
    on the source value.
    """
    n, c, size = out.shape
    c1 = c + 1
    dims = len(padded)
    spatial = tuple(s - 2 * MARGIN for s in padded)
    hole = den <= eps
    per_dest = out.new_zeros(n, c1, *padded)
    inner = _interior(per_dest, dims)
    if v_out is not None:
        v = v_out.reshape(n, c, size)
        scaled = v / den.masked_fill(hole, 1.0) if normalize else v.clone()
        scaled.masked_fill_(hole, 0.0)
        inner[:, :c] = scaled.view(n, c, *spatial)
        if normalize:
            # out is already 0 at holes, so this term vanishes there too.
            inner[:, c:] = -(scaled * out).sum(1, keepdim=True).view(n, 1, *spatial)
    if v_den is not None:
        # The weight map is continuous in d, holes included: its gradient is not masked.
        inner[:, c:] += v_den.reshape(n, 1, *spatial)
    return per_dest.view(n, c1, math.prod(padded))


def splat_fwd(image: torch.Tensor, displacement: torch.Tensor, normalize: bool, eps: float):
    """Splat ``image (N, C, *S)`` along ``displacement (N, D, *S)`` (one dtype, same N).

    Returns ``(out (N, C, *S), den (N, 1, *S))`` with ``ops.splat``'s semantics (holes 0);
    differentiable with respect to both inputs.
    """
    return _Splat.apply(image, displacement, normalize, float(eps))
