"""Tests of ``ops.affine_to_displacement`` (ops/affine_to_displacement.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp.ops import affine_to_displacement, warp, warp_affine
from tests.ops.fields import SHAPE_IDS, random_affine


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
        torch.testing.assert_close(
            warp(image, field, padding=padding),
            warp_affine(image, matrix, padding=padding),
            atol=1e-10,
            rtol=0,
        )

    def test_batch_and_dtype(self, device, rng):
        matrices = torch.from_numpy(np.stack([random_affine(rng, 2) for _ in range(3)])).to(device)
        field = affine_to_displacement(matrices, (6, 7), dtype=torch.float32)
        assert field.shape == (3, 2, 6, 7) and field.dtype == torch.float32
        torch.testing.assert_close(
            field[1:2].double(), affine_to_displacement(matrices[1], (6, 7)), atol=1e-5, rtol=0
        )

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
