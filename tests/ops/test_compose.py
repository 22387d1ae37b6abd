"""Tests of the displacement-field utilities: compose, invert, integrate_velocity,
jacobian_determinant and affine_to_displacement."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import ndimage as ndi

from napari_simwarp.ops import (
    affine_to_displacement,
    compose,
    integrate_velocity,
    invert,
    jacobian_determinant,
    warp,
    warp_affine,
)
from napari_simwarp.ops._sampling import identity_grid
from tests.images import random_smooth

SHAPES = [(48, 52), (20, 22, 24)]
SHAPE_IDS = ["2d", "3d"]


def smooth_field(rng, shape, amplitude, sigma=5.0, taper=False) -> torch.Tensor:
    """A random smooth ``(1, D, *S)`` float64 field with largest component ``amplitude``.

    ``taper`` multiplies it by a window that is 0 on the border, so that ``x + d(x)``
    never leaves the image (no extrapolation error in compositions).
    """
    field = np.stack([ndi.gaussian_filter(rng.standard_normal(shape), sigma) for _ in shape])
    if taper:
        window = np.ones(shape)
        for axis, n in enumerate(shape):
            profile = np.sin(np.pi * np.arange(n) / (n - 1))
            window = window * profile.reshape([-1 if a == axis else 1 for a in range(len(shape))])
        field = field * window
    return torch.from_numpy(field * (amplitude / np.abs(field).max()))[None]


def random_affine(rng, d: int) -> np.ndarray:
    matrix = np.eye(d + 1)
    matrix[:d, :d] += rng.normal(0.0, 0.1, (d, d))
    matrix[:d, d] = rng.normal(0.0, 2.0, d)
    return matrix


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


class TestInvert:
    def test_smoke(self, device):
        d = 0.5 * torch.randn(2, 2, 8, 9, device=device)
        assert invert(d).shape == d.shape

    def test_translation(self, device):
        d = torch.tensor([1.25, -2.5], dtype=torch.float64, device=device).view(1, 2, 1, 1)
        d = d.expand(1, 2, 10, 12).contiguous()
        torch.testing.assert_close(invert(d), -d)

    @pytest.mark.parametrize("shape,amplitude", [((64, 64), 2.5), ((32, 32, 32), 2.0)],
                             ids=SHAPE_IDS)
    def test_compose_with_inverse_is_zero(self, device, rng, shape, amplitude):
        # compose(d, e) is what the iteration solves at the grid nodes (measured ~3e-5 px);
        # compose(e, d) samples e between nodes, so it carries e's linear-interpolation
        # error, which grows with the field's curvature: measured 0.02-0.04 px over 8 seeds
        # for these smooth (sigma 8 px) fields.
        d = smooth_field(rng, shape, amplitude, sigma=8.0, taper=True).to(device)
        det = jacobian_determinant(d)
        assert det.min() > 0.5 and det.max() < 1.5  # the regime the requirement names
        e = invert(d)
        assert compose(d, e).abs().max() < 1e-3
        assert compose(e, d).abs().max() < 0.05

    def test_float32(self, device, rng):
        d = smooth_field(rng, (32, 32), 2.0, taper=True).to(device)
        e32 = invert(d.float())
        assert e32.dtype == torch.float32
        torch.testing.assert_close(e32.double(), invert(d), atol=1e-4, rtol=0)

    def test_exception(self, device):
        d = torch.zeros(1, 2, 8, 9, device=device)
        with pytest.raises(ValueError, match="iterations"):
            invert(d, iterations=0)
        with pytest.raises(ValueError, match="tolerance"):
            invert(d, tolerance=-1.0)
        with pytest.raises(ValueError, match="d"):
            invert(torch.zeros(1, 1, 8, 9, device=device))


class TestIntegrateVelocity:
    def test_smoke(self, device):
        v = torch.randn(2, 3, 6, 7, 8, device=device)
        assert integrate_velocity(v).shape == v.shape

    @pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
    def test_constant_velocity(self, device, shape):
        v = torch.full((1, len(shape), *shape), 0.3, dtype=torch.float64, device=device)
        torch.testing.assert_close(integrate_velocity(v), v)

    @pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
    def test_positive_jacobian(self, device, rng, shape):
        # A velocity whose own x + v(x) folds still integrates to a map that does not.
        v = smooth_field(rng, shape, 12.0, sigma=4.0).to(device)
        assert jacobian_determinant(v).min() < 0
        assert jacobian_determinant(integrate_velocity(v)).min() > 0

    def test_steps_zero_returns_velocity(self, device):
        v = torch.randn(1, 2, 5, 6, device=device)
        torch.testing.assert_close(integrate_velocity(v, steps=0), v)

    def test_gradcheck(self, device):
        v = 0.3 * torch.rand(1, 2, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        v = v.to(device).requires_grad_()
        assert torch.autograd.gradcheck(lambda x: integrate_velocity(x, steps=2), (v,), eps=1e-6, atol=1e-5)

    def test_exception(self, device):
        v = torch.zeros(1, 2, 8, 9, device=device)
        with pytest.raises(ValueError, match="steps"):
            integrate_velocity(v, steps=-1)
        with pytest.raises(ValueError, match="steps"):
            integrate_velocity(v, steps=2.5)
        with pytest.raises(ValueError, match="v"):
            integrate_velocity(torch.zeros(1, 3, 8, 9, device=device))


class TestJacobianDeterminant:
    def test_smoke(self, device):
        d = torch.randn(2, 2, 8, 9, device=device)
        assert jacobian_determinant(d).shape == (2, 1, 8, 9)

    @pytest.mark.parametrize("d", [2, 3])
    def test_affine_field(self, device, rng, d):
        matrix = random_affine(rng, d)
        shape = (9, 10, 11)[:d]
        field = affine_to_displacement(torch.from_numpy(matrix).to(device), shape)
        det = jacobian_determinant(field)
        expected = np.linalg.det(matrix[:d, :d])
        torch.testing.assert_close(det, torch.full_like(det, expected), atol=1e-12, rtol=0)

    def test_axis_of_length_one(self, device):
        field = torch.zeros(1, 3, 1, 5, 6, dtype=torch.float64, device=device)
        field[:, 2] = 0.5 * torch.arange(6, dtype=torch.float64, device=device)  # ∂d_x/∂x = 0.5
        torch.testing.assert_close(jacobian_determinant(field), torch.full((1, 1, 1, 5, 6), 1.5,
                                   dtype=torch.float64, device=device))

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
    def test_dtype(self, device, dtype):
        field = torch.randn(1, 2, 8, 8, device=device)
        out = jacobian_determinant(field.to(dtype))
        assert out.dtype == dtype

    def test_gradcheck(self, device):
        d = torch.rand(1, 3, 3, 4, 5, dtype=torch.float64, device=device, requires_grad=True)
        assert torch.autograd.gradcheck(jacobian_determinant, (d,))

    def test_exception(self, device):
        with pytest.raises(ValueError, match="d"):
            jacobian_determinant(torch.zeros(1, 3, 8, 9, device=device))
        with pytest.raises(TypeError, match="d"):
            jacobian_determinant(torch.zeros(1, 2, 8, 9, dtype=torch.int32, device=device))


class TestAffineToDisplacement:
    def test_smoke(self, device):
        field = affine_to_displacement(torch.eye(3, device=device), (5, 6))
        assert field.shape == (1, 2, 5, 6) and field.device.type == device.type
        assert field.abs().max() == 0

    @pytest.mark.parametrize("padding", ["grid-constant", "nearest", "mirror", "reflect"])
    @pytest.mark.parametrize("shape", [(20, 24), (10, 12, 14)], ids=SHAPE_IDS)
    def test_warp_equals_warp_affine(self, device, rng, shape, padding):
        image = torch.from_numpy(rng.random(shape))[None, None].to(device)
        matrix = torch.from_numpy(random_affine(rng, len(shape))).to(device)
        field = affine_to_displacement(matrix, shape)
        torch.testing.assert_close(warp(image, field, padding=padding),
                                   warp_affine(image, matrix, padding=padding), atol=1e-10, rtol=0)

    def test_batch_and_dtype(self, device, rng):
        matrices = torch.from_numpy(np.stack([random_affine(rng, 2) for _ in range(3)])).to(device)
        field = affine_to_displacement(matrices, (6, 7), dtype=torch.float32)
        assert field.shape == (3, 2, 6, 7) and field.dtype == torch.float32
        torch.testing.assert_close(field[1:2].double(), affine_to_displacement(matrices[1], (6, 7)),
                                   atol=1e-5, rtol=0)

    def test_exception(self, device):
        with pytest.raises(ValueError, match="matrix"):
            affine_to_displacement(torch.full((3, 3), float("nan"), device=device), (5, 6))
        with pytest.raises(ValueError, match="matrix"):
            affine_to_displacement(torch.eye(4, device=device), (5, 6))
        with pytest.raises(ValueError, match="shape"):
            affine_to_displacement(torch.eye(3, device=device), (5, 0))
        with pytest.raises(ValueError, match="shape"):
            affine_to_displacement(torch.eye(3, device=device), (5,))
        with pytest.raises(TypeError, match="shape"):
            affine_to_displacement(torch.eye(3, device=device), 5)
