"""Gaussian SSIM with the analytical backward of docs/maths.md §5.

The five Gaussian moments, the one-pass backward and the padding live in ``_moments``;
this module holds the per-pixel SSIM maths and its partials.

On CUDA, float32 (and half) 2-D images with windows of at most 31 taps per axis take the
fused kernels instead (``csrc/cuda/ssim.cu``: one forward and one backward kernel, tiles
with their halos in shared memory, the reflection applied to the index, each tile centred
on its own mean, risky windows redone two-pass in float32): :func:`fused_ssim`. 3-D
images, float64 data, wider windows and every other device keep the ``_moments`` path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import _kernels
from ._autograd import first_order_backward, fused_pair_backward, fused_pair_forward
from ._kernels import calls
from ._moments import MomentMetric, check_moment_inputs, moment_map
from ._nonfinite import fill_nonfinite, nonfinite_mask, windows_seeing
from ._numerics import compute_dtype, moment_dtype
from ._validation import check_positive, check_sigma
from ._windows import Window, make_window


class _SSIMMetric(MomentMetric):
    """SSIM of the Gaussian moments, docs/maths.md §5.1 notation, ``r = 1/(B1 B2)``.

    With the plain moments ``U = (μx, μy, G⋆x², G⋆y², G⋆xy)`` the partials are

        ∂S/∂(G⋆x²) = ∂S/∂(G⋆y²) = ∂S/∂σ² = -S/B2          one shared map (slot 2)
        ∂S/∂(G⋆xy) = ∂S/∂σxy = 2 A1 r                     (slot 3)
        ∂S/∂μx (total) = 2 r [μy (A2 - A1) + μx S (B1 - B2)]    (slot 0; swapped: slot 1)

    and slots 0, 1 are then converted to the centered moments the engine uses (see
    ``_moments``): ``∂S/∂M_x = ∂S/∂μx + 2 m_x ∂S/∂σ² + m_y ∂S/∂σxy``. Slot 2 stores
    ``+S/B2``, so its coefficient is ``-2``. Sharing the σ² map saves one of five adjoint
    passes.
    """

    name = "ssim"
    slots = (0, 1, 2, 2, 3)
    coefficients = (-2.0, 1.0)

    def __init__(self, c1: float, c2: float):
        self.c1, self.c2 = c1, c2
        self.variance_floor = c2 / 2.0  # the denominator is σx² + σy² + C2

    def pointwise(self, moments, shifts, total, need_partials):
        mx, my, mxx, myy, mxy = moments  # centered: mx = G⋆(x - m_x), ...
        shift_x, shift_y = shifts
        # 0-dim constants let addcmul/add start from a constant in one pass.
        c1 = mx.new_tensor(self.c1)
        c2 = mx.new_tensor(self.c2)
        # Contrast-structure terms from the centered moments (accurate in float32).
        a2 = torch.add(c2, mxy, alpha=2.0).addcmul_(mx, my, value=-2.0)  # 2 σxy + C2
        squares = torch.addcmul(-c2, mx, mx).addcmul_(my, my)
        b2 = mxx.add_(myy).sub_(squares)  # σx² + σy² + C2
        # Luminance terms from the plain local means.
        mux, muy = mx.add_(shift_x), my.add_(shift_y)
        a1 = torch.addcmul(c1, mux, muy, value=2.0)  # 2 μx μy + C1
        b1 = torch.addcmul(c1, mux, mux, out=squares).addcmul_(muy, muy)  # μx² + μy² + C1
        den = torch.mul(b1, b2)
        ssim_map = torch.mul(a1, a2).div_(den)
        if not need_partials:
            return ssim_map, None

        partials = mx.new_empty((4, *mx.shape))
        p_mux, p_muy, p_var, p_cov = partials
        r2 = torch.div(mx.new_tensor(2.0), den, out=den)  # 2 / (B1 B2), in place
        torch.div(ssim_map, b2, out=p_var)  # S / B2 = -∂S/∂σ²
        torch.mul(a1, r2, out=p_cov)  # 2 A1 / (B1 B2) = ∂S/∂σxy
        d = a2.sub_(a1)  # A2 - A1
        e = b1.sub_(b2).mul_(ssim_map)  # S (B1 - B2)
        torch.mul(muy, d, out=p_mux).addcmul_(mux, e).mul_(r2)
        torch.mul(mux, d, out=p_muy).addcmul_(muy, e).mul_(r2)
        # To centered moments (p_var holds -∂S/∂σ², hence -2).
        p_mux.addcmul_(shift_x, p_var, value=-2.0).addcmul_(shift_y, p_cov)
        p_muy.addcmul_(shift_y, p_var, value=-2.0).addcmul_(shift_x, p_cov)
        return ssim_map, partials


def ssim(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    window: int | Sequence[int] = 11,
    sigma: float | Sequence[float] = 1.5,
    data_range: float = 1.0,
    k1: float = 0.01,
    k2: float = 0.03,
    reduction: str = "none",
) -> torch.Tensor:
    """Structural similarity with a Gaussian window (Wang et al. 2004), differentiable.

    Per pixel, with ``G`` the normalized Gaussian window (``window`` taps of standard
    deviation ``sigma`` per axis), ``C1 = (k1·data_range)²``, ``C2 = (k2·data_range)²``:

        S = (2 μa μb + C1)(2 σab + C2) / ((μa² + μb² + C1)(σa² + σb² + C2))

    with population (co)variances. Images are padded with SciPy's "reflect"
    (half-sample symmetric), as ``skimage.metrics.structural_similarity(...,
    gaussian_weights=True, use_sample_covariance=False, full=True)`` does, so the map
    matches scikit-image's everywhere, borders included.

    The backward is analytical (docs/maths.md §5.2): the forward saves the partial maps and the
    gradient costs one more separable Gaussian pass; no autograd through the filters.

    Parameters
    ----------
    a, b : Tensor, shape ``(N, C, H, W)`` or ``(N, C, D, H, W)``
        Same shape and device; floating point (float16/bfloat16 are computed in float32).
        Each (N, C) slice is one image.
    window : int or tuple of int
        Odd window size, one for all axes or one per spatial axis; at most the image size.
    sigma : float or tuple of float
        Gaussian standard deviation in pixels, one for all axes or one per axis.
    data_range : float
        Range of the data (1 for images in [0, 1], 255 for 8-bit), sets ``C1`` and ``C2``.
    k1, k2 : float
        Positive stabilizing constants (positive, so constant images give finite values).
    reduction : {"none", "mean"}
        "none" (default): the per-pixel map. "mean": one scalar, the mean of the map over
        every pixel of every image and channel (borders included, unlike
        scikit-image's ``mssim`` which crops them); for one value per image use
        ``reduction="none"`` and ``.mean((2, 3))``, or :class:`SSIMLoss`.

    Returns
    -------
    Tensor, shape ``(N, C, *S)`` ("none") or ``()`` ("mean"), in the (promoted) input dtype.
    """
    sizes = check_moment_inputs(a, b, window, reduction)
    sigmas = check_sigma(sigma, len(sizes))
    data_range = check_positive(data_range, "data_range")
    k1 = check_positive(k1, "k1")
    k2 = check_positive(k2, "k2")
    c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
    window = make_window("gaussian", sizes, sigmas)
    if _fused_applies(a, b, window):
        return fused_ssim(a, b, window, c1, c2, reduction)
    return moment_map(a, b, window, _SSIMMetric(c1, c2), reduction)


def _fused_applies(a: torch.Tensor, b: torch.Tensor, window: Window) -> bool:
    """Whether :func:`ssim` runs the fused kernels on these (validated) inputs: CUDA, 2-D,
    float32 sums (the device's policy), a window they take, the compiled ssim chosen there
    (built and self-checked, ``_kernels.implementation``) and its fused ops loaded."""
    if a.device.type != "cuda" or a.dim() != 4 or max(window.sizes) > calls.SSIM_MAX_TAPS:
        return False
    dtype = compute_dtype(torch.promote_types(a.dtype, b.dtype))
    if dtype != torch.float32 or moment_dtype(dtype, a.device) != torch.float32:
        return False
    if _kernels.implementation("ssim", a) is not calls:
        return False
    return hasattr(torch.ops.simwarp, "ssim_fwd")


class _FusedSSIM(torch.autograd.Function):
    """``(a, b) -> SSIM map`` (or its mean) through the fused kernels; float32 ``(N, C, H,
    W)`` contiguous inputs. The backward is one kernel: the forward's partial maps and tile
    shifts, the window's adjoint with the reflection folded into its taps."""

    @staticmethod
    def forward(ctx, a, b, taps, c1: float, c2: float, reduction: str, library):
        params = (c1, c2)
        return fused_pair_forward(ctx, calls.ssim_fwd, a, b, taps, params, reduction, library)

    @staticmethod
    @first_order_backward("ssim")
    def backward(ctx, grad_out):
        return *fused_pair_backward(ctx, calls.ssim_bwd, grad_out), *(None,) * 5


def fused_ssim(
    a: torch.Tensor,
    b: torch.Tensor,
    window: Window,
    c1: float,
    c2: float,
    reduction: str,
    library=None,
) -> torch.Tensor:
    """:func:`ssim` through the fused 2-D kernels (``csrc/cuda/ssim.cu``), in float32.

    ``a``, ``b`` ``(N, C, H, W)`` validated, ``window`` Gaussian, 2-D, at most 31 taps per
    axis. Non-finite pixels as :func:`~._moments.moment_map`: NaN exactly where a window
    (through the reflected border) sees one. ``library`` is ``torch.ops.simwarp`` (default,
    CUDA tensors) or ``torch.ops.simwarp_host_shim`` (the same kernels as host code on CPU
    tensors, tests/csrc/test_host_shim.py). Returns ``(N, C, H, W)`` or ``()`` in the
    promoted input dtype.
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
    invalid = (
        invalid_a
        if invalid_b is None
        else (invalid_b if invalid_a is None else invalid_a | invalid_b)
    )
    if invalid is None:
        return _FusedSSIM.apply(a32, b32, taps, c1, c2, reduction, library).to(out_dtype)
    out = _FusedSSIM.apply(a32, b32, taps, c1, c2, "none", library)
    out = out.masked_fill(windows_seeing(invalid, window.sizes, "reflect"), float("nan"))
    return (out.mean() if reduction == "mean" else out).to(out_dtype)
