"""A drift run's shift table (widgets_logic/shift_table.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from napari_simwarp.widgets_logic.shift_table import shift_rows, write_shift_table


def test_table_holds_pixels_and_physical_units_per_axis(tmp_path):
    shifts = np.array([[0.0, 0.0], [1.25, -0.5], [2.5, 3.0]])
    path = write_shift_table(tmp_path / "s.csv", shifts, spacing=(0.2, 0.1), unit="micrometer")
    table = pd.read_csv(path)
    assert list(table.columns) == [
        "frame",
        "shift_y_px",
        "shift_x_px",
        "shift_y_micrometer",
        "shift_x_micrometer",
    ]
    np.testing.assert_array_equal(table["frame"], [0, 1, 2])
    np.testing.assert_array_equal(table[["shift_y_px", "shift_x_px"]], shifts)  # exact
    np.testing.assert_allclose(
        table[["shift_y_micrometer", "shift_x_micrometer"]], shifts * [0.2, 0.1], rtol=1e-15
    )


def test_3d_shifts_have_z_first_and_bad_input_is_named():
    header, rows = shift_rows(np.zeros((2, 3)))
    assert header[1:4] == ["shift_z_px", "shift_y_px", "shift_x_px"] and len(rows) == 2
    with pytest.raises(ValueError, match="shifts"):
        shift_rows(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="spacing"):
        shift_rows(np.zeros((2, 2)), spacing=(1.0, 1.0, 1.0))
