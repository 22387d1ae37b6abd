"""Where a similarity loss wants each pixel to move: ``−∂loss/∂displacement``.

The registration loss of docs/maths.md §6 compares ``fixed`` with ``warp(moving, d)``; its gradient
with respect to the dense displacement ``d`` is one vector per pixel, which looks at the
image content around each sample (docs/maths.md §3). Drawn as a vector field it shows the direction
the optimizer would move each pixel in its next step.
"""

from __future__ import annotations

import torch

from ._numerics import compute_dtype
from ._validation import check_displacement, check_pair
from .losses import loss_for
from .warp import warp

__all__ = ["similarity_gradient"]


def similarity_gradient(fixed, moving, displacement, *, metric="lncc", **kw):
    """The negative gradient of a similarity loss with respect to the displacement.

    The loss compares ``fixed`` with ``warp(moving, displacement)`` (bilinear, "nearest"
    padding: ``warped(x) = moving(x + d(x))``), per image of the batch (the losses of
    :mod:`~napari_simwarp.ops.losses`):

    - "lncc": ``1 − mean(local_ncc(fixed, warped, window, kernel=..., sigma=...))``
    - "ncc": ``1 − mean over channels of ncc(fixed, warped)`` (global ZNCC)
    - "ssim": ``1 − mean(ssim(fixed, warped, window=..., sigma=..., data_range=...))``
    - "mse": ``mean((warped − fixed)²)``
    - "mi": ``2 − NMI(fixed, warped)`` (normalized mutual information, Parzen-window joint
      histogram; ``normalize=False``: ``−MI`` in nats), for multimodal pairs

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
    metric : {"lncc", "ncc", "ssim", "mse", "mi"}
    **kw
        Passed to the metric: "lncc" takes ``window`` (default 9), ``kernel`` ("box" or
        "gaussian") and ``sigma``; "ssim" takes ``window``, ``sigma``, ``data_range``,
        ``k1``, ``k2``; "mi" takes ``bins`` (default 32), ``kernel`` ("bspline" or
        "gaussian"), ``sigma`` and ``normalize``; "ncc" and "mse" take none.

    Returns
    -------
    Tensor, shape ``(N or 1, len(S), *S)`` like ``displacement``, in its dtype; detached
    (no graph is kept: this is for display and inspection, not for training).
    """
    check_pair(fixed, moving, "fixed", "moving")
    check_displacement(
        displacement, tuple(fixed.shape[2:]), like=fixed, like_name="fixed", batch=fixed.shape[0]
    )
    # Each image's field is the gradient of its own loss: the losses are summed.
    loss_fn = loss_for(metric, reduction="sum", caller="similarity_gradient", **kw)

    dtype = compute_dtype(fixed.dtype)
    for t in (moving, displacement):
        dtype = torch.promote_types(dtype, compute_dtype(t.dtype))
    # Inputs are detached so that the call neither needs nor touches the caller's graph.
    fixed_c = fixed.detach().to(dtype)
    moving_c = moving.detach().to(dtype)
    with torch.enable_grad():
        d = displacement.detach().to(dtype).requires_grad_(True)
        warped = warp(moving_c, d)
        loss = loss_fn(fixed_c, warped)
        (grad,) = torch.autograd.grad(loss, d)
    return grad.neg_().to(displacement.dtype)
