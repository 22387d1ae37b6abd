"""Tests for the tiled layout of per-tile centring (``ops._tiles``), against NumPy slicing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from napari_simwarp.ops._tiles import MIN_TILE, TILE_HALOS, TileGrid

CASES = [
    ((10,), (3,)),
    ((70, 62), (9, 9)),
    ((130, 20), (11, 5)),
    ((150, 140), (11, 11)),
    ((22, 24, 20), (5, 5, 5)),
    ((70, 40, 33), (5, 3, 9)),
    ((5, 6), (5, 5)),
]


def _tile_starts(grid: TileGrid):
    return itertools.product(*[[i * t for i in range(c)] for c, t in zip(grid.counts, grid.tile)])


@pytest.mark.parametrize("spatial, window", CASES)
def test_grid_covers_the_outputs(spatial, window):
    grid = TileGrid.for_window(spatial, window)
    for n, k, t, c in zip(spatial, window, grid.tile, grid.counts):
        assert t >= k - 1  # a tile's tail (its halo) fits in the next tile's place
        assert (c - 1) * t < n <= c * t  # every tile holds an output of the image
        assert t <= max(TILE_HALOS * (k - 1), MIN_TILE, k - 1)
    assert grid.padded == tuple(n + k - 1 for n, k in zip(spatial, window))


@pytest.mark.parametrize("spatial, window", CASES)
def test_tiles_are_the_slices_of_the_extended_image(spatial, window):
    grid = TileGrid.for_window(spatial, window)
    x = np.random.default_rng(0).standard_normal((2, 3, *grid.extended))
    tiles = grid.tiles(torch.as_tensor(x)).numpy()
    size = [t + k - 1 for t, k in zip(grid.tile, window)]
    assert tiles.shape == (2, 3, *grid.counts, *size)
    for index, start in zip(itertools.product(*map(range, grid.counts)), _tile_starts(grid)):
        region = tuple(slice(s, s + m) for s, m in zip(start, size))
        np.testing.assert_array_equal(
            tiles[(Ellipsis, *index, *[slice(None)] * len(spatial))], x[(Ellipsis, *region)]
        )


@pytest.mark.parametrize("spatial, window", CASES)
def test_overlap_add_sums_each_tile_back_where_it_was_read(spatial, window):
    grid = TileGrid.for_window(spatial, window)
    size = [t + k - 1 for t, k in zip(grid.tile, window)]
    y = np.random.default_rng(1).standard_normal((2, *grid.counts, *size))
    expected = np.zeros((2, *grid.extended))
    for index, start in zip(itertools.product(*map(range, grid.counts)), _tile_starts(grid)):
        region = tuple(slice(s, s + m) for s, m in zip(start, size))
        expected[(slice(None), *region)] += y[(slice(None), *index)]
    got = grid.overlap_add(torch.as_tensor(y)).numpy()
    crop = tuple(slice(0, p) for p in grid.padded)
    np.testing.assert_allclose(got, expected[(slice(None), *crop)], rtol=0, atol=1e-12)


@pytest.mark.parametrize("spatial, window", CASES)
def test_untile_split_and_zero_outside(spatial, window):
    grid = TileGrid.for_window(spatial, window)
    outputs = np.random.default_rng(2).standard_normal((3, *grid.counts, *grid.tile))
    whole = np.zeros((3, *[c * t for c, t in zip(grid.counts, grid.tile)]))
    for index, start in zip(itertools.product(*map(range, grid.counts)), _tile_starts(grid)):
        region = tuple(slice(s, s + t) for s, t in zip(start, grid.tile))
        whole[(slice(None), *region)] = outputs[(slice(None), *index)]
    image = whole[(slice(None), *[slice(0, n) for n in spatial])]
    np.testing.assert_array_equal(grid.untile(torch.as_tensor(outputs)).numpy(), image)
    # split puts a map back into tiles, zeros past the image.
    past = whole.copy()
    past[(slice(None), *[slice(0, n) for n in spatial])] = 0
    split = grid.split(torch.as_tensor(image)).numpy()
    np.testing.assert_array_equal(grid.untile(torch.as_tensor(split)).numpy(), image)
    zeroed = grid.zero_outside_(torch.as_tensor(outputs.copy())).numpy()
    np.testing.assert_array_equal(zeroed, split)
    assert np.abs(split).sum() == pytest.approx(np.abs(image).sum())
    if past.any():
        assert not np.array_equal(zeroed, outputs)


@pytest.mark.parametrize("spatial, window", CASES)
def test_valid_counts(spatial, window):
    grid = TileGrid.for_window(spatial, window)
    inside = torch.zeros(grid.extended, dtype=torch.float64)
    inside[tuple(slice(0, p) for p in grid.padded)] = 1
    d = len(spatial)
    expected = grid.tiles(inside).sum(tuple(range(-d, 0)), keepdim=True)
    torch.testing.assert_close(grid.valid_counts(inside), expected)
