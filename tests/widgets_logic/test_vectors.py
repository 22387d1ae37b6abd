"""Dense fields and per-frame shifts as napari Vectors data (widgets_logic/vectors.py)."""

from __future__ import annotations

import numpy as np
import pytest

from napari_simwarp.widgets_logic.vectors import (
    auto_spacing,
    field_to_vectors,
    normalized_scale,
    shifts_to_vectors,
)


def test_field_to_vectors_samples_the_cell_centers():
    field = np.zeros((2, 8, 8), np.float32)
    field[0] = 1.0
    v = field_to_vectors(field, 4)
    assert v.shape == (4, 2, 2)
    np.testing.assert_array_equal(v[:, 0], [[2, 2], [2, 6], [6, 2], [6, 6]])
    np.testing.assert_array_equal(v[:, 1], [[1, 0]] * 4)


def test_field_to_vectors_reads_the_field_at_each_position_scaled_and_offset(rng):
    field = rng.normal(size=(3, 7, 9, 10))
    v = field_to_vectors(field, 3, scale=2.5, offset=(10.0, -1.0, 0.5))
    z, y, x = np.meshgrid(
        np.arange(1, 7, 3), np.arange(1, 9, 3), np.arange(1, 10, 3), indexing="ij"
    )
    idx = (z.ravel(), y.ravel(), x.ravel())
    assert v.shape == (z.size, 2, 3) and v.dtype == np.float32
    np.testing.assert_array_equal(v[:, 0], np.stack(idx, 1) + [10.0, -1.0, 0.5])
    np.testing.assert_allclose(v[:, 1], 2.5 * np.stack([c[idx] for c in field], 1), rtol=1e-6)


def test_field_to_vectors_rejects_a_field_without_one_component_per_axis():
    with pytest.raises(ValueError, match="field must be"):
        field_to_vectors(np.zeros((3, 8, 8)))


def test_shifts_to_vectors_puts_one_arrow_per_frame_at_the_center():
    s = shifts_to_vectors(np.array([[0, 0], [1, 2]]), (9, 9))
    np.testing.assert_array_equal(s[1], [[1, 4, 4], [0, 1, 2]])
    np.testing.assert_array_equal(s[:, 0, 0], [0, 1])
    np.testing.assert_array_equal(s[0, 1], [0, 0, 0])


def test_normalized_scale_makes_the_longest_vector_that_long():
    field = np.zeros((2, 4, 4))
    field[:, 1, 2] = (3.0, 4.0)  # length 5
    field[:, 0, 0] = (1.0, 1.0)
    assert normalized_scale(field, 20.0) == pytest.approx(4.0)
    assert normalized_scale(np.zeros((2, 4, 4)), 20.0) == 1.0


def test_auto_spacing_gives_about_target_arrows_along_the_longest_axis():
    assert auto_spacing((512, 256), target=32) == 16
    assert auto_spacing((100, 20, 30), target=10) == 10
    assert auto_spacing((8, 8), target=32) == 1
