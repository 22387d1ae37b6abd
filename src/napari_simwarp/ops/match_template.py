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
from ._blocked_cc import block_grid, blocked_zncc, packs
from ._nonfinite import fill_nonfinite, nonfinite_mask, power_of_two_scale, windows_seeing
from ._numerics import compute_dtype, moment_dtype
from ._padding import pad_spatial
from ._validation import (
    check_bool,
    check_choice,
    check_image,
    check_kernel_like,
    check_same_device,
)
from .ncc import centered_energy


def _check_template(image: torch.Tensor, template: torch.Tensor) -> None:
    if template.dim() != image.dim():
        raise ValueError(
            f"template must have as many dimensions as image ({image.dim()}: (N or 1, C or 1, "
            f"*spatial)), got shape {tuple(template.shape)} for image shape "
            f"{tuple(image.shape)}"
        )
    check_kernel_like(template, image, "template", "image")


#: scikit-image's padding modes (``numpy.pad``'s names and meanings; ``"empty"`` excluded)
MODES = (
    "constant",
    "edge",
    "reflect",
    "symmetric",
    "wrap",
    "linear_ramp",
    "maximum",
    "mean",
    "median",
    "minimum",
)
#: SciPy names refused here with the NumPy name scikit-image uses for the same border
_SCIPY_NAMES = {
    "nearest": "edge",
    "mirror": "reflect",
    "grid-mirror": "symmetric",
    "grid-wrap": "wrap",
    "grid-constant": "constant",
}
#: NumPy modes that are index gathers, as SciPy's names in ``pad_spatial``
_GATHERS = {"edge": "nearest", "reflect": "mirror", "symmetric": "reflect"}
_STATISTICS = {
    "maximum": lambda x, d: x.amax(d, keepdim=True),
    "minimum": lambda x, d: x.amin(d, keepdim=True),
    "mean": lambda x, d: x.mean(d, keepdim=True),
    "median": lambda x, d: torch.quantile(x, 0.5, dim=d, keepdim=True),
}


def _check_mode(mode, constant_values) -> float:
    if mode in _SCIPY_NAMES:
        raise ValueError(
            f"mode={mode!r} is SciPy's name; match_template takes scikit-image's "
            f"(numpy.pad's): {_SCIPY_NAMES[mode]!r} is the same border"
        )
    check_choice(mode, "mode", MODES)
    if isinstance(constant_values, bool) or not isinstance(constant_values, (int, float)):
        raise TypeError(f"constant_values must be a number, got {constant_values!r}")
    return float(constant_values)


def _pad_axis(x: torch.Tensor, dim: int, width: int, mode: str, value: float) -> torch.Tensor:
    """``x`` padded by ``width`` on both sides of ``dim``, as ``numpy.pad(mode=mode)``."""
    n = x.shape[dim]
    if mode == "wrap":
        return x.index_select(dim, torch.arange(-width, n + width, device=x.device) % n)
    if mode in _GATHERS:
        later_axes = [(0, 0)] * (x.dim() - dim - 1)
        return pad_spatial(x, [(width, width), *later_axes], mode=_GATHERS[mode])
    shape = list(x.shape)
    shape[dim] = width
    if mode == "constant":
        before = after = x.new_full(shape, value)
    elif mode == "linear_ramp":
        # from 0 at the outer end to the edge value, numpy's linspace without its endpoint
        ramp_shape = [1] * x.dim()
        ramp_shape[dim] = width
        ramp = torch.arange(width, device=x.device, dtype=x.dtype).reshape(ramp_shape) / width
        before = x.narrow(dim, 0, 1) * ramp
        after = x.narrow(dim, n - 1, 1) * ramp.flip(dim)
    else:
        before = after = _STATISTICS[mode](x, dim).expand(shape)
    return torch.cat([before, x, after], dim=dim)


def _pad_like_numpy(x: torch.Tensor, widths, mode: str, value: float) -> torch.Tensor:
    """The spatial axes of ``(N, C, *S)`` padded by ``widths`` on both sides, axis after
    axis as ``numpy.pad`` does (so corners of the statistic modes see earlier pads)."""
    for axis, width in enumerate(widths):
        x = _pad_axis(x, 2 + axis, width, mode, value)
    return x


#: powers of two of the scale (``1 / max |image|``) between which the CPU's float32 route
#: skips scaling: data of magnitude ``2**-60`` to ``2**60`` neither overflow the block
#: transforms nor reach float32's subnormals there
SAFE_SCALES = (2.0**-60, 2.0**60)

#: how the mask of non-finite pixels is padded for each mode: a padded pixel is invalid
#: where the values it copies or summarizes include an invalid one
_MASK_MODES = {
    "constant": "constant",
    "linear_ramp": "edge",
    "maximum": "maximum",
    "minimum": "maximum",
    "mean": "maximum",
    "median": "maximum",
}


def match_template(
    image: torch.Tensor,
    template: torch.Tensor,
    *,
    pad_input: bool = False,
    mode: str = "constant",
    constant_values: float = 0.0,
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
    mode : str
        How the image is padded for ``pad_input=True`` (no effect otherwise): scikit-image's
        ``mode``, which is ``numpy.pad``'s, with NumPy's names and meanings —
        ``"constant"`` (``constant_values``), ``"edge"`` (SciPy's "nearest"),
        ``"reflect"`` (``d c b | a b c``: SciPy's "mirror"), ``"symmetric"`` (``c b a |
        a b c``: SciPy's "reflect"), ``"wrap"``, ``"linear_ramp"`` (from 0 to the edge
        value), ``"maximum"``, ``"mean"``, ``"median"``, ``"minimum"`` (of the whole row
        along each axis, axis after axis). As in scikit-image the image is padded by the
        template's full size, which only ``"linear_ramp"`` can tell.
    constant_values : float
        The value outside the image for ``mode="constant"`` (before centering).

    Returns
    -------
    Tensor, shape ``(N, C, *(S - t + 1))`` or ``(N, C, *S)``, in the promoted dtype of
    ``image`` and ``template``; values in [-1, 1], 0 where the image window or the
    template is flat (a window whose energy is within the FFT's round-off of its block's
    counts as flat). NaN exactly where the window holds a NaN or infinite image pixel,
    everywhere when the template holds one. For float32 data the transforms run in
    float32, block by block, each block centered on its own mean (``_blocked_cc``);
    blocks holding a window float32 cannot resolve (a dark window beside bright ones) are
    redone in float64, except on GPUs and MPS (``_numerics.moment_dtype``), where such
    windows score 0. Agrees with scikit-image's float64 result to 1e-5 on offset
    microscopy data (tests), and is the same for data scaled by any power of ten within
    the dtype's range. Differentiable with respect to
    both inputs (finite gradients where the result is finite, zero where it is defined
    as 0).
    """
    check_image(image, "image")
    check_image(template, "template")
    check_same_device(image, template, "image", "template")
    _check_template(image, template)
    check_bool(pad_input, "pad_input")
    value = _check_mode(mode, constant_values)
    out_dtype = torch.promote_types(image.dtype, template.dtype)
    dtype = compute_dtype(out_dtype)
    # The transforms run in float32 for float32 data, each block of the output centered
    # on its own mean (_blocked_cc); blocks with a window float32 cannot resolve (a dark
    # window beside bright ones) are redone in the accumulation dtype (float64 where the
    # device has it and is not a GPU; moment_dtype).
    wide = moment_dtype(dtype, image.device)
    img, tpl = image.to(dtype), template.to(wide)
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
    with torch.no_grad():
        if wide == dtype:  # float32 sums on GPUs: the energy needs data centered on the mean
            mean = img.mean(dims, keepdim=True, dtype=wide)
            low, high = img.amin(dims, keepdim=True), img.amax(dims, keepdim=True)
            scale = power_of_two_scale(torch.maximum(high - mean, mean - low), dims)
        else:
            # One pass for the scale: the energy's sums run in float64 and need no mean.
            # (amin and amax over the spatial dims: 20 times faster than aminmax over a
            # flattened axis on the CPU, and than a float64 mean)
            low, high = img.amin(dims, keepdim=True), img.amax(dims, keepdim=True)
            scale = power_of_two_scale(torch.maximum(high.abs(), low.abs()), dims)
            lo_scale, hi_scale = SAFE_SCALES
            if img.device.type == "cpu" and bool(((scale >= lo_scale) & (scale <= hi_scale)).all()):
                # The data are far from overflow and underflow: the exact scaling would
                # change no rounding, only cost a copy of the image.
                scale = None
    if pad_input:
        # scikit-image pads by the whole template, then keeps (t // 2, t - 1 - t // 2)
        keep = tuple(
            slice(t - t // 2, t + n + t - 1 - t // 2) for t, n in zip(tshape, img.shape[2:])
        )
        padded = _pad_like_numpy(img, tshape, mode, value)[(..., *keep)]
    else:
        padded = img

    y = padded if scale is None else padded * scale.to(dtype)  # exact: a power of two
    t_centered, t_energy, t_flat = centered_energy(tpl * power_of_two_scale(tpl, dims), dims)
    # The windows' energy: from the exact data where the sums run in float64 (CPU); from
    # the data centered on their mean where they stay in float32 (GPUs).
    if wide == dtype:
        y_energy = (padded - mean.to(dtype)) * scale.to(dtype)
    else:
        y_energy = y
    impl = _kernels.implementation("local_std", y_energy)
    energy = impl.local_std_valid(y_energy, tshape, 0.0, False)  # 0 where flat
    # On the CPU two blocks share one complex transform: an even count along the last axis
    grid = block_grid(energy.shape[2:], tshape, even_last=packs(image.device))
    out = blocked_zncc(y, energy, t_centered, t_energy, t_flat, grid, wide)
    # Rounding can put |ZNCC| a few ulps past 1 at a perfect match.
    out = out.clamp_(-1.0, 1.0) if not out.requires_grad else out.clamp(-1.0, 1.0)
    if invalid is not None:
        padded_invalid = invalid
        if pad_input:
            flags = _pad_like_numpy(
                invalid.to(torch.float32), tshape, _MASK_MODES.get(mode, mode), 0.0
            )
            padded_invalid = flags[(..., *keep)] > 0.5
        out = out.masked_fill(windows_seeing(padded_invalid, tshape, None), float("nan"))
    if template_invalid is not None:
        seen = template_invalid.flatten(2).any(-1)[(...,) + (None,) * len(tshape)]
        out = out.masked_fill(seen.expand_as(out), float("nan"))
    return out.to(out_dtype)
