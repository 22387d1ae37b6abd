"""The sample data's ground truth holds, checked by warping with SciPy independently."""

from __future__ import annotations

import numpy as np
from scipy import ndimage as ndi

from napari_simwarp import data


def _warp(image, displacement, order=3):
    coords = np.indices(image.shape, dtype=np.float64) + displacement
    return ndi.map_coordinates(image.astype(np.float64), coords, order=order, mode="nearest")


def test_deformed_pair_ground_truth():
    fixed, moving, d = data.deformed_pair()
    assert fixed.shape == moving.shape == d.shape[1:] == (512, 512)
    assert fixed.dtype == moving.dtype == d.dtype == np.float32
    assert 3.9 < np.abs(d).max() <= 4.0 + 1e-5
    inner = (slice(16, -16),) * 2
    residual = np.abs(_warp(moving, d) - fixed)[inner].mean()
    untouched = np.abs(moving - fixed)[inner].mean()
    # Undoing the deformation removes almost all of the difference (what is left is the
    # interpolation error of warping twice on a sharp photograph).
    assert residual < 0.2 * untouched


def test_drifting_timelapse_ground_truth():
    stack, shifts = data.drifting_timelapse(frames=4, size=128, noise=0.0, seed=3)
    assert stack.shape == (4, 128, 128) and shifts.shape == (4, 2)
    assert np.all(shifts[0] == 0) and np.all(np.abs(shifts) <= 8)
    inner = (slice(12, -12),) * 2
    for t in range(1, 4):
        d = np.broadcast_to(shifts[t][:, None, None], (2, 128, 128))
        right = np.abs(_warp(stack[t], d) - stack[0])[inner].mean()
        wrong_sign = np.abs(_warp(stack[t], -d) - stack[0])[inner].mean()
        assert right < 0.01 and right < 0.1 * wrong_sign


def test_volume_pair_ground_truth():
    fixed, moving, d = data.deformed_volume_pair(size=32, amplitude=2.0)
    assert fixed.shape == moving.shape == (32, 32, 32) and d.shape == (3, 32, 32, 32)
    inner = (slice(4, -4),) * 3
    assert (
        np.abs(_warp(moving, d) - fixed)[inner].mean() < 0.3 * np.abs(moving - fixed)[inner].mean()
    )
