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


def local_std_valid(xp: torch.Tensor, window, eps: float, normalized: bool) -> torch.Tensor:
    """Fused local std of an already padded ``xp (..., *P)``, valid mode ``(..., *(P - k + 1))``.

    Differentiable with respect to ``xp`` through ``simwarp::local_std_bwd``.
    """
    return torch.ops.simwarp.local_std_fwd(xp, list(window), float(eps), bool(normalized))[0]


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

    @torch.library.register_fake("simwarp::local_std_fwd")
    def _local_std_fwd_fake(xp, window, eps, normalized):
        shape = _window_shape(xp.shape, window, False)
        return xp.new_empty(shape), xp.new_empty(shape), xp.new_empty(shape)

    @torch.library.register_fake("simwarp::local_std_bwd")
    def _local_std_bwd_fake(grad, out, s1, s2, xp, window, normalized):
        return torch.empty_like(xp)

    def _local_std_setup(ctx, inputs, output):
        xp, window, _, normalized = inputs
        out, s1, s2 = output
        ctx.save_for_backward(xp, out, s1, s2)
        ctx.window, ctx.normalized = window, normalized

    def _local_std_backward(ctx, grad_out, grad_s1, grad_s2):
        # S1 and S2 are returned only to be saved for this backward; they are not part of
        # the public result, so their incoming gradients are ignored.
        xp, out, s1, s2 = ctx.saved_tensors
        if grad_out is None:
            return None, None, None, None
        grad_xp = torch.ops.simwarp.local_std_bwd(
            grad_out.contiguous(), out, s1, s2, xp, ctx.window, ctx.normalized
        )
        return grad_xp, None, None, None

    torch.library.register_autograd(
        "simwarp::local_std_fwd", _local_std_backward, setup_context=_local_std_setup
    )
    _registered = True
