"""Tests of ``ops.invert`` (ops/invert.py): the inverse of a displacement field."""

from __future__ import annotations

import pytest
import torch

from napari_simwarp.ops import compose, invert, jacobian_determinant
from tests.ops.fields import SHAPE_IDS, smooth_field


class TestInvert:
    def test_smoke(self, device):
        d = 0.5 * torch.randn(2, 2, 8, 9, device=device)
        assert invert(d).shape == d.shape

    def test_translation(self, device):
        d = torch.tensor([1.25, -2.5], dtype=torch.float64, device=device).view(1, 2, 1, 1)
        d = d.expand(1, 2, 10, 12).contiguous()
        torch.testing.assert_close(invert(d), -d)

    @pytest.mark.parametrize(
        "shape,amplitude", [((64, 64), 2.5), ((32, 32, 32), 2.0)], ids=SHAPE_IDS
    )
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
