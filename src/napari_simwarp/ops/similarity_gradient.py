"""Where a similarity loss wants each pixel to move: ``−∂loss/∂displacement``.

The registration loss of SPEC §6 compares ``fixed`` with ``warp(moving, d)``; its gradient
with respect to the dense displacement ``d`` is one vector per pixel, which looks at the
image content around each sample (SPEC §3). Drawn as a vector field it shows the direction
the optimiser would move each pixel in its next step.
"""

from __future__ import annotations

import torch

from ._validation import check_choice, check_image, check_same_device, check_same_shape, compute_dtype
from .local_ncc import local_ncc
from .splat import _check_displacement
from .ssim import ssim
from .warp import warp
from .zncc import ncc

__all__ = ["similarity_gradient", "METRICS"]

#: metric name -> the keyword arguments it accepts (passed on to the metric).
METRICS = {
    "lncc": ("window", "kernel", "sigma"),
    "ncc": (),
    "ssim": ("window", "sigma", "data_range", "k1", "k2"),
    "mse": (),
}


def similarity_gradient(fixed, moving, displacement, *, metric="lncc", **kw):
    """The negative gradient of a similarity loss with respect to the displacement.

    The loss compares ``fixed`` with ``warp(moving, displacement)`` (bilinear, "border"
    padding: ``warped(x) = moving(x + d(x))``), per image of the batch:

    - "lncc": ``1 − mean(local_ncc(fixed, warped, window, kernel=..., sigma=...))``
    - "ncc": ``1 − mean over channels of ncc(fixed, warped)`` (global ZNCC)
    - "ssim": ``1 − mean(ssim(fixed, warped, window=..., sigma=..., data_range=...))``
    - "mse": ``mean((warped − fixed)²)``

    and the result is ``−∂loss/∂d``: at each pixel, the direction (in pixels, array-axis
    order) in which moving that pixel's sample point lowers the loss fastest. Each image's
    field is the gradient of its own loss (the batch's losses are summed, not averaged,
    so images do not dilute each other); a shared displacement (batch 1) gets the sum
    over the batch.

    Parameters
    ----------
    fixed, moving : Tensor, shape ``(N, C, H, W)`` or ``(N, C, D, H, W)``
        Same shape and device; floating point (float16/bfloat16 are computed in float32).
    displacement : Tensor, shape ``(N or 1, len(S), *S)``
        In pixels, array-axis order, as ``warp`` takes it (zeros: "where should pixels
        go from the identity").
    metric : {"lncc", "ncc", "ssim", "mse"}
    **kw
        Passed to the metric: "lncc" takes ``window`` (default 9), ``kernel`` ("box" or
        "gaussian") and ``sigma``; "ssim" takes ``window``, ``sigma``, ``data_range``,
        ``k1``, ``k2``; "ncc" and "mse" take none.

    Returns
    -------
    Tensor, shape ``(N or 1, len(S), *S)`` like ``displacement``, in its dtype; detached
    (no graph is kept: this is for display and inspection, not for training).
    """
    check_image(fixed, "fixed")
    check_image(moving, "moving")
    check_same_shape(fixed, moving, "fixed", "moving")
    check_same_device(fixed, moving, "fixed", "moving")
    check_image(displacement, "displacement")
    _check_displacement(fixed, displacement, "fixed")
    check_choice(metric, "metric", tuple(METRICS))
    _check_metric_kwargs(metric, kw)

    dtype = compute_dtype(fixed.dtype)
    for t in (moving, displacement):
        dtype = torch.promote_types(dtype, compute_dtype(t.dtype))
    # Inputs are detached so that the call neither needs nor touches the caller's graph.
    fixed_c = fixed.detach().to(dtype)
    moving_c = moving.detach().to(dtype)
    with torch.enable_grad():
        d = displacement.detach().to(dtype).requires_grad_(True)
        warped = warp(moving_c, d)
        loss = _LOSSES[metric](fixed_c, warped, **kw)
        (grad,) = torch.autograd.grad(loss, d)
    return grad.neg_().to(displacement.dtype)


def _check_metric_kwargs(metric: str, kw: dict) -> None:
    """Raise a TypeError naming any keyword the chosen metric does not take."""
    unknown = sorted(set(kw) - set(METRICS[metric]))
    if unknown:
        accepted = ", ".join(METRICS[metric]) or "none"
        raise TypeError(
            f"similarity_gradient(metric={metric!r}) got unexpected keyword argument(s) "
            f"{', '.join(unknown)}; {metric!r} accepts: {accepted}"
        )


# Each loss is the sum over the batch of the per-image loss. The metrics' "mean" is over
# every image, channel and pixel, and every image has the same number of those, so
# N · mean is the sum of the per-image means.


def _lncc_loss(fixed, warped, window=9, kernel="box", sigma=None):
    """Σ_n (1 − mean_{C,S} local_ncc) for ``(N, C, *S)`` images; a scalar."""
    n = fixed.shape[0]
    return n * (1.0 - local_ncc(fixed, warped, window, kernel=kernel, sigma=sigma, reduction="mean"))


def _ncc_loss(fixed, warped):
    """Σ_n (1 − mean_C ncc) for ``(N, C, *S)`` images; ``ncc`` gives ``(N, C)``."""
    n = fixed.shape[0]
    return n * (1.0 - ncc(fixed, warped).mean())


def _ssim_loss(fixed, warped, **kw):
    """Σ_n (1 − mean_{C,S} ssim) for ``(N, C, *S)`` images; a scalar."""
    n = fixed.shape[0]
    return n * (1.0 - ssim(fixed, warped, reduction="mean", **kw))


def _mse_loss(fixed, warped):
    """Σ_n mean_{C,S} (warped − fixed)² for ``(N, C, *S)`` images; a scalar."""
    n = fixed.shape[0]
    return n * torch.mean((warped - fixed) ** 2)


_LOSSES = {"lncc": _lncc_loss, "ncc": _ncc_loss, "ssim": _ssim_loss, "mse": _mse_loss}
