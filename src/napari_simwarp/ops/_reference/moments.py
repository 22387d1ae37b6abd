"""The five windowed moments in pure torch: the twin of ``simwarp::moments5``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .window_sums import box_sum_valid, correlate_separable_valid


def moments5(centered: torch.Tensor, taps: Sequence[Sequence[float]]) -> list[torch.Tensor]:
    """The five windowed moments of ``centered = [a, b]`` ``(2, ..., *P)``, valid mode.

    Returns five maps ``(..., *(P - k + 1))``: ``W⋆a, W⋆b, W⋆a², W⋆b², W⋆ab`` with the
    separable window ``taps`` (one sequence per trailing axis; all-ones taps take the
    box-sum route), as views of two fresh buffers the caller owns.
    Not differentiable by itself: the moment engine's backward is explicit
    (docs/maths.md §5.2).
    """
    if all(all(t == 1.0 for t in axis) for axis in taps):
        sizes = [len(axis) for axis in taps]

        def window_pass(x):
            return box_sum_valid(x, sizes)
    else:

        def window_pass(x):
            return correlate_separable_valid(x, taps)

    a, b = centered[0], centered[1]
    products = centered.new_empty((3, *a.shape))
    torch.mul(a, a, out=products[0])
    torch.mul(b, b, out=products[1])
    torch.mul(a, b, out=products[2])
    # Two stacked passes; the products are freed right after theirs.
    first = window_pass(centered)
    second = window_pass(products)
    del products
    return [first[0], first[1], second[0], second[1], second[2]]
