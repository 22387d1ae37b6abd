"""One rule for NaN and infinite pixels, and exact rescaling for scale-invariant metrics.

The rule (docs/maths.md §1.3), the same on every backend: a result is NaN exactly where
its window contains a non-finite input pixel (as SciPy's filters give), and finite
everywhere else. The non-finite pixels are replaced by the mean of the finite ones before
the sums, so that one of them cannot spread through a running sum or an FFT, and the
windows that saw one are set to NaN afterwards; gradients flow to the finite pixels only.
Clean inputs pay one fast reduction (a sum) to find out that they are clean.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._padding import centered_pads, pad_spatial
from ._reference.window_sums import box_sum_valid


def nonfinite_mask(x: torch.Tensor) -> torch.Tensor | None:
    """The bool mask of ``x``'s NaN and infinite values, or None when there are none.

    A finite sum proves every value finite (one fast reduction); only a non-finite sum
    (or one that overflowed) pays for the elementwise test.
    """
    if bool(torch.isfinite(x.detach().sum())):
        return None
    mask = ~torch.isfinite(x.detach())
    return mask if bool(mask.any()) else None


def fill_nonfinite(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` ``(N, C, *S)`` with its non-finite values replaced by the mean of the finite
    values of the same image and channel (0 where there is none); differentiable with
    respect to the finite values (the fill is a constant)."""
    dims = tuple(range(2, x.dim()))
    finite = (~mask).to(x.dtype)
    values = torch.where(mask, torch.zeros_like(x), x).detach()
    mean = values.sum(dims, keepdim=True) / finite.sum(dims, keepdim=True).clamp_min(1.0)
    return torch.where(mask, mean.expand_as(x), x)


def windows_seeing(mask: torch.Tensor, window: Sequence[int], padding: str | None) -> torch.Tensor:
    """Where a window of ``window`` sizes holds a masked pixel: ``(N, C, *S_out)`` bool.

    ``padding``: the operator's padding (``"reflect"``, ``"mirror"``, ``"nearest"`` or
    ``"constant"``), so that a pixel seen again through a reflected border counts, and the
    output is ``S``; None for valid mode (output ``S - k + 1``).
    """
    m = mask.to(torch.float32)
    if padding is not None:
        m = pad_spatial(m, centered_pads(window), mode=padding)
    return box_sum_valid(m, window) > 0.5


def power_of_two_scale(x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    """Per image and channel, ``2**-e`` with ``2**(e-1) <= max |x| < 2**e`` (1 where ``x``
    is 0): multiplying by it is exact and brings the values into ``[-1, 1]``, so that a
    scale-invariant metric is computed the same for data near 1e-30 and near 1e30."""
    peak = x.detach().abs().amax(dim=tuple(dims), keepdim=True)
    _, exponent = torch.frexp(peak)
    # Clamped so that the scale itself is a normal number in float32 (subnormal data only
    # gets as close to 1 as that allows).
    scale = torch.ldexp(torch.ones_like(peak), -exponent.clamp(-120, 120))
    return torch.where(peak > 0, scale, torch.ones_like(peak))
