"""Tests of ``ops.compose`` (ops/compose.py): composition of displacement fields."""

from __future__ import annotations

import pytest
import torch

from napari_simwarp.ops import compose, warp
from napari_simwarp.ops._sampling import identity_grid
from tests.images import random_smooth
from tests.ops.fields import SHAPE_IDS, SHAPES, smooth_field


class TestCompose:
    def test_smoke(self, device):
        d1 = torch.randn(2, 2, 8, 9, device=device)
        out = compose(d1, torch.randn(1, 2, 8, 9, device=device))
        assert out.shape == d1.shape and out.dtype == d1.dtype

    def test_zero_is_neutral(self, device, rng):
        d = smooth_field(rng, (16, 18), 3.0).to(device)
        zero = torch.zeros_like(d)
        torch.testing.assert_close(compose(d, zero), d)
        torch.testing.assert_close(compose(zero, d), d)

    def test_translations_add(self, device):
        a = torch.tensor([1.5, -0.25], dtype=torch.float64, device=device).view(1, 2, 1, 1)
        b = torch.tensor([-0.5, 2.0], dtype=torch.float64, device=device).view(1, 2, 1, 1)
        ones = torch.ones(1, 2, 10, 11, dtype=torch.float64, device=device)
        torch.testing.assert_close(compose(a * ones, b * ones), (a + b) * ones)

    @pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
    def test_equals_warping_twice_on_coordinates(self, device, rng, shape):
        # Linear interpolation of a linear function is exact, so warping the coordinate
        # image x ↦ x twice must give x + compose(d1, d2)(x) to round-off wherever every
        # sample stays inside the image (tapered fields guarantee that).
        d1 = smooth_field(rng, shape, 3.0, taper=True).to(device)
        d2 = smooth_field(rng, shape, 3.0, taper=True).to(device)
        coordinates = identity_grid(shape, dtype=torch.float64, device=device)
        twice = warp(warp(coordinates, d1), d2)
        torch.testing.assert_close(twice, coordinates + compose(d1, d2), atol=1e-10, rtol=0)

    @pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
    def test_equals_warping_twice_on_images(self, device, rng, shape):
        # On a smooth image the single resampling differs from the double one only by
        # interpolation error; the other order, compose(d2, d1), is much further off.
        image = torch.from_numpy(random_smooth(rng, shape, sigma=4.0))[None, None].to(device)
        d1 = smooth_field(rng, shape, 4.0, taper=True).to(device)
        d2 = smooth_field(rng, shape, 4.0, taper=True).to(device)
        twice = warp(warp(image, d1), d2)
        right = (warp(image, compose(d1, d2)) - twice).abs().max()
        wrong = (warp(image, compose(d2, d1)) - twice).abs().max()
        assert right < 0.01
        assert wrong > 3 * right

    def test_gradcheck(self, device):
        generator = torch.Generator().manual_seed(1)
        d1 = torch.rand(1, 2, 5, 6, generator=generator, dtype=torch.float64)
        d2 = 0.2 + 0.6 * torch.rand(1, 2, 5, 6, generator=generator, dtype=torch.float64)
        d1, d2 = d1.to(device).requires_grad_(), d2.to(device).requires_grad_()
        assert torch.autograd.gradcheck(compose, (d1, d2), eps=1e-6, atol=1e-6)

    def test_exception(self, device):
        d = torch.zeros(1, 2, 8, 9, device=device)
        with pytest.raises(ValueError, match="d2"):
            compose(d, torch.zeros(1, 2, 8, 10, device=device))
        with pytest.raises(ValueError, match="d2"):
            compose(d, torch.zeros(1, 3, 8, 9, device=device))
        with pytest.raises(ValueError, match="d1"):
            compose(torch.zeros(1, 3, 8, 9, device=device), d)
        with pytest.raises(TypeError, match="d1"):
            compose(d.long(), d)
        with pytest.raises(ValueError, match="d1 and d2"):
            compose(torch.zeros(2, 2, 8, 9, device=device), torch.zeros(3, 2, 8, 9, device=device))
