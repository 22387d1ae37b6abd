"""Template peaks: top k with non-maximum suppression."""

from __future__ import annotations

import numpy as np
import pytest

from napari_simwarp import data
from napari_simwarp.widgets_logic.matching import find_peaks, match, rectangle_slices


def test_find_peaks_topk_nms():
    m = np.zeros((30, 30), np.float32)
    m[5, 5], m[5, 7], m[20, 20], m[25, 3] = 0.9, 0.8, 0.95, 0.4
    coords, scores = find_peaks(m, k=5, threshold=0.5, min_distance=3)
    np.testing.assert_array_equal(coords, [[20, 20], [5, 5]])  # (5, 7) suppressed
    np.testing.assert_allclose(scores, [0.95, 0.9])
    coords, _ = find_peaks(m, k=1, threshold=0.0, min_distance=1)
    np.testing.assert_array_equal(coords, [[20, 20]])
    assert find_peaks(m, k=3, threshold=0.99)[0].shape == (0, 2)


def test_match_finds_the_cut_template():
    image = data.camera()[:128, :128]
    res = match(image, image[40:60, 70:86], k=2, threshold=0.2, device="cpu")
    np.testing.assert_array_equal(res.centers[0], (50, 78))
    np.testing.assert_array_equal(res.corners[0], (40, 70))
    assert res.scores[0] > 0.999 and res.boxes().shape[1:] == (4, 2)


def test_rectangle_slices():
    v = np.array([[9.6, 19.6], [9.6, 39.4], [29.4, 39.4], [29.4, 19.6]])
    assert rectangle_slices(v, (100, 100)) == (slice(10, 29), slice(20, 39))
    with pytest.raises(ValueError, match="2×2"):
        rectangle_slices(np.array([[1.0, 1.0], [1.2, 1.2]]), (10, 10))
