"""Batched FFT cross-correlation of a stack against a shared (or broadcast) kernel."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._numerics import compute_dtype
from ._validation import check_choice, check_image, check_kernel_like, check_same_device

FFT_MODES = ("same", "valid")


def next_fast_len(n: int) -> int:
    """Smallest ``m >= n`` whose only prime factors are 2, 3, 5 and 7 (fast FFT sizes)."""
    m = max(int(n), 1)
    while True:
        r = m
        for p in (2, 3, 5, 7):
            while r % p == 0:
                r //= p
        if r == 1:
            return m
        m += 1


def fft_cc(x: torch.Tensor, kernel: torch.Tensor, mode: str = "same") -> torch.Tensor:
    """Cross-correlate every image of a stack with one kernel, through the FFT.

    ``out[i] = Σ_j kernel[j] · x[i + j - c]`` (no kernel flip), as
    ``scipy.ndimage.correlate(x, kernel, mode="constant")`` computes it.

    Parameters
    ----------
    x : Tensor, shape ``(N, C, *S)`` with ``len(S)`` 2 or 3
        Floating point; float16/bfloat16 are computed in float32.
    kernel : Tensor, shape ``(*K)`` or ``(N or 1, C or 1, *K)``
        One kernel shared by the whole stack, or one per image/channel (broadcast).
        ``len(K) == len(S)``.
    mode : {"same", "valid"}
        "same": output shape ``S``, the kernel centered at ``c = K // 2`` (SciPy's center,
        also for even sizes), zeros outside ``x``. "valid": output shape ``S - K + 1``,
        only positions where the kernel lies inside ``x`` (needs ``K <= S``).

    Returns
    -------
    Tensor, shape ``(N, C, *S)`` ("same") or ``(N, C, *(S - K + 1))`` ("valid"),
    in ``x``'s dtype. Differentiable with respect to ``x`` and ``kernel``. Inputs are
    scaled by powers of two before the transforms, so values near the type's maximum do
    not overflow them (an output beyond the type's range is ±inf).
    """
    check_image(x, "x")
    check_choice(mode, "mode", FFT_MODES)
    if not isinstance(kernel, torch.Tensor):
        raise TypeError(f"kernel must be a torch.Tensor, got {type(kernel).__name__}")
    check_image(kernel, "kernel", ndim=(x.dim() - 2, x.dim()))
    check_same_device(x, kernel, "x", "kernel")
    d = x.dim() - 2
    spatial = tuple(x.shape[2:])
    ksize = tuple(kernel.shape[-d:])
    if kernel.dim() == x.dim():
        check_kernel_like(kernel, x, "kernel", "x", fits=False)
    if mode == "valid" and any(k > n for k, n in zip(ksize, spatial)):
        raise ValueError(
            f"kernel spatial shape {ksize} is larger than x's {spatial}; mode='valid' needs "
            "a kernel that fits"
        )

    dtype = torch.promote_types(compute_dtype(x.dtype), compute_dtype(kernel.dtype))
    # The FFT sums every value of its input: an image near its type's largest value (a
    # bfloat16 or float32 one near 3.4e38) overflows the transform to inf and the output
    # to NaN. Scaled below 2 by a power of two (exact: no value is rounded), the
    # transforms stay in range; the correlation, bilinear, is scaled back at the end.
    x_scale, k_scale = _power_of_two_scale(x, dtype), _power_of_two_scale(kernel, dtype)
    xc, kc = x.to(dtype) / x_scale, kernel.to(dtype) / k_scale
    if mode == "valid":
        # Circular correlation of length L >= S equals the linear one at i in [0, S - K].
        sizes = [next_fast_len(n) for n in spatial]
        out_shape = [n - k + 1 for n, k in zip(spatial, ksize)]
        shifts = [0] * d
    else:
        # The kernel sits with its center at index 0 (wrapped), and L >= S + K - 1 keeps
        # the zero padding from wrapping into the output.
        sizes = [next_fast_len(n + k - 1) for n, k in zip(spatial, ksize)]
        out_shape = list(spatial)
        shifts = [-(k // 2) for k in ksize]
    dims = tuple(range(-d, 0))
    pad = []
    for k, size in zip(reversed(ksize), reversed(sizes)):
        pad += [0, size - k]
    kbuf = F.pad(kc, pad)
    if any(shifts):
        kbuf = torch.roll(kbuf, shifts=shifts, dims=dims)
    spectrum = torch.fft.rfftn(xc, s=sizes, dim=dims) * torch.fft.rfftn(kbuf, dim=dims).conj()
    full = torch.fft.irfftn(spectrum, s=sizes, dim=dims)
    out = full[(..., *[slice(0, n) for n in out_shape])] * (x_scale * k_scale)
    return out.to(x.dtype)


def _power_of_two_scale(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A power of two in ``(max |t| / 2, max |t|]`` (a 0-d tensor of ``dtype``; 1 for a
    zero or non-finite ``t``), held constant for autograd: dividing by it is exact."""
    with torch.no_grad():
        peak = t.detach().abs().amax().to(dtype)
        scale = torch.exp2(torch.floor(torch.log2(peak)))  # ceil could pass the max
        usable = torch.isfinite(scale) & (scale > 0)
        return torch.where(usable, scale, torch.ones_like(scale))
