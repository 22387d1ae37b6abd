"""Local standard deviation over a box window, with an analytical backward (docs/maths.md §1).

The image is centered on its per-(N, C) mean (detached) and padded, then the window sums
``S1``, ``S2`` and ``V = S2 - S1²/N`` are formed by the kernels or by their pure torch twins
(:mod:`._reference.local_std`): for float32 data in float64 on the CPU, and as compensated
float32 sums (about 48 bits) on GPUs and MPS, where float64 is slow or missing. Centering
is free accuracy: the variance is shift-invariant (the true gradient through the mean is
exactly zero), and without it ``S2 - S1²/N`` cancels catastrophically in float32 on data
with a large offset.
With the compiled kernels on the CPU, 2D calls go to one kernel that does the centering
and padding itself, reading the image in place.
"""

from __future__ import annotations

import torch

from . import _kernels, _reference
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
        else:
            y = center_and_pad(x_compute, centered_pads(sizes), padding)
            out = impl.local_std_valid(y, sizes, eps, normalize)
    if invalid is not None:
        out = out.masked_fill(windows_seeing(invalid, sizes, padding), float("nan"))
    return out.to(x.dtype)
