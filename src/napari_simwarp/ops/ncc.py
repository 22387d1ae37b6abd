"""Global zero-normalized cross-correlation of two images (docs/maths.md §2.3)."""

from __future__ import annotations

import torch

from ._nonfinite import fill_nonfinite, nonfinite_mask, power_of_two_scale
from ._numerics import flat_threshold_factor, moment_dtype
from ._validation import check_pair


def centered_energy(x: torch.Tensor, dims: tuple[int, ...]):
    """``x`` centered over ``dims`` and its sum of squared deviations, flat-safe.

    Uses the corrected two-pass formula ``Σx'² - (Σx')²/n`` (``x' = x - mean``): its
    second term removes the round-off of the mean, so a constant ``x`` gives exactly the
    rounding level, which the flat test below catches.

    Parameters
    ----------
    x : Tensor, shape ``(N, C, *S)``
    dims : the spatial dims.

    Returns
    -------
    centered : Tensor, shape ``(N, C, *S)``: ``x`` minus its mean (differentiable).
    energy : Tensor, shape ``(N, C, 1, ...)``: ``Σ (x - mean)²``, 1 where flat.
    flat : bool Tensor, shape ``(N, C, 1, ...)``.
    """
    count = 1
    for d in dims:
        count *= x.shape[d]
    centered = x - x.mean(dims, keepdim=True)
    sum_sq = centered.square().sum(dims, keepdim=True)
    energy = sum_sq - centered.sum(dims, keepdim=True).square() / count
    flat = (energy <= sum_sq.detach() * flat_threshold_factor(x.dtype)).detach()
    return centered, torch.where(flat, torch.ones_like(energy), energy), flat


def ncc(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Global ZNCC of two images of one shape, per batch element and channel.

    ``Σ (a - ā)(b - b̄) / sqrt(Σ (a - ā)² · Σ (b - b̄)²)`` over the spatial axes.

    Parameters
    ----------
    a, b : Tensor, shape ``(N, C, H, W)`` or ``(N, C, D, H, W)``, same shape and device
        float16/bfloat16 (computed in float32), float32 or float64.

    Returns
    -------
    Tensor, shape ``(N, C)``, in the promoted dtype of ``a`` and ``b``; 0 where either
    image is flat (constant), with a zero gradient there; NaN where either image holds a
    NaN or infinite pixel. The same for data scaled by any factor within the dtype's range.
    Float32 data are summed in float64 on the CPU and in float32 on GPUs and MPS
    (``_numerics.moment_dtype``): the sums there are of centered values (each image minus
    its own mean), whose squares and products add without cancellation, and the two-pass
    corrections remove the mean's rounding, so float32 stays within about 1e-6 of float64
    on microscopy-like data with a large offset (tests). Differentiable with respect to
    ``a`` and ``b``.
    """
    out_dtype, dtype = check_pair(a, b)
    dims = tuple(range(2, a.dim()))
    # No float64 on GPUs (1/32 to 1/64 of the float32 rate on most): every sum below is
    # of centered values, accurate in float32 (docs/maths.md §2.3).
    acc = moment_dtype(dtype, a.device)
    a, b = a.to(acc), b.to(acc)
    invalid = [nonfinite_mask(x) for x in (a, b)]
    a, b = (x if m is None else fill_nonfinite(x, m) for x, m in zip((a, b), invalid))
    # Scale-invariant: an exact power of two per image keeps the sums in range.
    a, b = a * power_of_two_scale(a, dims), b * power_of_two_scale(b, dims)
    a_c, a_energy, a_flat = centered_energy(a, dims)
    b_c, b_energy, b_flat = centered_energy(b, dims)
    count = a_c[0, 0].numel()
    # The means' round-off is removed from the cross term as from the energies.
    cross = (a_c * b_c).sum(dims, keepdim=True) - (
        a_c.sum(dims, keepdim=True) * b_c.sum(dims, keepdim=True) / count
    )
    flat = a_flat | b_flat
    score = torch.where(flat, torch.zeros_like(cross), cross / (a_energy * b_energy).sqrt())
    score = score.clamp(-1.0, 1.0)
    for m in invalid:
        if m is not None:
            score = score.masked_fill(
                m.flatten(2).any(-1)[(...,) + (None,) * len(dims)], float("nan")
            )
    return score.reshape(a.shape[0], a.shape[1]).to(out_dtype)
