"""Local standard deviation over a box window (SPEC §1), with an analytical backward.

The image is centred on its per-(N, C) mean (detached) and padded first; the autograd
function :class:`_LocalEnergy` then works in "valid" mode on the padded tensor, and
autograd folds the padding's gradient back onto the image. Centring is free accuracy:
the variance is shift-invariant (so the true gradient through the mean is exactly zero),
and without it ``S2 - S1²/N`` cancels catastrophically in float32 on data with a large
offset (microscopy). With the compiled kernels on the CPU, 2D calls go to one kernel
that does the centring and padding itself, reading the image in place
(``_compiled.local_std_2d``); the rest take the route above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.autograd.function import once_differentiable

from . import _backend, _filters
from ._accumulate import accumulate_dtype
from ._filters import box_sum_valid
from ._padding import PADDING_MODES, centred_pads, pad_spatial
from ._validation import check_choice, check_image, check_window, to_compute
from .fft import fft_cc

#: local_std's ``method`` choices.
METHODS = ("auto", "box", "fft")

#: A window's ``V = S2 - S1²/N`` at or below ``FLAT_TOLERANCE · eps(dtype) · S2`` is
#: indistinguishable from the rounding of the sums (S2 is the window's sum of squares of
#: the centred values), so the window is treated as flat: ``V = 0``, zero gradient. The
#: box sums are pairwise (error ~ log2(k) ulps of S2); 64 leaves a wide margin and costs
#: nothing in float64 (``1.4e-14`` relative).
FLAT_TOLERANCE = 64.0


def flat_threshold_factor(dtype: torch.dtype) -> float:
    """Relative level below which a sum of squared deviations counts as zero."""
    return FLAT_TOLERANCE * torch.finfo(dtype).eps


# --------------------------------------------------------------------------------------
# Window sums: forward ("valid") and their adjoint ("full").
# --------------------------------------------------------------------------------------


def _fft_box_sums(stack: torch.Tensor, window: Sequence[int]) -> torch.Tensor:
    """Valid box sums of ``stack`` ``(B, N, C, *P)`` by one batched FFT correlation."""
    flat = stack.reshape(-1, *stack.shape[2:])
    ones = stack.new_ones(window)
    out = fft_cc(flat, ones, mode="valid")
    return out.reshape(*stack.shape[:3], *out.shape[2:])


def window_sums(
    y: torch.Tensor, z: torch.Tensor, window: Sequence[int], method: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Valid box sums of two maps of one shape.

    Parameters
    ----------
    y, z : Tensor, shape ``(N, C, *P)``
    window : box size per spatial axis.
    method : {"box", "fft"}
        "box": separable O(1)-per-pixel sums (``box_sum_valid``), one call per map so that
        its temporaries stay small; "fft": one batched FFT pass over ``[y, z]``.

    Returns
    -------
    (Tensor, Tensor), shape ``(N, C, *(P - k + 1))`` each.
    """
    if method == "fft":
        sums = _fft_box_sums(torch.stack([y, z]), window)
        return sums[0], sums[1]
    return box_sum_valid(y, window), box_sum_valid(z, window)


def _zero_pad_full(g: torch.Tensor, window: Sequence[int]) -> torch.Tensor:
    """``g`` ``(..., *S)`` padded with ``k - 1`` zeros on both sides of each spatial axis."""
    flat = []
    for k in reversed(window):
        flat += [k - 1, k - 1]
    return torch.nn.functional.pad(g, flat)


def window_sums_adjoint(
    g1: torch.Tensor, g2: torch.Tensor, window: Sequence[int], method: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Adjoint of :func:`window_sums`: ``(N, C, *S) -> (N, C, *(S + k - 1))`` per map.

    The adjoint of a valid correlation with a box is the full correlation with the
    flipped box, which is the same box: a valid box sum of the map padded by ``k - 1``
    zeros on both sides (for even sizes too).
    """
    if method == "fft":
        sums = _fft_box_sums(_zero_pad_full(torch.stack([g1, g2]), window), window)
        return sums[0], sums[1]
    return (
        box_sum_valid(_zero_pad_full(g1, window), window),
        box_sum_valid(_zero_pad_full(g2, window), window),
    )


# --------------------------------------------------------------------------------------
# The autograd function.
# --------------------------------------------------------------------------------------


def _energy_from_sums(s1, s2, count, normalized, eps, global_level=None):
    """``E`` and the flat mask from the window sums (overwrites ``s2``).

    Parameters
    ----------
    s1, s2 : Tensor, shape ``(..., *S)``: sums of ``y`` and ``y²`` over each window.
    global_level : Tensor broadcastable to ``s2``, or None
        Mean of ``y²`` over the image, for routes whose round-off is global (FFT).

    Returns
    -------
    out : Tensor, shape ``(..., *S)``: ``sqrt(V / N)`` or ``sqrt(V + eps)``.
    flat : bool Tensor, shape ``(..., *S)``: where ``V`` was set to 0.
    """
    factor = flat_threshold_factor(s1.dtype)
    variance = torch.addcmul(s2, s1, s1, value=-1.0 / count)  # V = S2 - S1²/N
    threshold = s2.mul_(factor)
    if global_level is not None:
        threshold.add_(global_level * (count * factor))
    flat = variance <= threshold
    variance.masked_fill_(flat, 0.0)
    out = variance.div_(count) if normalized else variance.add_(eps)
    return out.sqrt_(), flat


def _rows_per_chunk(y: torch.Tensor, window: Sequence[int]) -> int:
    """Output rows (first spatial axis) per chunk: about ``CHUNK_BYTES`` of input.

    Only the CPU is chunked (there it keeps the temporaries in cache); other devices take
    the whole axis at once (fewer kernel launches).
    """
    total_rows = y.shape[2] - window[0] + 1
    if y.device.type != "cpu":
        return total_rows
    slab = 8 * math.prod(y.shape[3:])  # bytes per input row once in float64
    return max(_filters.CHUNK_BYTES // max(slab, 1), 2 * (window[0] - 1), 1)


class _LocalEnergy(torch.autograd.Function):
    """``y (N, C, *P) -> E (N, C, *(P - k + 1))``, valid mode, SPEC §1.

    ``E = sqrt(V / N)`` when ``normalized`` else ``sqrt(V + eps)``, with
    ``V = max(S2 - S1²/N, 0)`` and ``V`` set to 0 (zero gradient) where it is at or below
    the rounding level of the sums. ``y`` is expected centred (its mean near 0).
    """

    @staticmethod
    def forward(ctx, y, window, method, normalized, eps):
        count = math.prod(window)
        acc = accumulate_dtype(y.dtype, y.device)
        with torch.no_grad():
            if method == "fft":
                # FFT round-off is global, not local: the threshold adds the image's level.
                y_acc = y.to(acc)
                s1, s2 = window_sums(y_acc, y_acc * y_acc, window, "fft")
                level = y_acc.square().mean(tuple(range(2, y.dim())), keepdim=True)
                out, flat = _energy_from_sums(s1, s2, count, normalized, eps, level)
                out, s1 = out.to(y.dtype), s1.to(y.dtype)
            else:
                out, s1, flat = _box_energy_chunked(y, window, acc, count, normalized, eps)
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(y, s1, out, flat)
        ctx.window, ctx.method, ctx.normalized, ctx.count = window, method, normalized, count
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        y, s1, out, flat = ctx.saved_tensors
        count = ctx.count
        # ∂E/∂V = 1 / (2 N E) normalised, 1 / (2 E) otherwise; 0 where V was clamped
        # (E may be 0 there: the inf/nan of the division is overwritten).
        denominator = out * count if ctx.normalized else out
        grad_v = torch.div(grad_out, denominator).mul_(0.5).masked_fill_(flat, 0.0)
        grad_s1 = torch.mul(grad_v, s1).mul_(-2.0 / count)  # ∂L/∂S1 = ∂L/∂V · (-2 S1 / N)
        # ∂L/∂S2 = ∂L/∂V; ∂L/∂y = (∂L/∂S1 ⋆ 𝟙) + 2 y (∂L/∂S2 ⋆ 𝟙), both sums in one go.
        back1, back2 = window_sums_adjoint(grad_s1, grad_v, ctx.window, ctx.method)
        return back1.addcmul_(y, back2, value=2.0), None, None, None, None


def _box_energy_chunked(y, window, acc, count, normalized, eps):
    """The box route of :class:`_LocalEnergy`'s forward, one slab of rows at a time.

    Each slab of output rows reads its rows plus a ``k - 1`` halo, is summed in ``acc``
    and written into its slice of the outputs, so no full-size temporary exists.

    Returns
    -------
    out : Tensor, shape ``(N, C, *S)``, ``y``'s dtype.
    s1 : Tensor, shape ``(N, C, *S)``, ``y``'s dtype: the window sums of ``y``.
    flat : bool Tensor, shape ``(N, C, *S)``.
    """
    out_shape = (*y.shape[:2], *[n - k + 1 for n, k in zip(y.shape[2:], window)])
    out = y.new_empty(out_shape)
    s1_all = y.new_empty(out_shape)
    flat_all = torch.empty(out_shape, dtype=torch.bool, device=y.device)
    rows = _rows_per_chunk(y, window)
    for r0 in range(0, out_shape[2], rows):
        r = min(rows, out_shape[2] - r0)
        piece = y.narrow(2, r0, r + window[0] - 1).to(acc)
        s1, s2 = window_sums(piece, piece * piece, window, "box")
        e, flat = _energy_from_sums(s1, s2, count, normalized, eps)
        out.narrow(2, r0, r).copy_(e)
        s1_all.narrow(2, r0, r).copy_(s1)
        flat_all.narrow(2, r0, r).copy_(flat)
    return out, s1_all, flat_all


def local_energy_valid(
    y: torch.Tensor, window: Sequence[int], *, normalized: bool, eps: float, method: str = "box"
) -> torch.Tensor:
    """Local std or energy of an already centred and padded map, valid mode.

    Parameters
    ----------
    y : Tensor, shape ``(N, C, *P)``, float32 or float64, centred (mean near 0).
    window : box size per spatial axis (any positive sizes, even allowed).
    normalized : bool
        True: ``sqrt(V / N)`` (standard deviation); False: ``sqrt(V + eps)`` (energy).
    eps : float
        Added under the square root when ``normalized`` is False.
    method : {"box", "fft"}

    Returns
    -------
    Tensor, shape ``(N, C, *(P - k + 1))``; differentiable with respect to ``y``.
    """
    if method == "box" and _backend.use_compiled("local_std", y):
        from . import _compiled

        # Same sums (float64) and the same flat rule (the kernel's default factor).
        return _compiled.local_std_valid(y, window, eps, normalized)
    return _LocalEnergy.apply(y, tuple(window), method, normalized, eps)


# --------------------------------------------------------------------------------------
# Public wrapper.
# --------------------------------------------------------------------------------------


def _pick_method(method: str, window: Sequence[int]) -> str:
    # Measured on a 2-core CPU: the box route is O(1) per pixel (prefix sums past
    # DIRECT_MAX_WINDOW) and beat the FFT at every window size tried, in 2D and 3D, and
    # is more accurate in float32 (its round-off is local, the FFT's global).
    return "box" if method == "auto" else method


def _fused_2d(x: torch.Tensor, window: Sequence[int], method: str) -> bool:
    """Whether the compiled 2D kernel that pads and centres itself takes this call (CPU)."""
    return (
        len(window) == 2
        and method == "box"
        and x.device.type == "cpu"
        and _backend.use_compiled("local_std", x)
    )


def centre_and_pad(
    x: torch.Tensor, pads: Sequence[tuple[int, int]], padding: str
) -> torch.Tensor:
    """``x`` minus its detached per-(N, C) mean, padded (SciPy convention).

    For ``padding="zeros"`` the pad value is ``-mean``, so the result equals zero-padding
    the original image and then centring it.

    Parameters
    ----------
    x : Tensor, shape ``(N, C, *S)``
    pads : ``(before, after)`` per spatial axis.

    Returns
    -------
    Tensor, shape ``(N, C, *(S + before + after))``, differentiable with respect to ``x``
    (the mean is a constant: a shift-invariant result has no gradient through it).
    """
    spatial = tuple(range(2, x.dim()))
    mean = x.detach().mean(spatial, keepdim=True)
    padded = pad_spatial(x, pads, mode=padding)
    if padded is x:
        return x - mean
    return padded.sub_(mean)  # the padding's output is ours and its backward needs no values


def local_std(
    x: torch.Tensor,
    window,
    *,
    normalized: bool = True,
    method: str = "auto",
    padding: str = "reflect",
    eps: float = 1e-12,
) -> torch.Tensor:
    """Local standard deviation over an odd box window, differentiable.

    Parameters
    ----------
    x : Tensor, shape ``(N, C, H, W)`` or ``(N, C, D, H, W)``
        float16/bfloat16 (computed in float32), float32 or float64, any device.
    window : int or tuple of int
        Odd window size, one for all spatial axes or one per axis (array-axis order); no
        larger than the image.
    normalized : bool
        True (default): the standard deviation ``sqrt(max(S2 - S1²/N, 0) / N)``, as
        ``sqrt(uniform_filter(x²) - uniform_filter(x)²)``. False: the window energy
        ``sqrt(max(S2 - S1²/N, 0) + eps)``, the denominator of a ZNCC.
    method : {"auto", "box", "fft"}
        "box": separable running/prefix sums, O(1) per pixel; "fft": one batched FFT
        correlation; "auto": the faster for the size (the box route on every size
        measured so far).
    padding : {"reflect", "zeros", "nearest"}
        Boundary handling with SciPy's names ("reflect" is ``uniform_filter``'s default,
        "zeros" its ``mode="constant"``).
    eps : float
        Added under the square root when ``normalized`` is False.

    Returns
    -------
    Tensor, shape of ``x``, dtype of ``x``. Windows whose variance is below the rounding
    level of the sums (flat regions) give 0 (``sqrt(eps)`` unnormalised) and a zero
    gradient; nothing is NaN or Inf.
    """
    check_image(x, "x")
    sizes = check_window(window, x.shape[2:], "window")
    check_choice(method, "method", METHODS)
    check_choice(padding, "padding", PADDING_MODES)
    if not isinstance(normalized, bool):
        raise TypeError(f"normalized must be a bool, got {normalized!r}")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")
    x_compute = to_compute(x)
    method = _pick_method(method, sizes)
    if _fused_2d(x_compute, sizes, method):
        from . import _compiled

        # One kernel reads the image in place: no centred, padded copy (local_std_2d.h).
        out = _compiled.local_std_2d(x_compute, sizes, padding, float(eps), normalized)
        return out.to(x.dtype)
    y = centre_and_pad(x_compute, centred_pads(sizes), padding)
    out = local_energy_valid(y, sizes, normalized=normalized, eps=float(eps), method=method)
    return out.to(x.dtype)
