"""Windowed zero-normalized cross-correlation (local NCC) of two images (docs/maths.md §2.2).

The five windowed moments, the one-pass backward and the padding live in ``_moments``;
this module holds the per-pixel NCC maths and its partials. float32 2-D images and 3-D
volumes on CUDA with windows of at most 25 taps per axis take the fused kernels instead
(``csrc/cuda/local_ncc.cu``: one forward and one backward kernel, tiles with their halos
in shared memory, the reflection applied to the index, each tile centered on its own
mean, risky windows redone two-pass in float32): :func:`fused_local_ncc`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import _kernels
from ._autograd import first_order_backward, fused_pair_backward, fused_pair_forward
from ._kernels import calls
from ._moments import MomentMetric, check_moment_inputs, moment_map
from ._nonfinite import fill_nonfinite, nonfinite_mask, power_of_two_scale, windows_seeing
from ._numerics import compute_dtype, flat_threshold_factor, moment_dtype
from ._validation import check_choice, check_sigma
from ._windows import KERNELS, Window, make_window


class _LocalNCCMetric(MomentMetric):
    """``ρ = C / sqrt(Va Vb)`` from the moments ``(Σa, Σb, Σa², Σb², Σab)``, window weight ``n``.

    ``Va = Σa² - (Σa)²/n``, ``Vb`` likewise, ``C = Σab - Σa Σb / n``. With ``r = (Va Vb)^-½``:

        ∂ρ/∂Σab = r                                   (slot 4)
        ∂ρ/∂Σa² = -ρ / (2 Va)                        (slot 2 stores ρ/Va: coefficient -1)
        ∂ρ/∂Σa  = (ρ Σa / Va - r Σb) / n              (slot 0; b likewise in slots 1, 3)

    Flat windows (``Va`` or ``Vb`` within rounding of 0) get ``ρ = 0`` and zero partials:
    their variances are set to +inf, which makes every ``1/V`` and so everything else 0.
    """

    name = "local_ncc"
    coefficients = (-1.0, 1.0)

    def pointwise(self, moments, shifts, total, need_partials):
        # Shift-invariant: the centered moments are all it needs.
        sa, sb, saa, sbb, sab = moments
        inv_n = 1.0 / total
        va = torch.addcmul(saa, sa, sa, value=-inv_n)
        vb = torch.addcmul(sbb, sb, sb, value=-inv_n)
        cov = sab.addcmul_(sa, sb, value=-inv_n)
        tol = flat_threshold_factor(sa.dtype)
        flat = va <= saa.mul_(tol)
        flat |= vb <= sbb.mul_(tol)
        inv_va = va.masked_fill_(flat, float("inf")).reciprocal_()
        inv_vb = vb.masked_fill_(flat, float("inf")).reciprocal_()
        partials = sa.new_empty((5, *sa.shape)) if need_partials else None
        r = torch.mul(inv_va, inv_vb, out=partials[4] if need_partials else None).sqrt_()
        rho = cov.mul_(r)
        if need_partials:
            zero = sa.new_zeros(())
            torch.mul(rho, inv_va, out=partials[2])
            torch.mul(rho, inv_vb, out=partials[3])
            # 0-dim start: addcmul scales the product by 1/n in the same pass.
            torch.addcmul(zero, sa, partials[2], value=inv_n, out=partials[0])
            partials[0].addcmul_(r, sb, value=-inv_n)
            torch.addcmul(zero, sb, partials[3], value=inv_n, out=partials[1])
            partials[1].addcmul_(r, sa, value=-inv_n)
        # Rounding can put |ρ| a few ulps past 1; the partials keep the unclamped maths.
        return rho.clamp_(-1.0, 1.0), partials


def local_ncc(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    window: int | Sequence[int] = 9,
    kernel: str = "box",
    sigma: float | Sequence[float] | None = None,
    reduction: str = "none",
) -> torch.Tensor:
    """Local (windowed) zero-normalized cross-correlation of two images, in [-1, 1].

    Per pixel, over the window ``w`` centered on it (docs/maths.md §2.2):

        ρ = Σ w (a - ā)(b - b̄) / sqrt(Σ w (a - ā)² · Σ w (b - b̄)²)

    with ``ā``, ``b̄`` the window's weighted means. ``ρ = 0`` where either image is flat
    over the window (constant images give 0, and zero gradient, never NaN). Images are
    padded with SciPy's "reflect" (half-sample symmetric), as
    ``scipy.ndimage.uniform_filter`` does. Differentiable in ``a`` and ``b`` with an
    analytical backward (one more window pass).

    Parameters
    ----------
    a, b : Tensor, shape ``(N, C, H, W)`` or ``(N, C, D, H, W)``
        Same shape and device; floating point (float16/bfloat16 are computed in float32).
    window : int or tuple of int
        Odd window size, one for all axes or one per spatial axis; at most the image size.
    kernel : {"box", "gaussian"}
        Uniform weights, or a normalized Gaussian truncated to the window.
    sigma : float or tuple of float, optional
        The Gaussian's standard deviation (``kernel="gaussian"`` only); default
        ``(window - 1) / 6`` per axis, so the window spans ±3σ.
    reduction : {"none", "mean"}
        "none": the per-pixel map. "mean": one scalar, the mean over every pixel of every
        image and channel (``1 - local_ncc(..., reduction="mean")`` is a registration loss).

    Returns
    -------
    Tensor, shape ``(N, C, *S)`` ("none") or ``()`` ("mean"), in the (promoted) input dtype.
    """
    sizes = check_moment_inputs(a, b, window, reduction)
    check_choice(kernel, "kernel", KERNELS)
    if kernel == "gaussian":
        sigmas = (
            check_sigma(sigma, len(sizes))
            if sigma is not None
            else tuple(max(k - 1, 1) / 6.0 for k in sizes)
        )
    elif sigma is not None:
        raise ValueError(f"sigma is only used with kernel='gaussian', got kernel={kernel!r}")
    else:
        sigmas = None
    # Scale-invariant: each image is brought into [-1, 1] by an exact power of two, so
    # that data near 1e-30 or 1e30 is as well computed as data near 1 (also in float32).
    dims = tuple(range(2, a.dim()))
    a, b = a * power_of_two_scale(a, dims), b * power_of_two_scale(b, dims)
    win = make_window(kernel, sizes, sigmas)
    if _fused_applies(a, b, win):
        return fused_local_ncc(a, b, win, reduction)
    return moment_map(a, b, win, _LocalNCCMetric(), reduction)


def _fused_applies(a: torch.Tensor, b: torch.Tensor, window: Window) -> bool:
    """Whether :func:`local_ncc` runs the fused kernels on these (validated) inputs: CUDA,
    float32 sums (the device's policy), a window they take, the compiled local_ncc chosen
    there (built and self-checked, ``_kernels.implementation``) and its fused ops loaded."""
    if a.device.type != "cuda" or max(window.sizes) > calls.LOCAL_NCC_MAX_TAPS:
        return False
    dtype = compute_dtype(torch.promote_types(a.dtype, b.dtype))
    if dtype != torch.float32 or moment_dtype(dtype, a.device) != torch.float32:
        return False
    if _kernels.implementation("local_ncc", a) is not calls:
        return False
    return hasattr(torch.ops.simwarp, "local_ncc_fwd")


class _FusedLocalNCC(torch.autograd.Function):
    """``(a, b) -> local NCC map`` (or its mean) through the fused kernels; float32 ``(N, C,
    *S)`` contiguous inputs. The backward is one kernel: the forward's partial maps and tile
    shifts, the window's adjoint with the reflection folded into its taps."""

    @staticmethod
    def forward(ctx, a, b, taps, inv_total: float, reduction: str, library):
        flat = flat_threshold_factor(torch.float32)
        params = (inv_total, flat)
        return fused_pair_forward(ctx, calls.local_ncc_fwd, a, b, taps, params, reduction, library)

    @staticmethod
    @first_order_backward("local_ncc")
    def backward(ctx, grad_out):
        return *fused_pair_backward(ctx, calls.local_ncc_bwd, grad_out), *(None,) * 4


def fused_local_ncc(
    a: torch.Tensor, b: torch.Tensor, window: Window, reduction: str, library=None
) -> torch.Tensor:
    """:func:`local_ncc` through the fused kernels (``csrc/cuda/local_ncc.cu``), in float32.

    ``a``, ``b`` ``(N, C, H, W)`` or ``(N, C, D, H, W)`` validated (and scaled), ``window``
    with one axis per spatial axis, at most 25 taps each. Non-finite pixels as
    :func:`~._moments.moment_map`: NaN exactly where a window (through the reflected border)
    sees one. ``library`` is ``torch.ops.simwarp`` (default, CUDA tensors) or
    ``torch.ops.simwarp_host_shim`` (the same kernels as host code on CPU tensors,
    tests/csrc/test_host_shim.py). Returns ``(N, C, *S)`` or ``()`` in the promoted input
    dtype.
    """
    out_dtype = torch.promote_types(a.dtype, b.dtype)
    invalid_a, invalid_b = nonfinite_mask(a), nonfinite_mask(b)
    if invalid_a is not None:
        a = fill_nonfinite(a, invalid_a)
    if invalid_b is not None:
        b = fill_nonfinite(b, invalid_b)
    a32 = a.to(torch.float32).contiguous()
    b32 = b.to(torch.float32).contiguous()
    taps = [tuple(t) for t in window.taps]
    inv_total = 1.0 / window.total
    invalid = (
        invalid_a
        if invalid_b is None
        else (invalid_b if invalid_a is None else invalid_a | invalid_b)
    )
    if invalid is None:
        return _FusedLocalNCC.apply(a32, b32, taps, inv_total, reduction, library).to(out_dtype)
    out = _FusedLocalNCC.apply(a32, b32, taps, inv_total, "none", library)
    out = out.masked_fill(windows_seeing(invalid, window.sizes, "reflect"), float("nan"))
    return (out.mean() if reduction == "mean" else out).to(out_dtype)
