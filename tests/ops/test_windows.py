"""Separable window weights (ops/_windows.py): box sums and normalized Gaussians."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage as ndi

from napari_simwarp.ops._windows import gaussian_kernel1d, make_window


class TestWindow:
    def test_totals(self):
        assert make_window("box", (5, 3)).total == 15
        assert make_window("gaussian", (11, 11), (1.5, 1.5)).total == pytest.approx(1.0)

    def test_sizes_and_kinds(self):
        box = make_window("box", (5, 3, 1))
        assert box.is_box and box.sizes == (5, 3, 1)
        assert box.taps == ((1.0,) * 5, (1.0,) * 3, (1.0,))
        gauss = make_window("gaussian", (7, 1), (1.2, 3.0))
        assert not gauss.is_box and gauss.sizes == (7, 1) and gauss.taps[1] == (1.0,)


@pytest.mark.parametrize("size,sigma", [(3, 0.5), (7, 1.2), (11, 1.5), (9, 10.0)])
def test_gaussian_kernel1d_matches_scipy(size, sigma):
    # SciPy's filter of a unit impulse, truncated at the same radius, is its normalized kernel.
    r = size // 2
    impulse = np.zeros(2 * r + 1)
    impulse[r] = 1.0
    expected = ndi.gaussian_filter1d(impulse, sigma, truncate=r / sigma, mode="constant")
    np.testing.assert_allclose(gaussian_kernel1d(size, sigma), expected, rtol=0, atol=1e-15)
