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


def _squarings_by_resampling(v, steps):
    """The definition: ``u ← u + resample_field(u, u)`` from ``v / 2**steps`` (autograd
    through the separate ops)."""
    from napari_simwarp.ops.compose import resample_field

    u = v / 2**steps
    for _ in range(steps):
        u = u + resample_field(u, u)
    return u


@pytest.mark.parametrize("shape", [(9, 11), (5, 6, 7), (1, 8), (4, 1, 6)])
@pytest.mark.parametrize("batch", [1, 2])
def test_squaring_chain_equals_resampling_values_and_gradients(shape, batch):
    # ±3 px over a few pixels: many samples past the border (its clamped gradient)
    gen = torch.Generator().manual_seed(len(shape) + batch)
    v = 3.0 * torch.randn(batch, len(shape), *shape, generator=gen, dtype=torch.float64)
    v.requires_grad_(True)
    w = torch.randn(v.shape, generator=gen, dtype=torch.float64)
    out = integrate_velocity(v, steps=5)
    ref = _squarings_by_resampling(v, 5)
    (grad,) = torch.autograd.grad((out * w).sum(), v)
    (ref_grad,) = torch.autograd.grad((ref * w).sum(), v)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # the path that saves nothing
        torch.testing.assert_close(integrate_velocity(v, steps=5), ref, rtol=1e-12, atol=1e-12)


def test_squaring_chain_gradcheck_3d():
    gen = torch.Generator().manual_seed(4)
    v = 0.5 * torch.randn(2, 3, 4, 5, 6, generator=gen, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: integrate_velocity(x, steps=3), (v.requires_grad_(),))


def test_squaring_chain_refuses_second_derivatives():
    v = torch.rand(1, 2, 5, 6, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(integrate_velocity(v, steps=2).sum(), v)  # first: fine
    assert torch.isfinite(g).all()
    with pytest.raises(RuntimeError, match="first derivatives only"):
        torch.autograd.grad(integrate_velocity(v, steps=2).sum(), v, create_graph=True)
