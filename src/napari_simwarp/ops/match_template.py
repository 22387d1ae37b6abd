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
from ._nonfinite import fill_nonfinite, nonfinite_mask, power_of_two_scale, windows_seeing
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
    template is flat (a window whose energy is within the FFT's round-off of the whole
    image's counts as flat). NaN exactly where the window holds a NaN or infinite image
    pixel, everywhere when the template holds one. Computed in float64 for float32 data
    (except on MPS): agrees with a float64 computation to 1e-6, and is the same for data
    scaled by any power of ten within the dtype's range. Differentiable with respect to
    both inputs (finite gradients where the result is finite, zero where it is defined
    as 0).
    """
    check_image(image, "image")
    check_image(template, "template")
    check_same_device(image, template, "image", "template")
    _check_template(image, template)
    check_bool(pad_input, "pad_input")
    out_dtype = torch.promote_types(image.dtype, template.dtype)
    dtype = compute_dtype(out_dtype)
    # Sums and the FFT run in the accumulation dtype (float64 for float32 data): the FFT's
    # round-off is global (a fraction of the whole image's energy), the denominator local,
    # so in float32 a dark window of a bright image would get noise for a score.
    acc = accumulate_dtype(dtype, image.device)
    img, tpl = image.to(acc), template.to(acc)
    dims = tuple(range(2, img.dim()))
    tshape = tuple(template.shape[2:])
    invalid = nonfinite_mask(img)
    if invalid is not None:
        img = fill_nonfinite(img, invalid)
    template_invalid = nonfinite_mask(tpl)
    if template_invalid is not None:
        tpl = fill_nonfinite(tpl, template_invalid)

    # Center the image on its own mean (detached; ZNCC is shift-invariant) and bring it
    # into [-1, 1] by an exact power of two (scale-invariant): the sums stay accurate on
    # data with a large offset and on data near 1e-30 or 1e30. scikit-image pads the
    # *original* image with zeros, i.e. the centered one with -mean.
    mean = img.detach().mean(dims, keepdim=True)
    scale = power_of_two_scale(img - mean, dims)
    if pad_input:
        pads = [(t // 2, t - 1 - t // 2) for t in tshape]
        y = (pad_spatial(img, pads, mode="constant") - mean) * scale
    else:
        y = (img - mean) * scale
    t_centered, t_energy, t_flat = centered_energy(tpl * power_of_two_scale(tpl, dims), dims)
    numerator = fft_cc(y, t_centered, mode="valid")  # Σ (I - Ī)(T - T̄) per window
    impl = _kernels.implementation("local_std", y)
    window_energy = impl.local_std_valid(y, tshape, 0.0, False)  # 0 where flat
    # A window whose energy is within the FFT's round-off of the image's is flat by
    # design (0): its score would be noise (docs/maths.md §2.1).
    resolvable = window_energy > _fft_noise_level(y, dims)
    valid = resolvable & ~t_flat
    denominator = window_energy * t_energy.sqrt()
    safe = torch.where(valid, denominator, torch.ones_like(denominator))
    out = torch.where(valid, numerator / safe, torch.zeros_like(numerator))
    # Rounding can put |ZNCC| a few ulps past 1 at a perfect match.
    out = out.clamp(-1.0, 1.0)
    if invalid is not None:
        padded_invalid = invalid
        if pad_input:
            padded_invalid = pad_spatial(invalid.to(torch.float32), pads, mode="constant") > 0.5
        out = out.masked_fill(windows_seeing(padded_invalid, tshape, None), float("nan"))
    if template_invalid is not None:
        seen = template_invalid.flatten(2).any(-1)[(...,) + (None,) * len(tshape)]
        out = out.masked_fill(seen.expand_as(out), float("nan"))
    return out.to(out_dtype)


#: the largest error a score may carry from the FFT's round-off; windows whose energy is
#: too small for that are flat by design
SCORE_TOLERANCE = 1e-4


def _fft_noise_level(y: torch.Tensor, dims) -> torch.Tensor:
    """The window energy below which an FFT numerator is round-off: ``(N, C, 1, ...)``.

    The numerator's absolute error is about ``eps · log2(L) · ‖y‖ · ‖t‖`` (``L`` the
    transform's length); a window of energy ``E`` gives the score ``numerator / (E ‖t‖)``,
    whose error stays below :data:`SCORE_TOLERANCE` while ``E`` is above
    ``eps · log2(L) · ‖y‖ / SCORE_TOLERANCE``. In float64 that is ~1e-10 of the image's
    norm (only near-empty windows); in float32 (MPS) ~1e-2.
    """
    length = max(int(y.shape[d]) for d in dims)
    norm = y.detach().square().sum(dims, keepdim=True).sqrt()
    return norm * (torch.finfo(y.dtype).eps * length.bit_length() / SCORE_TOLERANCE)
