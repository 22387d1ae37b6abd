"""Local standard deviation in pure torch: the twins of ``simwarp::local_std_fwd``/``_2d``.

docs/maths.md §1: the window sums ``S1 = Σy``, ``S2 = Σy²`` of an input that is already
centered (its mean near 0) and padded, ``V = S2 - S1²/N``, and the analytical backward
``∂L/∂y = 𝟙ᵀ⋆(∂L/∂S1) + 2y · 𝟙ᵀ⋆(∂L/∂S2)`` (the two adjoint box sums). For float32 data
the sums run in float64 on the CPU, in slabs of rows, so that no full-size temporary
exists; on GPUs and MPS (``_numerics.moment_dtype``), where float64 is slow or missing,
they run as compensated float32 sums (:mod:`.compensated`, as the CUDA kernels do).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .._autograd import first_order_backward
from .._numerics import flat_threshold_factor, moment_dtype
from .._padding import centered_pads, pad_spatial
from ..fft_cc import fft_cc
from . import compensated as _compensated
from . import window_sums as _window_sums
from .window_sums import box_sum_valid


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


def _energy_from_sums(s1, s2, count, normalize, eps, global_level=None):
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
    out = variance.div_(count) if normalize else variance.add_(eps)
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
    return max(_window_sums.CHUNK_BYTES // max(slab, 1), 2 * (window[0] - 1), 1)


class _LocalEnergy(torch.autograd.Function):
    """``y (N, C, *P) -> E (N, C, *(P - k + 1))``, valid mode, docs/maths.md §1.1.

    ``E = sqrt(V / N)`` when ``normalize`` else ``sqrt(V + eps)``, with
    ``V = max(S2 - S1²/N, 0)`` and ``V`` set to 0 (zero gradient) where it is at or below
    the rounding level of the sums. ``y`` is expected centered (its mean near 0).
    """

    @staticmethod
    def forward(ctx, y, window, method, normalize, eps):
        count = math.prod(window)
        acc = moment_dtype(y.dtype, y.device)
        with torch.no_grad():
            if method == "box" and acc == torch.float32:
                # GPUs and MPS: float32 throughout, the sums compensated (no float64).
                out, s1, flat = _box_energy_compensated(y, window, count, normalize, eps)
            elif method == "fft":
                # FFT round-off is global, not local: the threshold adds the image's level.
                y_acc = y.to(acc)
                s1, s2 = window_sums(y_acc, y_acc * y_acc, window, "fft")
                level = y_acc.square().mean(tuple(range(2, y.dim())), keepdim=True)
                out, flat = _energy_from_sums(s1, s2, count, normalize, eps, level)
                out, s1 = out.to(y.dtype), s1.to(y.dtype)
            else:
                out, s1, flat = _box_energy_chunked(y, window, acc, count, normalize, eps)
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(y, s1, out, flat)
        ctx.window, ctx.method, ctx.normalize, ctx.count = window, method, normalize, count
        return out

    @staticmethod
    @first_order_backward("local_std")
    def backward(ctx, grad_out):
        y, s1, out, flat = ctx.saved_tensors
        count = ctx.count
        # ∂E/∂V = 1 / (2 N E) normalized, 1 / (2 E) otherwise; 0 where V was clamped
        # (E may be 0 there: the inf/nan of the division is overwritten).
        denominator = out * count if ctx.normalize else out
        grad_v = torch.div(grad_out, denominator).mul_(0.5).masked_fill_(flat, 0.0)
        grad_s1 = torch.mul(grad_v, s1).mul_(-2.0 / count)  # ∂L/∂S1 = ∂L/∂V · (-2 S1 / N)
        # ∂L/∂S2 = ∂L/∂V; ∂L/∂y = (∂L/∂S1 ⋆ 𝟙) + 2 y (∂L/∂S2 ⋆ 𝟙), both sums in one go.
        back1, back2 = window_sums_adjoint(grad_s1, grad_v, ctx.window, ctx.method)
        return back1.addcmul_(y, back2, value=2.0), None, None, None, None


#: the flat rule of compensated float32 sums (about 48 significant bits), the CUDA
#: kernels' (``_kernels.calls.COMPENSATED_FLOAT32_FLAT_FACTOR``)
COMPENSATED_FLAT_FACTOR = 64.0 * 2.0**-48


def _box_energy_compensated(y, window, count, normalize, eps):
    """The box route of :class:`_LocalEnergy`'s forward in float32 only: compensated sums.

    ``y`` is first brought into ``[-1, 1]`` by an exact power of two per (N, C), so that
    the squares' rounding errors neither overflow nor underflow; ``V`` is scaled back.

    Returns
    -------
    out, s1, flat : as :func:`_box_energy_chunked`.
    """
    from .._nonfinite import power_of_two_scale  # imports this package: not at the top

    dims = tuple(range(2, y.dim()))
    scale = power_of_two_scale(y, dims)
    s1, s2, v = _compensated.window_variance(y * scale, window)
    flat = v <= s2.mul_(COMPENSATED_FLAT_FACTOR)
    v.masked_fill_(flat, 0.0)
    inverse = scale.reciprocal()  # a power of two: exact
    v.mul_(inverse * inverse)
    out = v.div_(count) if normalize else v.add_(eps)
    return out.sqrt_(), s1.mul_(inverse), flat


def _box_energy_chunked(y, window, acc, count, normalize, eps):
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
        e, flat = _energy_from_sums(s1, s2, count, normalize, eps)
        out.narrow(2, r0, r).copy_(e)
        s1_all.narrow(2, r0, r).copy_(s1)
        flat_all.narrow(2, r0, r).copy_(flat)
    return out, s1_all, flat_all


def center_and_pad(x: torch.Tensor, pads: Sequence[tuple[int, int]], padding: str) -> torch.Tensor:
    """``x`` minus its detached per-(N, C) mean, padded (SciPy convention).

    Padding comes first, then the centering, so ``padding="constant"`` pads with
    ``-mean``: the result equals zero-padding the original image and centering it.

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


def local_std_valid(
    y: torch.Tensor,
    window: Sequence[int],
    eps: float,
    normalize: bool,
    flat_factor: float | None = None,
    *,
    method: str = "box",
) -> torch.Tensor:
    """Local std or energy of an already centered and padded map, valid mode.

    Parameters
    ----------
    y : Tensor, shape ``(N, C, *P)``, float32 or float64, centered (mean near 0).
    window : box size per spatial axis (any positive sizes, even allowed).
    eps : float
        Added under the square root when ``normalize`` is False.
    normalize : bool
        True: ``sqrt(V / N)`` (standard deviation); False: ``sqrt(V + eps)`` (energy).
    flat_factor : float, optional
        Unused: the flat rule follows the dtype the sums run in
        (:func:`~.._numerics.flat_threshold_factor`); accepted for the kernel's signature.
    method : {"box", "fft"}
        "box": separable O(1)-per-pixel sums; "fft": one batched FFT correlation.

    Returns
    -------
    Tensor, shape ``(N, C, *(P - k + 1))``; differentiable with respect to ``y``.
    """
    return _LocalEnergy.apply(y, tuple(window), method, normalize, float(eps))


def local_std_2d(
    x: torch.Tensor,
    window: Sequence[int],
    padding: str,
    eps: float,
    normalize: bool,
    flat_factor: float | None = None,
) -> torch.Tensor:
    """Local std of images ``x (N, C, *S)``, centered and padded first (any dimension).

    ``padding`` is one of :data:`~.._padding.PADDINGS` (output ``(N, C, *S)``) or "valid"
    (output ``(N, C, *(S - k + 1))``), as the fused CPU kernel takes it.
    """
    pads = [(0, 0)] * len(window) if padding == "valid" else centered_pads(window)
    mode = "constant" if padding == "valid" else padding
    return local_std_valid(center_and_pad(x, pads, mode), window, eps, normalize)
