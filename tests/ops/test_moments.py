"""Tests for the shared moment engine's building blocks (``ops._moments``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp.ops import _reference
from napari_simwarp.ops._moments import _centered_moments, _reflect_fill_, _reflect_fold_
from napari_simwarp.ops._windows import make_window


class TestReflectPadding:
    @pytest.mark.parametrize("spatial", [(6, 7), (5, 4, 6)])
    def test_fill_matches_numpy_symmetric(self, device, spatial):
        pads = [(2, 2), (3, 3), (1, 1)][: len(spatial)]
        x = torch.rand(1, 2, *spatial, dtype=torch.float64)
        buf = torch.zeros(
            1, 2, *[n + lo + hi for n, (lo, hi) in zip(spatial, pads)], dtype=torch.float64
        )
        buf[(Ellipsis, *[slice(lo, lo + n) for n, (lo, _) in zip(spatial, pads)])] = x
        buf = buf.to(device)
        _reflect_fill_(buf, spatial, pads)
        expected = np.pad(x.numpy(), [(0, 0), (0, 0), *pads], mode="symmetric")
        np.testing.assert_array_equal(buf.cpu().numpy(), expected)

    @pytest.mark.parametrize("spatial", [(6, 7), (5, 4, 6)])
    def test_fold_is_adjoint_of_fill(self, device, spatial):
        pads = [(2, 2), (3, 3), (1, 1)][: len(spatial)]
        padded = [n + lo + hi for n, (lo, hi) in zip(spatial, pads)]
        gen = torch.Generator().manual_seed(2)
        x = torch.rand(1, 1, *spatial, generator=gen, dtype=torch.float64).to(device)
        g = torch.rand(1, 1, *padded, generator=gen, dtype=torch.float64).to(device)
        buf = torch.zeros_like(g)
        buf[(Ellipsis, *[slice(lo, lo + n) for n, (lo, _) in zip(spatial, pads)])] = x
        _reflect_fill_(buf, spatial, pads)
        lhs = (buf * g).sum()
        rhs = (x * _reflect_fold_(g.clone(), spatial, pads)).sum()
        torch.testing.assert_close(lhs, rhs)


def test_centered_moments_are_shift_free(device):
    """Moments of centered data: a large offset changes nothing but the shifts."""
    gen = torch.Generator().manual_seed(3)
    a = torch.rand(1, 1, 30, 30, generator=gen, dtype=torch.float64).to(device)
    b = torch.rand(1, 1, 30, 30, generator=gen, dtype=torch.float64).to(device)
    window = make_window("gaussian", (5, 5), (1.0, 1.0))
    _, shifts0, m0 = _centered_moments(a, b, window, _reference)
    _, shifts1, m1 = _centered_moments(a + 1000, b - 50, window, _reference)
    for p, q in zip(m0, m1):
        torch.testing.assert_close(p, q)
    torch.testing.assert_close(shifts1[0] - shifts0[0], torch.full_like(shifts0[0], 1000.0))
