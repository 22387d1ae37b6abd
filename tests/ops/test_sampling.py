"""Coordinates and sampling helpers (ops/_sampling.py) against the align_corners=True
normalization formula, ``torch.nn.functional.grid_sample`` and SciPy's
``map_coordinates`` / ``affine_transform`` / ``zoom``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import ndimage as ndi

from napari_simwarp.ops import _sampling
from napari_simwarp.ops._sampling import (
    WARP_PADDINGS,
    affine_grid,
    affine_to_theta,
    displacement_to_grid,
    grid_inside,
    grid_sample,
    identity_grid,
    level_matrix,
    level_to_full,
    pixel_to_grid,
    sample_affine,
    sample_displaced,
)
from tests.images import random_smooth


def _t(array) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float64))


def _normalized(coords: np.ndarray, shape) -> np.ndarray:
    """``(D, *P)`` pixel coordinates → ``(*P, D)`` in grid_sample's ``(x, y[, z])`` order,
    ``u = 2 p / (n - 1) - 1`` per axis (align_corners=True), 0 on an axis of length 1."""
    parts = [2 * c / (n - 1) - 1 if n > 1 else np.zeros_like(c) for c, n in zip(coords, shape)]
    return np.stack(parts[::-1], axis=-1)


def _random_affine(rng, d: int, scale: float = 0.15, shift: float = 2.0) -> np.ndarray:
    m = np.eye(d + 1)
    m[:d, :d] += rng.normal(0.0, scale, (d, d))
    m[:d, d] = rng.normal(0.0, shift, d)
    return m


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 5), (1, 6)])
def test_identity_grid_holds_each_pixels_index(shape):
    grid = identity_grid(shape, dtype=torch.float64)
    assert grid.shape == (1, len(shape), *shape) and grid.dtype == torch.float64
    np.testing.assert_array_equal(grid[0].numpy(), np.indices(shape))


class TestPixelToGrid:
    @pytest.mark.parametrize(
        "shape,in_shape", [((5, 7), (9, 11)), ((3, 4, 5), (6, 7, 8)), ((4, 5), (1, 8))]
    )
    def test_matches_the_align_corners_formula(self, rng, shape, in_shape):
        coords = rng.uniform(-3, 12, (2, len(shape), *shape))
        grid = pixel_to_grid(_t(coords), in_shape)
        assert grid.shape == (2, *shape, len(shape))
        for n in range(2):
            np.testing.assert_allclose(
                grid[n].numpy(), _normalized(coords[n], in_shape), rtol=0, atol=1e-14
            )

    @pytest.mark.parametrize("shape", [(6, 9), (4, 5, 7)])
    def test_grid_sample_reads_the_pixels_named(self, rng, shape):
        image = rng.random(shape)
        idx = np.stack([rng.integers(0, n, 20) for n in shape])  # (D, 20) integer pixels
        coords = idx.astype(float).reshape(1, len(shape), 20, *([1] * (len(shape) - 1)))
        grid = pixel_to_grid(_t(coords), shape)
        out = F.grid_sample(_t(image)[None, None], grid, align_corners=True)
        np.testing.assert_allclose(out.flatten().numpy(), image[tuple(idx)], atol=1e-12)

    def test_fractional_positions_match_scipy_linear(self, rng):
        image = rng.random((10, 13))
        coords = np.stack([rng.uniform(0, 9, (6, 7)), rng.uniform(0, 12, (6, 7))])
        grid = pixel_to_grid(_t(coords)[None], image.shape)
        out = F.grid_sample(_t(image)[None, None], grid, align_corners=True)
        np.testing.assert_allclose(
            out[0, 0].numpy(), ndi.map_coordinates(image, coords, order=1), atol=1e-12
        )

    def test_component_count_must_match_shape(self):
        with pytest.raises(ValueError, match="coords has 2 components but shape has 3 axes"):
            pixel_to_grid(torch.zeros(1, 2, 4, 4), (4, 4, 4))

    def test_gradient_is_the_normalizing_scale(self):
        coords = torch.rand(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda c: pixel_to_grid(c, (7, 9)), (coords,))
        grid = pixel_to_grid(coords, (7, 1))
        (g,) = torch.autograd.grad(grid.sum(), coords)
        np.testing.assert_allclose(g[0, 0].numpy(), 2 / 6)  # rows: n = 7
        np.testing.assert_allclose(g[0, 1].numpy(), 0.0)  # a length-1 axis


class TestDisplacementToGrid:
    @pytest.mark.parametrize("shape", [(5, 7), (3, 4, 6), (1, 8)])
    def test_matches_the_formula_of_x_plus_d(self, rng, shape):
        d = rng.normal(0, 2, (2, len(shape), *shape))
        grid = displacement_to_grid(_t(d), shape)
        positions = np.indices(shape)[None] + d
        for n in range(2):
            np.testing.assert_allclose(
                grid[n].numpy(), _normalized(positions[n], shape), rtol=0, atol=1e-13
            )

    def test_origin_and_a_larger_sampled_shape(self, rng):
        d = rng.normal(0, 1, (1, 2, 4, 5))
        grid = displacement_to_grid(_t(d), (6, 9), origin=(1.0, 2.0))
        positions = np.indices((4, 5)) + np.array([1.0, 2.0]).reshape(2, 1, 1) + d[0]
        np.testing.assert_allclose(grid[0].numpy(), _normalized(positions, (6, 9)), atol=1e-13)

    @pytest.mark.parametrize("shape", [(12, 15), (6, 7, 8)])
    def test_grid_sample_equals_scipy_map_coordinates(self, rng, shape):
        image = random_smooth(rng, shape)
        d = rng.uniform(-2, 2, (len(shape), *shape))
        grid = displacement_to_grid(_t(d)[None], shape)
        out = F.grid_sample(_t(image)[None, None], grid, align_corners=True, padding_mode="border")
        ref = ndi.map_coordinates(image, np.indices(shape) + d, order=1, mode="nearest")
        np.testing.assert_allclose(out[0, 0].numpy(), ref, atol=1e-12)

    def test_gradcheck(self):
        d = torch.rand(2, 2, 3, 4, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda x: displacement_to_grid(x, (3, 4)), (d,))


class TestAffine:
    @pytest.mark.parametrize(
        "in_shape,out_shape",
        [
            ((20, 24), (20, 24)),
            ((20, 24), (13, 31)),
            ((9, 11, 10), (7, 12, 8)),
            # grids of SMALL_GRID points and more are built per axis, not by F.affine_grid
            ((200, 180), (190, 210)),
            ((1, 200, 180), (1, 190, 210)),
            ((30, 34, 32), (33, 31, 36)),
        ],
    )
    def test_affine_grid_sample_reproduces_scipy_affine_transform(self, rng, in_shape, out_shape):
        d = len(in_shape)
        image = random_smooth(rng, in_shape)
        matrices = np.stack([_random_affine(rng, d) for _ in range(3)])
        grid = affine_grid(_t(matrices), in_shape, out_shape)
        assert grid.shape == (3, *out_shape, d)
        out = F.grid_sample(
            _t(image)[None, None].expand(3, 1, *in_shape),
            grid,
            align_corners=True,
            padding_mode="border",
        )
        for m, got in zip(matrices, out):
            ref = ndi.affine_transform(image, m, output_shape=out_shape, order=1, mode="nearest")
            np.testing.assert_allclose(got[0].numpy(), ref, atol=1e-12)

    @pytest.mark.parametrize("out_shape", [(6, 5), (1, 4, 3), (3, 4, 2)])
    def test_affine_grid_per_axis_is_f_affine_grid_and_differentiable(
        self, rng, monkeypatch, out_shape
    ):
        d = len(out_shape)
        matrices = _t(np.stack([_random_affine(rng, d) for _ in range(2)]))
        theta = affine_to_theta(matrices, (7,) * d, out_shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch notes its unit-size grids changed in 1.3
            expected = F.affine_grid(theta, (2, 1, *out_shape), align_corners=True)
        monkeypatch.setattr(_sampling, "SMALL_GRID", 0)
        got = affine_grid(matrices, (7,) * d, out_shape)
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=1e-15)
        assert affine_grid(matrices, (7,) * d, out_shape, torch.float32).dtype == torch.float32
        m = matrices.clone().requires_grad_()
        assert torch.autograd.gradcheck(lambda x: affine_grid(x, (7,) * d, out_shape), (m,))

    def test_theta_is_the_normalized_matrix(self, rng):
        # theta maps normalized output (x, y) to normalized input (x, y): check it on points.
        in_shape, out_shape = (9, 14), (6, 5)
        m = _random_affine(rng, 2)
        theta = affine_to_theta(_t(m)[None], in_shape, out_shape)[0].numpy()
        assert theta.shape == (2, 3)
        p = np.stack([rng.uniform(0, 5, 10), rng.uniform(0, 4, 10)])  # output pixels (y, x)
        q = (m @ np.vstack([p, np.ones(10)]))[:2]
        u_out = _normalized(p, out_shape)  # (10, 2) as (x, y)
        u_in = _normalized(q, in_shape)
        np.testing.assert_allclose(u_out @ theta[:, :2].T + theta[:, 2], u_in, atol=1e-12)

    def test_theta_gradcheck(self, rng):
        m = _t(_random_affine(rng, 3))[None].requires_grad_()
        assert torch.autograd.gradcheck(lambda x: affine_to_theta(x, (5, 6, 7), (4, 3, 8)), (m,))

    @pytest.mark.parametrize("padding", WARP_PADDINGS)
    def test_sample_affine_with_a_length_one_axis_matches_scipy(self, rng, padding):
        image = rng.random((1, 9))
        m = np.array([[1.0, 0.0, 0.3], [0.05, 1.0, -1.2], [0, 0, 1]])
        out = sample_affine(_t(image)[None, None], _t(m)[None], (3, 9), "linear", padding)
        ref = ndi.affine_transform(image, m, output_shape=(3, 9), order=1, mode=padding)
        np.testing.assert_allclose(out[0, 0].numpy(), ref, atol=1e-12)


class TestGridSample:
    @pytest.mark.parametrize("padding", WARP_PADDINGS)
    @pytest.mark.parametrize("shape", [(7, 9), (5, 6, 4)])
    def test_each_scipy_padding_outside_the_image(self, rng, padding, shape):
        # Positions well outside the image on every side, up to 1.3 image widths away.
        image = rng.random(shape)
        coords = np.stack([rng.uniform(-1.3 * n, 2.3 * n - 1, (40,)) for n in shape])
        coords = coords.reshape(len(shape), 40, *([1] * (len(shape) - 1)))
        grid = pixel_to_grid(_t(coords)[None], shape)
        out = grid_sample(_t(image)[None, None], grid, "linear", padding)
        ref = ndi.map_coordinates(image, coords, order=1, mode=padding)
        np.testing.assert_allclose(out[0, 0].numpy(), ref, atol=1e-12)

    @pytest.mark.parametrize("padding", WARP_PADDINGS)
    def test_sample_displaced_with_a_length_one_axis_matches_scipy(self, rng, padding):
        image = rng.random((1, 8))
        d = np.stack([rng.uniform(-0.9, 0.9, (1, 8)), rng.uniform(-3, 3, (1, 8))])
        out = sample_displaced(_t(image)[None, None], _t(d)[None], padding=padding)
        ref = ndi.map_coordinates(image, np.indices((1, 8)) + d, order=1, mode=padding)
        np.testing.assert_allclose(out[0, 0].numpy(), ref, atol=1e-12)

    def test_one_grid_for_a_batch_and_one_image_for_many_grids(self, rng):
        images = _t(rng.random((3, 2, 6, 7)))
        grids = _t(rng.uniform(-1.2, 1.2, (4, 5, 8, 2)))
        out = grid_sample(images, grids[:1], "linear", "nearest")
        assert out.shape == (3, 2, 5, 8)
        for n in range(3):
            ref = F.grid_sample(
                images[n : n + 1], grids[:1], padding_mode="border", align_corners=True
            )
            torch.testing.assert_close(out[n : n + 1], ref, rtol=0, atol=1e-14)
        out = grid_sample(images[1:2], grids, "linear", "mirror")
        assert out.shape == (4, 2, 5, 8)
        for n in range(4):
            ref = F.grid_sample(
                images[1:2], grids[n : n + 1], padding_mode="reflection", align_corners=True
            )
            torch.testing.assert_close(out[n : n + 1], ref, rtol=0, atol=1e-14)


@pytest.mark.parametrize("margin", [0.0, 0.5, 2.0])
def test_grid_inside_marks_samples_within_margin_pixels(rng, margin):
    shape = (8, 11)
    coords = np.stack([rng.uniform(-4, n + 3, (30, 30)) for n in shape])
    grid = pixel_to_grid(_t(coords)[None], shape)
    inside = grid_inside(grid, shape, margin)
    assert inside.shape == (1, 1, 30, 30)
    expected = np.all(
        [(c >= -margin) & (c <= n - 1 + margin) for c, n in zip(coords, shape)], axis=0
    )
    np.testing.assert_array_equal(inside[0, 0].numpy(), expected.astype(float))
    assert 0 < expected.sum() < expected.size  # both kinds of point are tested


class TestLevels:
    @pytest.mark.parametrize(
        "full,level", [((64, 48), (16, 12)), ((30, 21), (15, 11)), ((20, 24, 28), (10, 6, 7))]
    )
    def test_level_to_full_follows_scipy_zoom_grid_mode(self, rng, full, level):
        # A linear ramp zoomed by SciPy over the same field of view (grid_mode=True, the
        # pixel-edge convention): level pixel p holds the ramp at level_to_full(p).
        d = len(full)
        coef = rng.normal(size=d)
        ramp = np.tensordot(coef, np.indices(full).astype(float), axes=1) + 3.0
        zoomed = ndi.zoom(
            ramp,
            [s / b for s, b in zip(level, full)],
            order=1,
            grid_mode=True,
            mode="grid-constant",
        )
        assert zoomed.shape == level
        m = level_to_full(full, level).numpy()
        p = np.indices(level).reshape(d, -1).astype(float)
        expected = (coef @ (m[:d, :d] @ p + m[:d, d:]) + 3.0).reshape(level)
        # Interior only: SciPy interpolates the border pixels with the padding.
        inner = tuple(slice(1, -1) for _ in level)
        np.testing.assert_allclose(zoomed[inner], expected[inner], atol=1e-10)

    def test_level_to_full_of_the_full_level_is_the_identity(self):
        np.testing.assert_array_equal(level_to_full((9, 10), (9, 10)).numpy(), np.eye(3))

    @pytest.mark.parametrize("case", ["2d", "3d"])
    def test_level_matrix_samples_the_same_physical_points(self, rng, case):
        # Moving intensities that are linear in moving full-resolution pixels; the moving
        # level is SciPy's zoom of them over the same field of view. Resampling that level
        # with level_matrix at a fixed level must read, at each fixed level pixel, the
        # full-resolution moving point that the full matrix assigns to its center.
        if case == "2d":
            fixed_full, fixed_level = (40, 36), (10, 9)
            moving_full, moving_level = (48, 44), (24, 11)
        else:
            fixed_full, fixed_level = (16, 20, 24), (8, 10, 6)
            moving_full, moving_level = (20, 16, 24), (10, 8, 12)
        d = len(fixed_full)
        m = _random_affine(rng, d, scale=0.05, shift=1.0)
        coefs = rng.normal(size=(2, d))
        level_images = []
        for c in coefs:
            ramp = np.tensordot(c, np.indices(moving_full).astype(float), axes=1)
            level_images.append(
                ndi.zoom(
                    ramp,
                    [s / b for s, b in zip(moving_level, moving_full)],
                    order=1,
                    grid_mode=True,
                    mode="grid-constant",
                )
            )
        b = level_matrix(_t(m)[None], moving_full, moving_level, fixed_full, fixed_level)[0]
        p = np.indices(fixed_level).reshape(d, -1).astype(float)
        # The fixed level pixel's center in fixed full-resolution pixels (pixel-center
        # convention), then through the full-resolution matrix.
        factor = (np.asarray(fixed_full, float) / np.asarray(fixed_level, float))[:, None]
        physical = (p + 0.5) * factor - 0.5
        target = m[:d, :d] @ physical + m[:d, d:]
        q = b.numpy()[:d, :d] @ p + b.numpy()[:d, d:]  # where it samples the moving level
        # Away from the moving level's border (SciPy's zoom pads there).
        lo, hi = 1.0, np.asarray(moving_level, float)[:, None] - 2.0
        ok = np.all((q >= lo) & (q <= hi), axis=0)
        assert ok.sum() > 0.3 * ok.size
        for c, level_image in zip(coefs, level_images):
            sampled = ndi.affine_transform(
                level_image, b.numpy(), output_shape=fixed_level, order=1, mode="nearest"
            ).reshape(-1)
            np.testing.assert_allclose(sampled[ok], (c @ target)[ok], atol=1e-9)
