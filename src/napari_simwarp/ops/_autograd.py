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
