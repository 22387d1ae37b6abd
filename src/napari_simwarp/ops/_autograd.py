"""First derivatives only, refused the same way on every backend.

The analytical backward passes (local std, the moment engine of SSIM and local NCC,
splatting) are not themselves differentiable: a second derivative through them would
otherwise come out silently as zero on one backend and as torch's generic "does not
require grad" on another. Every such backward calls :func:`first_order_only` first.
"""

from __future__ import annotations

import functools

import torch


def first_order_only(op: str) -> None:
    """Raise when a backward is about to be differentiated (``create_graph=True``)."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"{op} has first derivatives only: its analytical backward is not itself "
            "differentiable (create_graph=True / double backward is not supported)"
        )


def first_order_backward(op: str):
    """Decorate an ``autograd.Function.backward``: refuse double backward, run without grad."""

    def decorate(backward):
        @functools.wraps(backward)
        def wrapped(ctx, *grads):
            first_order_only(op)
            with torch.no_grad():
                return backward(ctx, *grads)

        return wrapped

    return decorate
