"""Tests of ``ops.jacobian_determinant`` (ops/jacobian_determinant.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp.ops import affine_to_displacement, jacobian_determinant
from tests.ops.fields import random_affine


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
        torch.testing.assert_close(
            jacobian_determinant(field),
            torch.full((1, 1, 1, 5, 6), 1.5, dtype=torch.float64, device=device),
        )

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
