"""Gaussian SSIM with the analytical backward of docs/maths.md §5.

The five Gaussian moments, the one-pass backward and the padding live in ``_moments``;
this module holds the per-pixel SSIM maths and its partials.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._moments import MomentMetric, check_moment_inputs, moment_map
from ._validation import check_positive, check_sigma
from ._windows import make_window


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
    metric = _SSIMMetric((k1 * data_range) ** 2, (k2 * data_range) ** 2)
    return moment_map(a, b, make_window("gaussian", sizes, sigmas), metric, reduction)
