"""Zero-normalised cross-correlation (SPEC §2): template matching and the global score.

``match_template`` follows ``skimage.feature.match_template`` (output shape, ``pad_input``,
zero-padding of the image, 0 where the window or the template is flat) so that results
can be checked against it; the numerator is one FFT correlation (``fft_cc``) with the
centred template, the denominator the local energy of SPEC §1 (``local_std``'s autograd
function) times the template's norm. Both are differentiable with respect to the image
and the template.
"""

from __future__ import annotations

import torch

from ._padding import pad_spatial
from ._validation import check_image, check_same_device, check_same_shape, compute_dtype
from .fft import fft_cc
from ._accumulate import accumulate_dtype
from .local_std import flat_threshold_factor, local_energy_valid


def _centred_energy(x: torch.Tensor, dims: tuple[int, ...]):
    """``x`` centred over ``dims`` and its sum of squared deviations, flat-safe.

    Uses the corrected two-pass formula ``Σx'² - (Σx')²/n`` (``x' = x - mean``): its
    second term removes the round-off of the mean, so a constant ``x`` gives exactly the
    rounding level, which the flat test below catches.

    Parameters
    ----------
    x : Tensor, shape ``(N, C, *S)``
    dims : the spatial dims.

    Returns
    -------
    centred : Tensor, shape ``(N, C, *S)``: ``x`` minus its mean (differentiable).
    energy : Tensor, shape ``(N, C, 1, ...)``: ``Σ (x - mean)²``, 1 where flat.
    flat : bool Tensor, shape ``(N, C, 1, ...)``.
    """
    count = 1
    for d in dims:
        count *= x.shape[d]
    centred = x - x.mean(dims, keepdim=True)
    sum_sq = centred.square().sum(dims, keepdim=True)
    energy = sum_sq - centred.sum(dims, keepdim=True).square() / count
    flat = (energy <= sum_sq.detach() * flat_threshold_factor(x.dtype)).detach()
    return centred, torch.where(flat, torch.ones_like(energy), energy), flat


def _check_template(image: torch.Tensor, template: torch.Tensor) -> None:
    if template.dim() != image.dim():
        raise ValueError(
            f"template must have as many dimensions as image ({image.dim()}: (N or 1, C or 1, "
            f"*spatial)), got shape {tuple(template.shape)} for image shape "
            f"{tuple(image.shape)}"
        )
    for axis, name in ((0, "N"), (1, "C")):
        if template.shape[axis] not in (1, image.shape[axis]):
            raise ValueError(
                f"template's {name} ({template.shape[axis]}) must be 1 or match image's "
                f"({image.shape[axis]}); template shape {tuple(template.shape)}, image shape "
                f"{tuple(image.shape)}"
            )
    if any(t > s for t, s in zip(template.shape[2:], image.shape[2:])):
        raise ValueError(
            f"template spatial shape {tuple(template.shape[2:])} is larger than image's "
            f"{tuple(image.shape[2:])}"
        )


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
        t - 1 - t // 2)`` per axis, output shape ``S``, position ``i`` is the window centred
        on ``i`` (centre ``t // 2``), as scikit-image.

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
    if not isinstance(pad_input, bool):
        raise TypeError(f"pad_input must be a bool, got {pad_input!r}")
    out_dtype = torch.promote_types(image.dtype, template.dtype)
    dtype = compute_dtype(out_dtype)
    img, tpl = image.to(dtype), template.to(dtype)
    dims = tuple(range(2, img.dim()))
    tshape = tuple(template.shape[2:])

    # Centre the image on its own mean (detached; ZNCC is shift-invariant): keeps the
    # float32 FFT and the sums accurate on data with a large offset. scikit-image pads
    # the *original* image with zeros, i.e. the centred one with -mean.
    mean = img.detach().mean(dims, keepdim=True)
    if pad_input:
        pads = [(t // 2, t - 1 - t // 2) for t in tshape]
        padded = pad_spatial(img, pads, mode="zeros")
        # A 1-pixel template pads nothing: pad_spatial then returns img itself, which may
        # be the caller's tensor, so only a fresh padded copy is centred in place.
        y = img - mean if padded is img else padded.sub_(mean)
    else:
        y = img - mean

    # The template is small: centre it in the accumulation dtype (float64 for float32).
    acc = accumulate_dtype(dtype, img.device)
    t_centred, t_energy, t_flat = _centred_energy(tpl.to(acc), dims)  # (Nt, Ct, *t)
    t_centred, t_energy = t_centred.to(dtype), t_energy.to(dtype)
    numerator = fft_cc(y, t_centred, mode="valid")  # Σ (I - Ī)(T - T̄) per window
    window_energy = local_energy_valid(y, tshape, normalized=False, eps=0.0)  # 0 where flat
    valid = (window_energy > 0) & ~t_flat
    denominator = window_energy * t_energy.sqrt()
    safe = torch.where(valid, denominator, torch.ones_like(denominator))
    out = torch.where(valid, numerator / safe, torch.zeros_like(numerator))
    return out.to(out_dtype)


def ncc(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Global ZNCC of two images of one shape, per batch element and channel.

    ``Σ (a - ā)(b - b̄) / sqrt(Σ (a - ā)² · Σ (b - b̄)²)`` over the spatial axes.

    Parameters
    ----------
    a, b : Tensor, shape ``(N, C, H, W)`` or ``(N, C, D, H, W)``, same shape and device
        float16/bfloat16 (computed in float32), float32 or float64.

    Returns
    -------
    Tensor, shape ``(N, C)``, in the promoted dtype of ``a`` and ``b``; 0 where either
    image is flat (constant), with a zero gradient there. Differentiable with respect to
    ``a`` and ``b``.
    """
    check_image(a, "a")
    check_image(b, "b")
    check_same_shape(a, b, "a", "b")
    check_same_device(a, b, "a", "b")
    out_dtype = torch.promote_types(a.dtype, b.dtype)
    dtype = compute_dtype(out_dtype)
    dims = tuple(range(2, a.dim()))
    a_c, a_energy, a_flat = _centred_energy(a.to(dtype), dims)
    b_c, b_energy, b_flat = _centred_energy(b.to(dtype), dims)
    count = a_c[0, 0].numel()
    # The means' round-off is removed from the cross term as from the energies.
    cross = (a_c * b_c).sum(dims, keepdim=True) - (
        a_c.sum(dims, keepdim=True) * b_c.sum(dims, keepdim=True) / count
    )
    flat = a_flat | b_flat
    score = torch.where(flat, torch.zeros_like(cross), cross / (a_energy * b_energy).sqrt())
    return score.reshape(a.shape[0], a.shape[1]).to(out_dtype)
