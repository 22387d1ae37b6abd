"""The compiled ops as Python functions with the signatures of :mod:`.._reference`.

Each function here is the twin of the pure torch function of the same name, so an operator
picks one module or the other (``_kernels.implementation``) and calls the same thing. Only
call these once the kernels are loaded (``_kernels.ensure_loaded``).

Every function checks its arguments in Python first (:mod:`.preconditions`, the checks of
``csrc/checks.h``), so that no call from Python reaches a refusal in C++.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._autograd import first_order_backward
from .._numerics import FLAT_TOLERANCE, flat_threshold_factor
from . import preconditions

#: the flat rule of the CPU kernels, whose window sums run in float64.
KERNEL_FLAT_FACTOR = flat_threshold_factor(torch.float64)
#: the flat rule of the CUDA kernels on float32 data, whose sums are compensated float32
#: (a rounded sum and its error: about 48 significant bits, csrc/include/simwarp/
#: compensated.h). On float64 data they carry more than float64's bits, and the CPU's
#: rule holds.
COMPENSATED_FLOAT32_FLAT_FACTOR = FLAT_TOLERANCE * 2.0**-48
#: the paddings the CPU kernel of the 2-D local std implements
PADDINGS_2D = ("reflect", "mirror", "nearest", "constant", "valid")


def kernel_flat_factor(x: torch.Tensor) -> float:
    """The flat rule's factor of the kernels that will run on ``x``."""
    if x.device.type == "cuda" and x.dtype == torch.float32:
        return COMPENSATED_FLOAT32_FLAT_FACTOR
    return KERNEL_FLAT_FACTOR


def _flat_list(taps: Sequence[Sequence[float]]) -> tuple[list[float], list[int]]:
    return [float(t) for axis in taps for t in axis], [len(axis) for axis in taps]


def box_sum(x: torch.Tensor, window: Sequence[int], full: bool = False) -> torch.Tensor:
    """Window sums of ``x (..., *S)`` over the trailing ``len(window)`` axes.

    Valid mode gives ``(..., *(S - k + 1))``; ``full=True`` gives ``(..., *(S + k - 1))``
    with zeros outside ``x`` (the adjoint of the valid sum). float32/float64.
    """
    window = [int(k) for k in window]
    preconditions.box_sum(x, window, full)
    return torch.ops.simwarp.box_sum(x.contiguous(), window, full)


def correlate(
    x: torch.Tensor, taps: Sequence[Sequence[float]], transpose: bool = False
) -> torch.Tensor:
    """Separable correlation of ``x (..., *S)`` over the trailing ``len(taps)`` axes.

    ``taps[i]`` are the 1-D weights of axis ``i``. Valid mode gives ``(..., *(S - k + 1))``;
    ``transpose=True`` is its adjoint ``(..., *(S + k - 1))``. Differentiable.
    """
    flat, sizes = _flat_list(taps)
    preconditions.correlate(x, flat, sizes, transpose)
    return torch.ops.simwarp.correlate(x.contiguous(), flat, sizes, transpose)


def moments5(centered: torch.Tensor, taps: Sequence[Sequence[float]]) -> list[torch.Tensor]:
    """The five windowed moments of ``centered = [a, b]`` ``(2, ..., *P)``, valid mode.

    Returns five maps ``(..., *(P - k + 1))``: ``W⋆a, W⋆b, W⋆a², W⋆b², W⋆ab``, the
    products formed on the fly. Not differentiable by itself.
    """
    flat, sizes = _flat_list(taps)
    preconditions.moments5(centered, flat, sizes)
    return list(torch.ops.simwarp.moments5(centered.contiguous(), flat, sizes).unbind(0))


def splat_fwd(image: torch.Tensor, displacement: torch.Tensor, normalize: bool, eps: float):
    """Fused splat of ``image (N, C, *S)`` by ``displacement (N, D, *S)`` (same dtype).

    Returns ``(out (N, C, *S), den (N, 1, *S))`` with ``ops.splat``'s semantics (holes 0);
    differentiable with respect to both inputs. Deterministic on CPU.
    """
    preconditions.splat_fwd(image, displacement)
    return torch.ops.simwarp.splat_fwd(image, displacement, bool(normalize), float(eps))


def local_std_valid(
    xp: torch.Tensor,
    window: Sequence[int],
    eps: float,
    normalize: bool,
    flat_factor: float | None = None,
) -> torch.Tensor:
    """Fused local std of a padded, centered ``xp (..., *P)``, valid mode ``(..., *(P - k + 1))``.

    The window sums and ``V = S2 - S1²/N`` are formed in float64 on CPU and as compensated
    sums in ``xp``'s dtype on CUDA (float32 at about 48 bits); ``V <= flat_factor · S2``
    counts as flat (0, zero gradient), by default relative to that precision
    (:func:`kernel_flat_factor`). Differentiable with respect to ``xp``.
    """
    window = [int(k) for k in window]
    preconditions.local_std_fwd(xp, window)
    factor = kernel_flat_factor(xp) if flat_factor is None else float(flat_factor)
    out, _, _ = torch.ops.simwarp.local_std_fwd(xp, window, float(eps), bool(normalize), factor)
    return out


def local_std_2d(
    x: torch.Tensor,
    window: Sequence[int],
    padding: str,
    eps: float,
    normalize: bool,
    flat_factor: float | None = None,
) -> torch.Tensor:
    """Fused local std of images ``x (..., H, W)``, padded and centered inside the kernel.

    ``padding`` is "reflect", "mirror", "nearest" or "constant" (output ``(..., H, W)``) or
    "valid" (output ``(..., H - kh + 1, W - kw + 1)``). CPU only. Differentiable with
    respect to ``x``.
    """
    window = [int(k) for k in window]
    if padding not in PADDINGS_2D:
        raise ValueError(
            "local_std_2d: padding must be valid, reflect, mirror, nearest or constant, "
            f"got {padding}"
        )
    preconditions.local_std_2d_fwd(x, window, valid=padding == "valid")
    factor = KERNEL_FLAT_FACTOR if flat_factor is None else float(flat_factor)
    out, _, _ = torch.ops.simwarp.local_std_2d_fwd(
        x, window, padding, float(eps), bool(normalize), factor
    )
    return out


#: the fused SSIM kernels' limits (csrc/cuda/ssim.h): taps per window axis, tile edge.
SSIM_MAX_TAPS = 31
SSIM_TILE = 16


def ssim_fwd(
    a: torch.Tensor,
    b: torch.Tensor,
    taps: Sequence[Sequence[float]],
    c1: float,
    c2: float,
    need_partials: bool,
    library=None,
):
    """Fused 2-D Gaussian SSIM of float32 ``a``, ``b`` ``(..., H, W)`` (CUDA only),
    SciPy "reflect" padding: ``(map (..., H, W), partials (4, ..., H, W), shifts (2,
    images, tiles_y, tiles_x))``, the last two empty unless ``need_partials``.
    ``library`` is ``torch.ops.simwarp`` (default) or the host shim's."""
    flat, sizes = _flat_list(taps)
    preconditions.ssim_fwd(a, b, flat, sizes, SSIM_MAX_TAPS)
    library = torch.ops.simwarp if library is None else library
    return library.ssim_fwd(a, b, flat, sizes, float(c1), float(c2), bool(need_partials))


def ssim_bwd(grad, a, b, partials, shifts, taps: Sequence[Sequence[float]], library=None):
    """Gradients ``(grad_a, grad_b)`` of the fused SSIM, ``grad`` one value (a mean's) or a
    map of ``a``'s shape."""
    flat, sizes = _flat_list(taps)
    preconditions.ssim_bwd(grad, a, b, partials, shifts, flat, sizes, SSIM_MAX_TAPS, SSIM_TILE)
    library = torch.ops.simwarp if library is None else library
    return library.ssim_bwd(grad, a, b, partials, shifts, flat, sizes)


#: the fused local NCC kernels' limit (csrc/cuda/local_ncc.h): taps per window axis.
LOCAL_NCC_MAX_TAPS = 25


def local_ncc_fwd(
    a: torch.Tensor,
    b: torch.Tensor,
    taps: Sequence[Sequence[float]],
    inv_total: float,
    flat_factor: float,
    need_partials: bool,
    library=None,
):
    """Fused local NCC of float32 ``a``, ``b`` ``(..., [D,] H, W)`` (CUDA only), 2-D or 3-D
    window, SciPy "reflect" padding: ``(map, partials (5, *a.shape), shifts (2, images,
    tiles_z, tiles_y, tiles_x))``, the last two empty unless ``need_partials``.
    ``library`` as :func:`ssim_fwd`'s."""
    flat, sizes = _flat_list(taps)
    preconditions.local_ncc_fwd(a, b, flat, sizes, LOCAL_NCC_MAX_TAPS)
    library = torch.ops.simwarp if library is None else library
    return library.local_ncc_fwd(
        a, b, flat, sizes, float(inv_total), float(flat_factor), bool(need_partials)
    )


def local_ncc_bwd(grad, a, b, partials, shifts, taps: Sequence[Sequence[float]], library=None):
    """Gradients ``(grad_a, grad_b)`` of the fused local NCC, ``grad`` one value (a mean's)
    or a map of ``a``'s shape."""
    from ._registrations import local_ncc_shift_shape

    flat, sizes = _flat_list(taps)
    tiles = local_ncc_shift_shape(tuple(a.shape), sizes)
    preconditions.local_ncc_bwd(
        grad, a, b, partials, shifts, flat, sizes, LOCAL_NCC_MAX_TAPS, tiles
    )
    library = torch.ops.simwarp if library is None else library
    return library.local_ncc_bwd(grad, a, b, partials, shifts, flat, sizes)


#: the fused 2-D local std's limit (csrc/cuda/local_std_fused.h): window size per axis.
LOCAL_STD_MAX_WINDOW = 31


def local_std_fused_fwd(x, shift, window, padding, eps, normalize, flat_factor, library=None):
    """Fused 2-D local std of float32 ``x (..., H, W)`` (CUDA only), each image centred on
    ``shift (images,)`` and padded inside the kernel: ``(out, s1, flat)``, as
    ``local_std_fwd`` on the padded, centred image. ``library`` as :func:`ssim_fwd`'s."""
    window = [int(k) for k in window]
    preconditions.local_std_fused_fwd(x, shift, window, padding, LOCAL_STD_MAX_WINDOW)
    library = torch.ops.simwarp if library is None else library
    return library.local_std_fused_fwd(
        x, shift, window, padding, float(eps), bool(normalize), float(flat_factor)
    )


def local_std_fused_bwd(grad, out, s1, flat, x, shift, window, padding, normalize, library=None):
    """``∂L/∂x`` of the fused 2-D local std from ``grad`` and the forward's results."""
    window = [int(k) for k in window]
    preconditions.local_std_fused_bwd(
        grad, out, s1, flat, x, shift, window, padding, LOCAL_STD_MAX_WINDOW
    )
    library = torch.ops.simwarp if library is None else library
    return library.local_std_fused_bwd(
        grad, out, s1, flat, x, shift, window, padding, bool(normalize)
    )


def parzen_mutual_information(a, b, weight, bins: int, normalize: bool, value_range):
    """The B-spline Parzen mutual information ``(M,)`` of intensities ``a``, ``b`` ``(M,
    P)`` (one dtype, float32 or float64; ``weight`` ``(M, P)`` or None; ``value_range``
    None or ``(lo, hi)``), NaN for a row holding a non-finite value, differentiable in
    ``a`` and ``b``: ``simwarp::parzen_fwd`` (histogram, entropies and their gradient in
    one call) and ``parzen_bwd``."""
    preconditions.parzen(a, b, weight, bins)
    vr = [] if value_range is None else [float(v) for v in value_range]
    return torch.ops.simwarp.parzen_fwd(a, b, weight, int(bins), bool(normalize), vr)[0]


class _Squarings(torch.autograd.Function):
    """``simwarp::squaring_fwd`` keeping every squaring's input (``(steps, N, D, *S)``:
    what ``squaring_bwd`` reads), returning the last squaring and the first one's input
    ``u = scale · v`` (``saved[0]``: no copy; with no squaring, the empty stack). The
    backward is ``squaring_bwd``, one call for the whole chain (the scale's share
    included), which takes the gradient with respect to ``u`` from outside the squarings
    as its ``base`` (no sum of its own)."""

    @staticmethod
    def forward(ctx, v, steps, scale):
        out, saved = torch.ops.simwarp.squaring_fwd(v, scale, steps, True)
        ctx.save_for_backward(saved)
        ctx.scale = scale
        ctx.set_materialize_grads(False)  # no zeros for an output whose gradient is none
        return out, saved[0] if steps else saved  # (no squaring: no input kept, an empty stack)

    @staticmethod
    @first_order_backward("scaling and squaring")
    def backward(ctx, grad, grad_u):
        (saved,) = ctx.saved_tensors
        if grad is None and grad_u is None:
            return None, None, None
        if grad is None:  # only u was used: nothing flows through the squarings
            grad = torch.zeros_like(grad_u)
        return torch.ops.simwarp.squaring_bwd(grad, saved, ctx.scale, grad_u), None, None


def squarings(v: torch.Tensor, steps: int, scale=None, with_input: bool = False):
    """``steps`` squarings ``u <- u + u(x + u(x))`` of ``u = scale · v`` (``v`` ``(N, D,
    *S)``, pixels, array axes; ``scale``: ``D`` factors, one per component, or None),
    :func:`..integrate_velocity.squarings`'s twin: one ``simwarp::squaring_fwd`` (and, where
    a gradient is wanted, one ``squaring_bwd``) for the whole chain, the scaling in its
    first squaring each way. ``with_input``: ``(the squarings, u)``, ``u`` differentiable
    (its gradient joins the squarings' in ``squaring_bwd``); ``steps`` at least 1."""
    preconditions.squaring(v, steps, scale)
    factors = [] if scale is None else [float(s) for s in scale]
    if with_input and steps < 1:
        raise ValueError(f"squaring: with_input needs steps >= 1, got {steps}")
    if torch.is_grad_enabled() and v.requires_grad:
        out, u = _Squarings.apply(v, int(steps), factors)
        return (out, u) if with_input else out
    out, saved = torch.ops.simwarp.squaring_fwd(v, factors, int(steps), with_input)
    return (out, saved[0]) if with_input else out
