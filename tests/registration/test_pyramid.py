"""Multi-resolution pyramids (registration/pyramid.py) against SciPy's filters and zoom."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import ndimage as ndi

from napari_simwarp.registration.pyramid import (
    auto_levels,
    build_pyramid,
    gaussian_blur,
    level_anisotropy,
    level_shapes,
    resize,
    shrink_factors,
)
from tests.images import random_smooth


def _t(array) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float64))[None, None]


def _levels_by_definition(shape, min_size, max_levels) -> int:
    """The most levels (≤ max_levels, ≥ 1) whose coarsest smallest side is ≥ min_size."""
    best = 1
    for levels in range(1, max_levels + 1):
        if min(shape) / 2 ** (levels - 1) >= min_size:
            best = levels
    return best


@pytest.mark.parametrize(
    "shape",
    [
        (512, 512),
        (256, 300),
        (100, 64),
        (40, 40),
        (31, 200),
        (8, 8),
        (128, 96, 96),
        (48, 64, 40),
        (20, 20, 20),
    ],
)
@pytest.mark.parametrize("max_levels", [3, 5])
def test_auto_levels_keeps_the_coarsest_side_above_the_minimum(shape, max_levels):
    default = 32 if len(shape) == 2 else 16
    assert auto_levels(shape, max_levels=max_levels) == _levels_by_definition(
        shape, default, max_levels
    )
    assert auto_levels(shape, min_size=10, max_levels=max_levels) == _levels_by_definition(
        shape, 10, max_levels
    )


def test_auto_levels_of_a_tiny_image_is_one():
    assert auto_levels((5, 400)) == 1
    assert auto_levels((10, 10, 10)) == 1


@pytest.mark.parametrize(
    "shape,levels", [((100, 37), 3), ((64, 48), 4), ((9, 30, 17), 5), ((256, 256), 1)]
)
def test_level_shapes_halve_from_the_finest(shape, levels):
    shapes = level_shapes(shape, levels)
    assert len(shapes) == levels and shapes[-1] == tuple(shape)
    for k, s in enumerate(reversed(shapes)):
        assert s == tuple(max(1, int(np.round(n / 2**k))) for n in shape)
    assert all(all(a <= b for a, b in zip(c, f)) for c, f in itertools.pairwise(shapes))


def test_an_anisotropic_volume_halves_its_finest_axes_first():
    # z voxels 4x deeper than x and y: z keeps its size until the target pixel size
    # (1, 2, 4, 8, 16 in xy units) passes 4, then halves with the others (ANTs, elastix).
    shapes = level_shapes((40, 256, 256), 5, spacing=(4.0, 1.0, 1.0))
    assert shapes == [(10, 16, 16), (20, 32, 32), (40, 64, 64), (40, 128, 128), (40, 256, 256)]
    assert shrink_factors((4.0, 1.0, 1.0), 3) == (2.0, 8.0, 8.0)
    # 3x: no power of two lands on it; z shrinks by 8/3 at level 3
    assert level_shapes((30, 64, 64), 4, spacing=(3.0, 1.0, 1.0))[0] == (11, 8, 8)
    # Equal spacings, whatever their size, halve every axis per level.
    assert level_shapes((40, 60), 3, spacing=(0.2, 0.2)) == level_shapes((40, 60), 3)


def test_a_moving_image_at_coarser_pixels_joins_the_pyramid_where_its_pixel_size_is_reached():
    # fixed pixels 0.2, moving 0.4: the moving image is not shrunk until the fixed
    # levels reach its pixel size (level 2: 0.8), so both compare at one resolution.
    moving = level_shapes((100, 100), 3, spacing=(0.4, 0.4), unit=0.2)
    assert moving == [(50, 50), (100, 100), (100, 100)]


def test_auto_levels_ignores_an_axis_that_never_shrinks():
    # 12 z slices 5x deeper: isotropically that allows one level only (12 < 16 after
    # halving); z is not shrunk before level 3, where the rule needs z/1.6 >= 16 too.
    assert auto_levels((12, 512, 512)) == 1
    assert auto_levels((12, 512, 512), spacing=(5.0, 1.0, 1.0)) == 3
    assert auto_levels((64, 64), spacing=(0.3, 0.3)) == auto_levels((64, 64))


def test_level_anisotropy_is_nominal_not_thrown_by_rounded_shapes():
    assert level_anisotropy((1.0, 1.0), (64, 50), (16, 13)) == (1.0, 1.0)
    assert level_anisotropy((4.0, 1.0, 1.0), (40, 256, 256), (40, 128, 128)) == (2.0, 1.0, 1.0)
    assert level_anisotropy((4.0, 1.0, 1.0), (40, 256, 256), (10, 16, 16)) == (1.0, 1.0, 1.0)


def test_build_pyramid_blurs_only_the_axes_that_shrink(rng):
    volume = rng.random((6, 32, 32))
    shapes = level_shapes(volume.shape, 2, spacing=(4.0, 1.0, 1.0))
    coarse = build_pyramid(_t(volume), shapes)[0][0, 0].numpy()
    # z keeps its 6 slices and is not smoothed: each slice is that slice's 2-D pyramid
    for z in range(6):
        alone = build_pyramid(_t(volume[z]), [(16, 16), (32, 32)])[0][0, 0].numpy()
        assert np.allclose(coarse[z], alone, atol=1e-12)


def test_gaussian_blur_takes_one_sigma_per_axis(rng):
    image = rng.random((20, 30))
    got = gaussian_blur(_t(image), [0.0, 1.5])[0, 0].numpy()
    ref = ndi.gaussian_filter1d(image, 1.5, axis=1, mode="nearest", truncate=3.0)
    assert np.allclose(got, ref, atol=1e-10)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 1.7, 3.0])
@pytest.mark.parametrize("shape", [(40, 33), (12, 15, 18)])
def test_gaussian_blur_matches_scipy_gaussian_filter(rng, sigma, shape):
    image = rng.random(shape)
    radius = max(1, math.ceil(3 * sigma))
    ref = ndi.gaussian_filter(image, sigma, mode="nearest", radius=radius)
    out = gaussian_blur(_t(image), sigma)
    np.testing.assert_allclose(out[0, 0].numpy(), ref, rtol=0, atol=1e-12)


def test_gaussian_blur_clips_its_radius_on_short_axes_and_skips_length_one(rng):
    image = rng.random((1, 4, 30))
    sigma = 2.0
    # SciPy with the same radii: none along the length-1 axis, n - 1 = 3 along the short one.
    ref = ndi.gaussian_filter(image, (1.0, sigma, sigma), mode="nearest", radius=(0, 3, 6))
    out = gaussian_blur(_t(image), sigma)
    np.testing.assert_allclose(out[0, 0].numpy(), ref, rtol=0, atol=1e-12)


def test_gaussian_blur_with_no_sigma_returns_the_input():
    x = torch.rand(1, 1, 8, 8)
    assert gaussian_blur(x, 0) is x


@pytest.mark.parametrize(
    "shape,new",
    [
        ((32, 40), (16, 20)),
        ((30, 21), (11, 8)),
        ((10, 12), (25, 31)),
        ((12, 10, 14), (6, 5, 7)),
        ((6, 8, 5), (11, 16, 9)),
    ],
)
def test_resize_matches_scipy_zoom_over_the_same_field_of_view(rng, shape, new):
    image = rng.random(shape)
    zoom = [m / n for m, n in zip(new, shape)]
    ref = ndi.zoom(image, zoom, order=1, grid_mode=True, mode="nearest")
    assert ref.shape == new
    out = resize(_t(image), new)
    assert out.shape[2:] == new
    np.testing.assert_allclose(out[0, 0].numpy(), ref, rtol=0, atol=1e-12)


def test_resize_to_the_same_shape_is_a_no_op():
    x = torch.rand(1, 2, 5, 6)
    assert resize(x, (5, 6)) is x


def _block_means(image: np.ndarray, shape) -> np.ndarray:
    """Means over the blocks of ``image`` that each pixel of ``shape`` covers (integer factors)."""
    factors = [n // m for n, m in zip(image.shape, shape)]
    return image.reshape([v for m, f in zip(shape, factors) for v in (m, f)]).mean(
        axis=tuple(range(1, 2 * len(shape), 2))
    )


@pytest.mark.parametrize("shape", [(64, 48), (32, 24, 40)])
def test_build_pyramid_levels_cover_the_same_field_of_view(rng, shape):
    # Blurring and linear resampling leave a linear ramp unchanged away from the borders,
    # and a block's mean is the ramp at the block's center: so the levels must equal the
    # block means exactly there, unless a level is shifted or scaled against the image.
    ramp = np.tensordot(rng.normal(size=len(shape)), np.indices(shape).astype(float), axes=1)
    shapes = level_shapes(shape, 3)
    x = _t(ramp)
    levels = build_pyramid(x, shapes)
    assert [tuple(level.shape[2:]) for level in levels] == shapes
    assert levels[-1] is x
    inner = tuple(slice(3, -3) for _ in shape)  # the blurs' reach of the borders
    for level, s in zip(levels[:-1], shapes):
        np.testing.assert_allclose(
            level[0, 0].numpy()[inner], _block_means(ramp, s)[inner], rtol=0, atol=1e-10
        )


@pytest.mark.parametrize("shape", [(64, 48), (32, 24, 40)])
def test_build_pyramid_levels_of_a_smooth_image_are_near_block_means(rng, shape):
    image = random_smooth(rng, shape, sigma=6.0)  # in [0, 1]
    shapes = level_shapes(shape, 3)
    levels = build_pyramid(_t(image), shapes)
    for level, s in zip(levels, shapes):
        # The anti-aliasing blur is wider than a block, hence the tolerance.
        assert np.abs(level[0, 0].numpy() - _block_means(image, s)).max() < 0.05, s


def test_build_pyramid_antialiases_a_fine_pattern():
    # Lines every third pixel are finer than either coarse level can hold: anti-aliased
    # levels are flat at the pattern's mean (1/3), whereas resampling alone aliases them
    # into coarser stripes (measured: up to 0.17 and 0.33 off the mean).
    i, j = np.indices((96, 96))
    lines = 0.5 * (i % 3 == 0) + 0.5 * (j % 3 == 0)
    levels = build_pyramid(_t(lines), level_shapes((96, 96), 3))
    for level in levels[:2]:
        interior = level[0, 0, 3:-3, 3:-3].numpy()  # the blurs' reach of the borders
        assert np.abs(interior - 1 / 3).max() < 0.05
