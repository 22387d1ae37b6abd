"""ZNCC template matching, with ``skimage.feature.match_template``'s conventions.

docs/maths.md §2.1: output shape, ``pad_input``, zero-padding of the image and 0 where the
window or the template is flat follow scikit-image, so that results can be checked
against it. The numerator is one FFT correlation (``fft_cc``) with the centered template,
the denominator the window energy of §1 (``local_std``'s kernels or their torch twins)
times the template's norm. Differentiable with respect to the image and the template.
"""

from __future__ import annotations

import torch

from . import _kernels
from ._numerics import accumulate_dtype, compute_dtype
from ._padding import pad_spatial
from ._validation import check_bool, check_image, check_kernel_like, check_same_device
from .fft_cc import fft_cc
from .ncc import centered_energy


def _check_template(image: torch.Tensor, template: torch.Tensor) -> None:
    if template.dim() != image.dim():
        raise ValueError(
            f"template must have as many dimensions as image ({image.dim()}: (N or 1, C or 1, "
            f"*spatial)), got shape {tuple(template.shape)} for image shape "
            f"{tuple(image.shape)}"
        )
    check_kernel_like(template, image, "template", "image")


def match_template(
    image: torch.Tensor, template: torch.Tensor, *, pad_input: bool = False
) -> torch.Tensor:
    """ZNCC of a template at every position of an image, as ``skimage.feature.match_template``.

    Parameters
    ----------
    image : Tensor, shape ``(N, C, H, W)`` or ``(N, C, D, H, W)``
        float16/bfloat16 (computed in float32), float32 or float64, any device.
    template : Tensor, shape ``(N or 1, C or 1, *t)``, as many dimensions as ``image``
        Any size (odd or even) no larger than the image on every axis; broadcast over
        the batch and channels when 1.
    pad_input : bool
        False: output shape ``S - t + 1``, position ``i`` is the window whose first
        (top-left) pixel is ``i``. True: the image is zero-padded by ``(t // 2,
        t - 1 - t // 2)`` per axis, output shape ``S``, position ``i`` is the window centered
        on ``i`` (center ``t // 2``), as scikit-image.

    Returns
    -------
    Tensor, shape ``(N, C, *(S - t + 1))`` or ``(N, C, *S)``, in the promoted dtype of
    ``image`` and ``template``; values in [-1, 1], 0 where the image window or the
    template is flat. Differentiable with respect to both inputs (finite gradients
    everywhere, zero where the result is defined as 0).
    """
    check_image(image, "image")
    check_image(template, "template")
    check_same_device(image, template, "image", "template")
    _check_template(image, template)
    check_bool(pad_input, "pad_input")
    out_dtype = torch.promote_types(image.dtype, template.dtype)
    dtype = compute_dtype(out_dtype)
    img, tpl = image.to(dtype), template.to(dtype)
    dims = tuple(range(2, img.dim()))
    tshape = tuple(template.shape[2:])

    # Center the image on its own mean (detached; ZNCC is shift-invariant): keeps the
    # float32 FFT and the sums accurate on data with a large offset. scikit-image pads
    # the *original* image with zeros, i.e. the centered one with -mean.
    mean = img.detach().mean(dims, keepdim=True)
    if pad_input:
        pads = [(t // 2, t - 1 - t // 2) for t in tshape]
        padded = pad_spatial(img, pads, mode="constant")
        # A 1-pixel template pads nothing: pad_spatial then returns img itself, which may
        # be the caller's tensor, so only a fresh padded copy is centered in place.
        y = img - mean if padded is img else padded.sub_(mean)
    else:
        y = img - mean

    # The template is small: center it in the accumulation dtype (float64 for float32).
    acc = accumulate_dtype(dtype, img.device)
    t_centered, t_energy, t_flat = centered_energy(tpl.to(acc), dims)  # (Nt, Ct, *t)
    t_centered, t_energy = t_centered.to(dtype), t_energy.to(dtype)
    numerator = fft_cc(y, t_centered, mode="valid")  # Σ (I - Ī)(T - T̄) per window
    impl = _kernels.implementation("local_std", y)
    window_energy = impl.local_std_valid(y, tshape, 0.0, False)  # 0 where flat
    valid = (window_energy > 0) & ~t_flat
    denominator = window_energy * t_energy.sqrt()
    safe = torch.where(valid, denominator, torch.ones_like(denominator))
    out = torch.where(valid, numerator / safe, torch.zeros_like(numerator))
    return out.to(out_dtype)
