"""Local standard deviation over a box window, with an analytical backward (docs/maths.md §1).

The image is centered on its per-(N, C) mean (detached) and padded, then the window sums
``S1``, ``S2`` and ``V = S2 - S1²/N`` are formed by the kernels or by their pure torch twins
(:mod:`._reference.local_std`): for float32 data in float64 on the CPU, and as compensated
float32 sums (about 48 bits) on GPUs and MPS, where float64 is slow or missing. Centering
is free accuracy: the variance is shift-invariant (the true gradient through the mean is
exactly zero), and without it ``S2 - S1²/N`` cancels catastrophically in float32 on data
with a large offset.
With the compiled kernels on the CPU, 2D calls go to one kernel that does the centering
and padding itself, reading the image in place. On CUDA, 2D float32 calls with windows of
at most 31 per axis go to a fused pair of tiled kernels (``csrc/cuda/local_std_fused.cu``:
padding and centering on load, the same compensated sums and flat rule as the unfused
kernels, one kernel per pass): :func:`fused_local_std`.
"""

from __future__ import annotations

import torch

from . import _kernels, _reference
from ._autograd import first_order_backward
from ._kernels import calls
from ._nonfinite import fill_nonfinite, nonfinite_mask, windows_seeing
from ._numerics import to_compute
from ._padding import PADDINGS, centered_pads, check_padding
from ._reference.local_std import center_and_pad
from ._validation import check_bool, check_choice, check_image, check_nonnegative, check_window

#: local_std's ``method`` choices.
METHODS = ("auto", "box", "fft")


def local_std(
    x: torch.Tensor,
    *,
    window,
    normalize: bool = True,
    method: str = "auto",
    padding: str = "reflect",
    eps: float = 1e-12,
) -> torch.Tensor:
    """Local standard deviation over an odd box window, differentiable.

    Parameters
    ----------
    x : Tensor, shape ``(N, C, H, W)`` or ``(N, C, D, H, W)``
        float16/bfloat16 (computed in float32), float32 or float64, any device.
    window : int or tuple of int
        Odd window size, one for all spatial axes or one per axis (array-axis order); no
        larger than the image.
    normalize : bool
        True (default): the standard deviation ``sqrt(max(S2 - S1²/N, 0) / N)``, as
        ``sqrt(uniform_filter(x²) - uniform_filter(x)²)``. False: the window energy
        ``sqrt(max(S2 - S1²/N, 0) + eps)``, the denominator of a ZNCC.
    method : {"auto", "box", "fft"}
        "box": separable running/prefix sums, O(1) per pixel; "fft": one batched FFT
        correlation (pure torch); "auto" is "box", which was faster than the FFT at every
        window and size measured (docs/benchmarks.md) and more accurate in float32. On
        GPUs and MPS "fft" transforms float32 data in float32: its round-off is global,
        so windows whose variance is below about ``1e-5`` of the image's count as flat and
        the others keep a relative error of about ``1e-6 · (image spread / window
        spread)²``; "box" keeps 1e-4 of float64 everywhere.
    padding : {"reflect", "mirror", "nearest", "constant"}
        Boundary handling with SciPy's names and meanings ("reflect" is
        ``uniform_filter``'s default; "constant" pads with zeros, "grid-constant" is
        accepted as its synonym).
    eps : float
        Added under the square root when ``normalize`` is False.

    Returns
    -------
    Tensor, shape of ``x``, dtype of ``x``. Windows whose variance is below the rounding
    level of the sums (flat regions) give 0 (``sqrt(eps)`` unnormalized) and a zero
    gradient. NaN exactly where the window (padding included) holds a NaN or infinite
    pixel of ``x``, as SciPy's filters give; finite everywhere else, on every backend.
    """
    check_image(x, "x")
    sizes = check_window(window, x.shape[2:], "window")
    check_choice(method, "method", METHODS)
    padding = check_padding(padding, PADDINGS)
    check_bool(normalize, "normalize")
    eps = check_nonnegative(eps, "eps")
    x_compute = to_compute(x)
    invalid = nonfinite_mask(x_compute)
    if invalid is not None:
        x_compute = fill_nonfinite(x_compute, invalid)
    if method == "fft":
        y = center_and_pad(x_compute, centered_pads(sizes), padding)
        out = _reference.local_std_valid(y, sizes, eps, normalize, method="fft")
    else:
        impl = _kernels.implementation("local_std", x_compute)
        if len(sizes) == 2 and x_compute.device.type == "cpu":
            # One fused kernel on the CPU reads the image in place: no centered, padded copy.
            out = impl.local_std_2d(x_compute, sizes, padding, eps, normalize)
        elif _fused_applies(x_compute, sizes, impl):
            out = fused_local_std(x_compute, sizes, padding, eps, normalize)
        else:
            y = center_and_pad(x_compute, centered_pads(sizes), padding)
            out = impl.local_std_valid(y, sizes, eps, normalize)
    if invalid is not None:
        out = out.masked_fill(windows_seeing(invalid, sizes, padding), float("nan"))
    return out.to(x.dtype)


def _fused_applies(x: torch.Tensor, sizes, impl) -> bool:
    """Whether the fused 2-D CUDA kernels run this call: float32 CUDA images, a window they
    take, the compiled local_std chosen there (built, self-checked) and its fused ops loaded."""
    return (
        x.device.type == "cuda"
        and x.dtype == torch.float32
        and len(sizes) == 2
        and max(sizes) <= calls.LOCAL_STD_MAX_WINDOW
        and impl is calls
        and hasattr(torch.ops.simwarp, "local_std_fused_fwd")
    )


class _FusedLocalStd(torch.autograd.Function):
    """``x (..., H, W) -> local std`` through the fused kernels, each image centred on its
    detached mean (as ``center_and_pad``): the shift-invariant result has no gradient
    through it."""

    @staticmethod
    def forward(ctx, x, sizes, padding, eps, normalize, flat_factor, library):
        shift = x.detach().mean((-2, -1)).reshape(-1)
        out, s1, flat = calls.local_std_fused_fwd(
            x, shift, sizes, padding, eps, normalize, flat_factor, library
        )
        ctx.args = (sizes, padding, normalize, library)
        ctx.save_for_backward(x, shift, out, s1, flat)
        return out

    @staticmethod
    @first_order_backward("local_std")
    def backward(ctx, grad):
        x, shift, out, s1, flat = ctx.saved_tensors
        sizes, padding, normalize, library = ctx.args
        dx = calls.local_std_fused_bwd(
            grad.contiguous(), out, s1, flat, x, shift, sizes, padding, normalize, library
        )
        return dx, *(None,) * 6


def fused_local_std(
    x: torch.Tensor,
    sizes,
    padding: str,
    eps: float,
    normalize: bool,
    flat_factor: float | None = None,
    library=None,
) -> torch.Tensor:
    """:func:`local_std` of finite float32 ``x (..., H, W)`` through the fused 2-D kernels.

    ``sizes`` two odd window sizes (at most 31, at most the axis), ``padding`` one of
    SciPy's names. ``flat_factor`` defaults to the compensated float32 sums' rule
    (``calls.COMPENSATED_FLOAT32_FLAT_FACTOR``, as the unfused CUDA kernels use).
    ``library`` is ``torch.ops.simwarp`` (default, CUDA tensors) or
    ``torch.ops.simwarp_host_shim`` (tests, CPU tensors). Returns ``x``'s shape.
    """
    if flat_factor is None:
        flat_factor = calls.COMPENSATED_FLOAT32_FLAT_FACTOR
    sizes = [int(k) for k in sizes]
    return _FusedLocalStd.apply(
        x.contiguous(), sizes, padding, float(eps), bool(normalize), float(flat_factor), library
    )
