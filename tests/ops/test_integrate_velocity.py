"""Tests of ``ops.integrate_velocity`` (ops/integrate_velocity.py): scaling and squaring."""

from __future__ import annotations

import pytest
import torch

from napari_simwarp.ops import integrate_velocity, jacobian_determinant
from tests.ops.fields import SHAPE_IDS, SHAPES, smooth_field


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
        v = 0.3 * torch.rand(
            1, 2, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2)
        )
        v = v.to(device).requires_grad_()
        assert torch.autograd.gradcheck(
            lambda x: integrate_velocity(x, steps=2), (v,), eps=1e-6, atol=1e-5
        )

    def test_exception(self, device):
        v = torch.zeros(1, 2, 8, 9, device=device)
        with pytest.raises(ValueError, match="steps"):
            integrate_velocity(v, steps=-1)
        with pytest.raises(ValueError, match="steps"):
            integrate_velocity(v, steps=2.5)
        # 2**64 overflowed the division (OverflowError: int too big to convert)
        for steps in (31, 64, 1100):
            with pytest.raises(ValueError, match=r"steps must be an int in \[0, 30\]"):
                integrate_velocity(v, steps=steps)
        with pytest.raises(ValueError, match="v"):
            integrate_velocity(torch.zeros(1, 3, 8, 9, device=device))
