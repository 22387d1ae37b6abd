"""Tests for the shared moment engine's building blocks (``ops._moments``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from napari_simwarp.ops import _reference
from napari_simwarp.ops._moments import (
    _centered_moments,
    _reflect_fill_,
    _reflect_fold_,
    _tile_centered_moments,
)
from napari_simwarp.ops._tiles import TileGrid
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


@pytest.mark.parametrize("spatial, window", [((45, 38), (5, 7)), ((20, 18, 22), (5, 3, 5))])
def test_tile_centered_moments_give_the_same_variances(spatial, window):
    """Each tile about its own constant: variances, covariances and local means unchanged."""
    gen = torch.Generator().manual_seed(4)
    ramp = torch.linspace(0, 500, spatial[-1], dtype=torch.float64)
    a = 1000 + ramp + 50 * torch.rand(1, 2, *spatial, generator=gen, dtype=torch.float64)
    b = 20 * torch.rand(1, 2, *spatial, generator=gen, dtype=torch.float64)
    win = make_window("gaussian", window, [1.0] * len(window))
    grid = TileGrid.for_window(spatial, window)
    assert math.prod(grid.counts) > 1
    _, shifts, plain = _centered_moments(a, b, win, _reference)
    _, tile_shifts, tiled = _tile_centered_moments(a, b, win, _reference, grid)

    def summary(m, s):  # local means, variances, covariance
        ma, mb, maa, mbb, mab = m
        return [ma + s[0], mb + s[1], maa - ma * ma, mbb - mb * mb, mab - ma * mb]

    d = len(spatial)
    for p, q in zip(summary(plain, shifts), summary(tiled, tile_shifts)):
        q = grid.untile(q.expand(*q.shape[: 2 + d], *grid.tile))
        torch.testing.assert_close(q, p, rtol=0, atol=1e-9)
    # and the tiles were shifted by different amounts
    assert tile_shifts[0].std() > 10.0


def test_float32_path_is_taken_only_for_float32(monkeypatch, float32_moments):
    from napari_simwarp.ops import _moments, ssim

    calls = []

    def spy(a, b, *args):
        calls.append(a.dtype)
        return tile_inputs(a, b, *args)

    tile_inputs = _moments._tile_inputs
    monkeypatch.setattr(_moments, "_tile_inputs", spy)
    x = torch.rand(1, 1, 40, 36)
    ssim(x, x.flip(-1))
    ssim(x.half(), x.flip(-1).half())
    ssim(x.double(), x.flip(-1).double())
    assert calls == [torch.float32, torch.float32]


def test_risky_windows_are_redone_two_pass(monkeypatch, float32_moments):
    """A step of 900 with noise 1: float32 sums alone lose ρ there (the risk check off);
    the two-pass redo (in float32) gets it back."""
    from napari_simwarp.ops import _moments, local_ncc

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(1, 1, 64, 64, generator=gen) + 100.0
    a[..., 32:] += 900.0
    b = a + 0.3 * torch.randn(a.shape, generator=gen)
    expected = local_ncc(a.double(), b.double(), window=5)
    assert (local_ncc(a, b, window=5).double() - expected).abs().max() < 1e-5
    monkeypatch.setattr(_moments, "FLOAT32_RISK", math.inf)
    assert (local_ncc(a, b, window=5).double() - expected).abs().max() > 1e-3
