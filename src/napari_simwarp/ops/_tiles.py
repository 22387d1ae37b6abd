"""Tiles of a padded image, each with its halo: the layout of per-tile centring.

The moment engine (``_moments``) sums in float32 on GPUs, where float64 runs at 1/64 of
the float32 rate on most cards. A window's variance ``W⋆a² - (W⋆a)²`` then keeps a
rounding error of about ``eps · (local mean - shift)²``, so the shift must sit near every
window's mean, not only near the image's (docs/maths.md §1.3). Cutting the output into
tiles and shifting each tile's input (the tile plus a halo of ``k - 1``) by its own
constant does that, and stays exact: every window lies inside one tile's input, and
moments about any constant give the same variances and covariances.

For a padded image ``(..., *P)``, ``P = S + k - 1``, a :class:`TileGrid` of tile sizes
``T`` (per axis, ``T >= k - 1``) and counts ``n = ceil(S / T)`` gives

    tiles      (..., *n, *(T + k - 1))    overlapping views of the padded image, extended
                                          past ``P`` to ``n T + k - 1`` (the caller fills
                                          the extension; only outputs past ``S`` see it)
    outputs    (..., *n, *T)              valid passes over the tiles; past ``S``: unused

and the maps back: :meth:`TileGrid.untile` (outputs to ``(..., *S)``; its adjoint is
:meth:`TileGrid.split`) and :meth:`TileGrid.overlap_add` (the adjoint of the tile views:
gradients over the tiles' inputs to ``(..., *P)``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: A tile's edge is ``TILE_HALOS`` halos (``k - 1``), at least ``MIN_TILE``: the tiles'
#: inputs then hold at most ``(1 + 1/4)^d`` of the image (1.6x in 2D, 2x in 3D), and small
#: windows, whose few weights make them the most sensitive to the rounding, get tiles
#: centred close to their means. Largest error of local NCC against float64 on the test
#: suite's microscopy images (offset 1000, background 150, blobs 400, noise 5), from the
#: tiles alone (before ``_moments`` redoes risky windows two-pass): 2D Gaussian window 9,
#: 7.5e-6 with these tiles against 1.3e-4 with one shift per image; 3D Gaussian window 5,
#: 6.7e-5 against 2.5e-4 (docs/maths.md §1.3).
TILE_HALOS = 4
MIN_TILE = 16


@dataclass(frozen=True)
class TileGrid:
    """Output tiles of a valid window pass over a padded image.

    ``spatial`` is ``S`` (the outputs), ``window`` the window's size ``k`` per axis,
    ``tile`` the tile's size ``T`` per axis (``k - 1 <= T``), ``counts`` the tiles per
    axis, ``ceil(S / T)``.
    """

    spatial: tuple[int, ...]
    window: tuple[int, ...]
    tile: tuple[int, ...]

    @classmethod
    def for_window(cls, spatial: Sequence[int], window: Sequence[int]) -> TileGrid:
        """The grid for outputs ``spatial`` of a window of ``window`` (each ``k <= S``)."""
        tile = []
        for n, k in zip(spatial, window):
            count = -(-n // max(TILE_HALOS * (k - 1), MIN_TILE))
            tile.append(max(-(-n // count), k - 1))  # tiles of equal size, little past S
        return cls(tuple(spatial), tuple(window), tuple(tile))

    @property
    def dims(self) -> int:
        return len(self.spatial)

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(-(-n // t) for n, t in zip(self.spatial, self.tile))

    @property
    def padded(self) -> tuple[int, ...]:
        """``P = S + k - 1``: the padded image the tiles cover."""
        return tuple(n + k - 1 for n, k in zip(self.spatial, self.window))

    @property
    def extended(self) -> tuple[int, ...]:
        """``n T + k - 1``: the padded image extended so that every tile is whole."""
        return tuple(c * t + k - 1 for c, t, k in zip(self.counts, self.tile, self.window))

    def tiles(self, extended: torch.Tensor) -> torch.Tensor:
        """Overlapping tile views ``(..., *n, *(T + k - 1))`` of ``(..., *extended)``."""
        lead, out = extended.dim() - self.dims, extended
        for axis, (t, k) in enumerate(zip(self.tile, self.window)):
            # unfold turns the axis into the tile index, in place, and appends the tile's
            # samples after the last axis.
            out = out.unfold(lead + axis, t + k - 1, t)
        return out

    def valid_counts(self, like: torch.Tensor) -> torch.Tensor:
        """Samples of each tile's input that lie in ``P``, shape ``(*n, *(1,) * d)``."""
        per_axis = []
        for axis, (c, t, k, p) in enumerate(zip(self.counts, self.tile, self.window, self.padded)):
            starts = torch.arange(c, device=like.device) * t
            size = torch.clamp(p - starts, max=t + k - 1).to(like.dtype)
            per_axis.append(size.reshape([c if j == axis else 1 for j in range(self.dims)]))
        return math.prod(per_axis).reshape(*self.counts, *(1,) * self.dims)

    def zero_outside_(self, outputs: torch.Tensor) -> torch.Tensor:
        """Zero, in place, the outputs ``(..., *n, *T)`` that lie past ``S``."""
        d = self.dims
        for axis, (n, t, c) in enumerate(zip(self.spatial, self.tile, self.counts)):
            inside = n - (c - 1) * t  # outputs of the last tile that lie in S
            if inside < t:
                last = outputs.narrow(outputs.dim() - 2 * d + axis, c - 1, 1)
                last.narrow(outputs.dim() - d + axis, inside, t - inside).zero_()
        return outputs

    def _interleaved(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., *n, *T')`` viewed as ``(..., n_0, T'_0, n_1, T'_1, ...)``."""
        lead, d = x.dim() - 2 * self.dims, self.dims
        order = [*range(lead)]
        for axis in range(d):
            order += [lead + axis, lead + d + axis]
        return x.permute(order)

    def untile(self, outputs: torch.Tensor) -> torch.Tensor:
        """Outputs ``(..., *n, *T)`` as one map ``(..., *S)`` (a copy)."""
        lead = outputs.shape[: outputs.dim() - 2 * self.dims]
        whole = self._interleaved(outputs).reshape(
            *lead, *[c * t for c, t in zip(self.counts, self.tile)]
        )
        for axis, n in enumerate(self.spatial):
            whole = whole.narrow(len(lead) + axis, 0, n)
        return whole

    def split(self, image: torch.Tensor) -> torch.Tensor:
        """The adjoint of :meth:`untile`: a map ``(..., *S)`` as outputs ``(..., *n, *T)``,
        zeros past ``S`` (a copy)."""
        d = self.dims
        lead = image.shape[: image.dim() - d]
        flat = []
        for n, c, t in zip(reversed(self.spatial), reversed(self.counts), reversed(self.tile)):
            flat += [0, c * t - n]
        padded = torch.nn.functional.pad(image, flat)
        blocks = padded.reshape(*lead, *itertools.chain.from_iterable(zip(self.counts, self.tile)))
        order = [*range(len(lead))]
        order += [len(lead) + 2 * axis for axis in range(d)]
        order += [len(lead) + 2 * axis + 1 for axis in range(d)]
        return blocks.permute(order).contiguous()

    def overlap_add(self, tiles: torch.Tensor) -> torch.Tensor:
        """The adjoint of :meth:`tiles`, cropped: ``(..., *n, *(T + k - 1)) -> (..., *P)``.

        Each tile's sample goes back to the place it was read from, overlapping halos
        adding up. A tile splits per axis into its first ``T`` samples (its own place) and
        a tail of ``k - 1 <= T`` (the start of the next tile's place): ``2^d`` strided adds.
        """
        d = self.dims
        lead = tiles.shape[: tiles.dim() - 2 * d]
        source = self._interleaved(tiles)
        out = tiles.new_zeros(
            [
                *lead,
                *itertools.chain.from_iterable((c + 1, t) for c, t in zip(self.counts, self.tile)),
            ]
        )
        for parts in itertools.product((False, True), repeat=d):
            src, dst = [slice(None)] * len(lead), [slice(None)] * len(lead)
            for tail, c, t, k in zip(parts, self.counts, self.tile, self.window):
                inner = slice(t, t + k - 1) if tail else slice(0, t)
                src += [slice(None), inner]
                dst += [
                    slice(1, c + 1) if tail else slice(0, c),
                    slice(0, inner.stop - inner.start),
                ]
            out[tuple(dst)] += source[tuple(src)]
        whole = out.reshape(*lead, *[(c + 1) * t for c, t in zip(self.counts, self.tile)])
        for axis, p in enumerate(self.padded):
            whole = whole.narrow(len(lead) + axis, 0, p)
        return whole
