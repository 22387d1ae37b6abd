"""Fake (shape-only) and autograd registrations of the compiled ``torch.ops.simwarp`` ops.

Registered from Python, once, after the library is loaded (``_backend.build``), so the ops
work under ``torch.compile`` and pass ``torch.library.opcheck``.
"""

from __future__ import annotations

import torch

_registered = False


def _window_shape(shape, window, full: bool) -> list[int]:
    """Trailing ``len(window)`` sizes grown by ``k - 1`` (full) or shrunk by it (valid)."""
    sizes = list(shape)
    first = len(sizes) - len(window)
    for a, k in enumerate(window):
        sizes[first + a] += (k - 1) if full else -(k - 1)
    return sizes


def box_sum(x: torch.Tensor, window, full: bool = False) -> torch.Tensor:
    """Window sums of ``x (..., *S)`` over the trailing ``len(window)`` axes.

    Valid mode gives ``(..., *(S - k + 1))``; ``full=True`` gives ``(..., *(S + k - 1))``
    with zeros outside ``x`` (the adjoint of the valid sum). float32/float64.
    """
    return torch.ops.simwarp.box_sum(x, list(window), full)


def correlate(x: torch.Tensor, taps, transpose: bool = False) -> torch.Tensor:
    """Separable correlation of ``x (..., *S)`` over the trailing ``len(taps)`` axes.

    ``taps[i]`` are the 1-D weights of axis ``i``. Valid mode gives ``(..., *(S - k + 1))``;
    ``transpose=True`` is its adjoint ``(..., *(S + k - 1))``. Differentiable.
    """
    flat = [float(t) for axis in taps for t in axis]
    return torch.ops.simwarp.correlate(x, flat, [len(axis) for axis in taps], transpose)


def moments5(centred: torch.Tensor, taps) -> torch.Tensor:
    """The five windowed moments of ``centred = [a, b]`` ``(2, ..., *P)``, valid mode.

    Returns ``(5, ..., *(P - k + 1))``: ``W⋆a, W⋆b, W⋆a², W⋆b², W⋆ab`` with the separable
    window ``taps`` (one sequence per trailing axis); the products are formed on the fly.
    Not differentiable by itself (the moment engine's backward is explicit).
    """
    flat = [float(t) for axis in taps for t in axis]
    return torch.ops.simwarp.moments5(centred, flat, [len(axis) for axis in taps])


def splat(image: torch.Tensor, displacement: torch.Tensor, normalize: bool, eps: float):
    """Fused splat of ``image (N, C, *S)`` by ``displacement (N, D, *S)`` (same dtype).

    Returns ``(out (N, C, *S), den (N, 1, *S))`` with ``ops.splat``'s semantics (holes 0);
    differentiable with respect to both inputs. Deterministic on CPU.
    """
    return torch.ops.simwarp.splat_fwd(image, displacement, bool(normalize), float(eps))


def local_std_valid(xp: torch.Tensor, window, eps: float, normalized: bool,
                    flat_factor: float | None = None) -> torch.Tensor:
    """Fused local std of a padded, centred ``xp (..., *P)``, valid mode ``(..., *(P - k + 1))``.

    The window sums and ``V = S2 - S1²/N`` are formed in float64 whatever ``xp``'s dtype;
    ``V <= flat_factor · S2`` counts as flat (0, zero gradient), as in ``ops.local_std``.
    Differentiable with respect to ``xp`` through ``simwarp::local_std_bwd``. The default
    ``flat_factor`` is ``ops.local_std``'s rule for float64 sums.
    """
    if flat_factor is None:
        from .local_std import flat_threshold_factor

        flat_factor = flat_threshold_factor(torch.float64)
    out, _, _ = torch.ops.simwarp.local_std_fwd(
        xp, list(window), float(eps), bool(normalized), float(flat_factor)
    )
    return out


def local_std_2d(x: torch.Tensor, window, padding: str, eps: float, normalized: bool,
                 flat_factor: float | None = None) -> torch.Tensor:
    """Fused local std of an image ``x (..., H, W)``, padded and centred inside the kernel.

    ``padding`` is "reflect", "zeros" or "nearest" (output ``(..., H, W)``, as
    ``ops.local_std``) or "valid" (output ``(..., H - kh + 1, W - kw + 1)``). CPU only.
    Sums in float64; the flat rule and ``flat_factor`` default as in :func:`local_std_valid`.
    Differentiable with respect to ``x`` through ``simwarp::local_std_2d_bwd``.
    """
    if flat_factor is None:
        from .local_std import flat_threshold_factor

        flat_factor = flat_threshold_factor(torch.float64)
    out, _, _ = torch.ops.simwarp.local_std_2d_fwd(
        x, list(window), padding, float(eps), bool(normalized), float(flat_factor)
    )
    return out


def register() -> None:
    """Register fake and autograd implementations (idempotent)."""
    global _registered
    if _registered:
        return

    @torch.library.register_fake("simwarp::box_sum")
    def _box_sum_fake(x, window, full=False):
        return x.new_empty(_window_shape(x.shape, window, full))

    def _box_sum_setup(ctx, inputs, output):
        _, ctx.window, ctx.full = inputs

    def _box_sum_backward(ctx, grad):
        # A box is its own flip, so the adjoint of the valid sum is the full sum and back.
        return torch.ops.simwarp.box_sum(grad, ctx.window, not ctx.full), None, None

    torch.library.register_autograd(
        "simwarp::box_sum", _box_sum_backward, setup_context=_box_sum_setup
    )

    @torch.library.register_fake("simwarp::correlate")
    def _correlate_fake(x, taps, sizes, transpose=False):
        return x.new_empty(_window_shape(x.shape, sizes, transpose))

    def _correlate_setup(ctx, inputs, output):
        _, ctx.taps, ctx.sizes, ctx.transpose = inputs

    def _correlate_backward(ctx, grad):
        # The valid correlation and its transpose are each other's adjoints.
        out = torch.ops.simwarp.correlate(grad.contiguous(), ctx.taps, ctx.sizes, not ctx.transpose)
        return out, None, None, None

    torch.library.register_autograd(
        "simwarp::correlate", _correlate_backward, setup_context=_correlate_setup
    )

    @torch.library.register_fake("simwarp::moments5")
    def _moments5_fake(centred, taps, sizes):
        shape = _window_shape(centred.shape, sizes, False)
        shape[0] = 5
        return centred.new_empty(shape)

    @torch.library.register_fake("simwarp::splat_fwd")
    def _splat_fwd_fake(image, displacement, normalize, eps):
        n, _, *spatial = image.shape
        return torch.empty_like(image), image.new_empty(n, 1, *spatial)

    @torch.library.register_fake("simwarp::splat_bwd")
    def _splat_bwd_fake(v_out, v_den, image, displacement, out, den, normalize, eps):
        return torch.empty_like(image), torch.empty_like(displacement)

    def _splat_setup(ctx, inputs, output):
        image, displacement, ctx.normalize, ctx.eps = inputs
        out, den = output
        ctx.save_for_backward(image, displacement, out, den)

    def _splat_backward(ctx, v_out, v_den):
        image, displacement, out, den = ctx.saved_tensors
        grad_image, grad_disp = torch.ops.simwarp.splat_bwd(
            v_out, v_den, image, displacement, out, den, ctx.normalize, ctx.eps
        )
        return grad_image, grad_disp, None, None

    torch.library.register_autograd(
        "simwarp::splat_fwd", _splat_backward, setup_context=_splat_setup
    )

    @torch.library.register_fake("simwarp::local_std_fwd")
    def _local_std_fwd_fake(xp, window, eps, normalized, flat_factor):
        shape = _window_shape(xp.shape, window, False)
        return xp.new_empty(shape), xp.new_empty(shape), xp.new_empty(shape, dtype=torch.bool)

    @torch.library.register_fake("simwarp::local_std_bwd")
    def _local_std_bwd_fake(grad, out, s1, flat, xp, window, normalized):
        return torch.empty_like(xp)

    def _local_std_setup(ctx, inputs, output):
        xp, window, _, normalized, _ = inputs
        out, s1, flat = output
        ctx.save_for_backward(xp, out, s1, flat)
        ctx.window, ctx.normalized = window, normalized

    def _local_std_backward(ctx, grad_out, grad_s1, grad_flat):
        # S1 and the flat mask are returned only to be saved for this backward; they are
        # not part of the public result, so their incoming gradients are ignored.
        xp, out, s1, flat = ctx.saved_tensors
        if grad_out is None:
            return None, None, None, None, None
        grad_xp = torch.ops.simwarp.local_std_bwd(
            grad_out.contiguous(), out, s1, flat, xp, ctx.window, ctx.normalized
        )
        return grad_xp, None, None, None, None

    torch.library.register_autograd(
        "simwarp::local_std_fwd", _local_std_backward, setup_context=_local_std_setup
    )

    @torch.library.register_fake("simwarp::local_std_2d_fwd")
    def _local_std_2d_fwd_fake(x, window, padding, eps, normalized, flat_factor):
        shape = list(x.shape) if padding != "valid" else _window_shape(x.shape, window, False)
        return x.new_empty(shape), x.new_empty(shape), x.new_empty(shape, dtype=torch.bool)

    @torch.library.register_fake("simwarp::local_std_2d_bwd")
    def _local_std_2d_bwd_fake(grad, out, s1, flat, x, window, padding, normalized):
        return torch.empty_like(x)

    def _local_std_2d_setup(ctx, inputs, output):
        x, window, padding, _, normalized, _ = inputs
        out, s1, flat = output
        ctx.save_for_backward(x, out, s1, flat)
        ctx.window, ctx.padding, ctx.normalized = window, padding, normalized

    def _local_std_2d_backward(ctx, grad_out, grad_s1, grad_flat):
        # As local_std_fwd: S1 and the flat mask are saved state, not results.
        x, out, s1, flat = ctx.saved_tensors
        if grad_out is None:
            return None, None, None, None, None, None
        grad_x = torch.ops.simwarp.local_std_2d_bwd(
            grad_out.contiguous(), out, s1, flat, x, ctx.window, ctx.padding, ctx.normalized
        )
        return grad_x, None, None, None, None, None

    torch.library.register_autograd(
        "simwarp::local_std_2d_fwd", _local_std_2d_backward, setup_context=_local_std_2d_setup
    )
    _registered = True
