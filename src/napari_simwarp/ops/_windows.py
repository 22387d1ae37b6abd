"""Separable windows: box (local sums) and normalized Gaussian (local weighted means).

A :class:`Window` only describes the weights; the passes over an image are the
``box_sum`` and ``correlate`` primitives of :mod:`._reference` and :mod:`._kernels`
(docs/maths.md §1.2 and §5.1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: window kernels the moment metrics (local NCC) accept.
KERNELS = ("box", "gaussian")


def gaussian_kernel1d(size: int, sigma: float) -> list[float]:
    """Normalized Gaussian taps ``exp(-t² / 2σ²)``, ``t = -(size//2) .. size//2``.

    Computed in float64 and returned as Python floats, so that a pass uses the same taps
    in every dtype. ``size`` is odd.
    """
    r = size // 2
    w = [math.exp(-0.5 * (t / sigma) ** 2) for t in range(-r, r + 1)]
    s = math.fsum(w)
    return [v / s for v in w]


@dataclass(frozen=True)
class Window:
    """A separable window over the trailing spatial axes.

    ``taps[i]`` are the 1-D weights of axis ``i`` (array-axis order). A box window has
    all-ones taps (local sums, ``total = Π k_i``); a Gaussian window has normalized taps
    (local weighted means, ``total = 1``).
    """

    taps: tuple[tuple[float, ...], ...]
    is_box: bool

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(t) for t in self.taps)

    @property
    def total(self) -> float:
        """Sum of all weights: the ``N`` of the box, 1 for a normalized Gaussian."""
        out = 1.0
        for t in self.taps:
            out *= sum(t)
        return out


def make_window(kind: str, sizes: Sequence[int], sigma: Sequence[float] | None = None) -> Window:
    """A :class:`Window` of odd ``sizes`` per axis; ``sigma`` per axis for ``"gaussian"``."""
    if kind == "box":
        return Window(tuple((1.0,) * k for k in sizes), is_box=True)
    taps = tuple((1.0,) if k == 1 else tuple(gaussian_kernel1d(k, s)) for k, s in zip(sizes, sigma))
    return Window(taps, is_box=False)
