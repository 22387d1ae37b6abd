"""Compensated float32 window sums in pure torch: the twins of ``csrc/include/simwarp/
compensated.h``, for the devices that keep float32 (GPUs, MPS: ``_numerics.moment_dtype``).

A value is a pair ``(hi, lo)`` of tensors of one dtype, ``hi`` the rounded value and ``lo``
its rounding error, kept by error-free transformations: Knuth's two-sum for additions and
Dekker's product (Veltkamp's split, no fused multiply-add needed) for squares. A float32
sum then carries about 48 significant bits, which is what ``V = S2 - S1²/N`` of a window
whose mean sits a thousand times its spread away from 0 needs (docs/maths.md §1.3).

These hold only in IEEE round-to-nearest arithmetic without reassociation or contraction:
torch's eager element-wise kernels (CPU, CUDA, MPS) compute each op on its own and round it
once. A compiler that fuses them (``torch.compile``) may contract Veltkamp's split into
fused multiply-adds, which breaks it: these functions are for eager mode.
Values must stay clear of overflow (``|x| < 2**100`` for the split of a square, the
callers scale by a power of two first) and of underflow (the errors of squares of values
below about ``2**-60`` are lost; the callers' scaling brings the largest value near 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def two_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a + b`` rounded and its exact rounding error (Knuth; any order of sizes)."""
    s = a + b
    z = s - a
    return s, (a - (s - z)).add_(b - z)


def _split(a: torch.Tensor, ones: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Veltkamp's split: ``a = hi + lo`` exactly, each half of ``a``'s significand."""
    c = a * float(2**ones + 1)
    hi = c - (c - a)
    return hi, a - hi


#: Veltkamp's split point ``ceil(p / 2)`` of a ``p``-bit significand
_SPLIT_BITS = {torch.float32: 12, torch.float64: 27}


def _split_bits(dtype: torch.dtype) -> int:
    return _SPLIT_BITS[dtype]


def exact_square(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a²`` as ``(p, e)`` with ``p = fl(a²)`` and ``p + e = a²`` exactly (Dekker)."""
    p = a * a
    hi, lo = _split(a, _split_bits(a.dtype))
    # ((hi² - p) + 2 hi lo) + lo²: each step exact, as in Dekker's product
    e = torch.addcmul(hi * hi - p, hi, lo, value=2.0)
    return p, e.addcmul_(lo, lo)


def exact_scaled(a: torch.Tensor, factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``factor · a`` as ``(p, e)``, ``p + e`` exact (Dekker's product with a constant)."""
    bits = _split_bits(a.dtype)
    f = torch.tensor(factor, dtype=a.dtype)
    f_hi_t, f_lo_t = _split(f, bits)
    f_hi, f_lo = float(f_hi_t), float(f_lo_t)
    p = a * float(f)
    hi, lo = _split(a, bits)
    e = (hi * f_hi - p).add_(hi * f_lo).add_(lo * f_hi).add_(lo * f_lo)
    return p, e


def add_pairs(
    a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``a + b`` of two compensated values: the highs by two-sum, the lows added."""
    s, e = two_sum(a[0], b[0])
    return s, e.add_(a[1]).add_(b[1])


def _narrow(pair, dim: int, start: int, length: int):
    return pair[0].narrow(dim, start, length), pair[1].narrow(dim, start, length)


def _box_sum1d(pair, k: int, dim: int):
    """Compensated valid window sums of ``k`` along ``dim``, from power-of-two partial
    sums (the ``tree`` route of :mod:`.window_sums`, each add a compensated one)."""
    n = pair[0].shape[dim] - k + 1
    parts = []
    offset, width, power = 0, 1, pair
    while True:
        if k & width:
            parts.append(_narrow(power, dim, offset, n))
            offset += width
        if 2 * width > k:
            break
        m = power[0].shape[dim] - width
        power = add_pairs(_narrow(power, dim, 0, m), _narrow(power, dim, width, m))
        width *= 2
    out = parts[-1]
    for part in parts[-2::-1]:
        out = add_pairs(out, part)
    if out[0].shape[dim] != n or not out[0].is_contiguous():
        out = (out[0].contiguous(), out[1].contiguous())
    return out


def box_sum_valid(pair, window: Sequence[int]):
    """Compensated box sums of ``(hi, lo)`` ``(..., *P)`` over the trailing
    ``len(window)`` axes, valid mode: ``(..., *(P - k + 1))`` each."""
    d = len(window)
    for axis, k in enumerate(window):
        if k > 1:
            pair = _box_sum1d(pair, k, pair[0].dim() - d + axis)
    return pair


def window_variance(y: torch.Tensor, window: Sequence[int]):
    """``S1``, ``S2`` and ``V = S2 - S1²/N`` of every valid window of ``y`` ``(..., *P)``,
    from compensated sums in ``y``'s dtype.

    Returns
    -------
    s1 : Tensor ``(..., *S)``, the window sums of ``y`` (rounded once).
    s2 : Tensor ``(..., *S)``, the window sums of ``y²`` (rounded once).
    v : Tensor ``(..., *S)``, ``N · variance``, from ``N·S2 - S1²`` formed with exact
        products, so it keeps the sums' precision (about 48 bits in float32).
    """
    count = 1
    for k in window:
        count *= int(k)
    square, square_error = exact_square(y)
    hi = torch.stack([y, square])
    lo = torch.stack([torch.zeros_like(y), square_error])
    (s1_hi, s2_hi), (s1_lo, s2_lo) = box_sum_valid((hi, lo), window)
    # N·S2 - S1²: N·S2.hi and S1.hi² exactly, the lows' contributions to first order
    # ((hi + lo)² - hi² = 2 hi lo + lo², lo² negligible).
    nv_hi, nv_lo = exact_scaled(s2_hi, float(count))
    nv_lo.add_(s2_lo, alpha=float(count))
    q_hi, q_lo = exact_square(s1_hi)
    q_lo.addcmul_(s1_hi, s1_lo, value=2.0)
    nv_hi, error = two_sum(nv_hi, q_hi.neg_())
    nv_lo.add_(error).sub_(q_lo)
    v = nv_hi.add_(nv_lo).div_(float(count))
    return s1_hi.add_(s1_lo), s2_hi.add_(s2_lo), v
