"""First derivatives only, refused the same way on every backend.

The analytical backward passes (local std, the moment engine of SSIM and local NCC,
splatting) are not themselves differentiable. torch's ``once_differentiable`` does not
always notice a second derivative (``torch.autograd.grad`` with ``create_graph=True``
can drop the missing term silently when other parts of the graph are differentiable), so
these backward passes refuse to run at all while a graph of the gradient is being built:
one clear error, on the pure torch path and on the kernels alike.
"""

from __future__ import annotations

import functools

import torch


def first_order_only(op: str) -> None:
    """Raise when a backward is run with ``create_graph=True`` (grad mode on in backward)."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"{op} has first derivatives only: its analytical backward is not itself "
            "differentiable, so gradients through it cannot be built with create_graph=True "
            "(second derivatives, gradient penalties)"
        )


def first_order_backward(op: str):
    """Decorate a ``backward(ctx, *grads)``: refuse ``create_graph=True``, run without grad."""

    def decorate(backward):
        @functools.wraps(backward)
        def wrapped(ctx, *grads):
            first_order_only(op)
            with torch.no_grad():
                return backward(ctx, *grads)

        return wrapped

    return decorate


def fused_pair_forward(ctx, forward, a, b, taps, params, reduction: str, library):
    """The forward of a fused CUDA pair metric (SSIM, local NCC): ``forward(a, b, taps,
    *params, need, library)`` gives ``(map, partials, shifts)``; the partial maps and tile
    shifts are kept for :func:`fused_pair_backward` where a gradient is needed. Returns the
    map ``(N, C, *S)``, or its mean with ``reduction="mean"``."""
    need = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
    out, partials, shifts = forward(a, b, taps, *params, need, library)
    ctx.taps, ctx.library, ctx.reduction, ctx.numel = taps, library, reduction, out.numel()
    if need:
        ctx.save_for_backward(a, b, partials, shifts)
    return out.mean() if reduction == "mean" else out


def fused_pair_backward(ctx, backward, grad_out):
    """``(grad_a, grad_b)`` of :func:`fused_pair_forward`'s metric by one kernel,
    ``backward(grad, a, b, partials, shifts, taps, library)`` (None where not needed)."""
    a, b, partials, shifts = ctx.saved_tensors
    if ctx.reduction == "mean":  # one value on the device: no sync, no expanded map
        grad = (grad_out.to(a.dtype) / ctx.numel).reshape(1)
    else:
        grad = grad_out.to(a.dtype).contiguous()
    grad_a, grad_b = backward(grad, a, b, partials, shifts, ctx.taps, ctx.library)
    return (
        grad_a if ctx.needs_input_grad[0] else None,
        grad_b if ctx.needs_input_grad[1] else None,
    )
