"""Grid: a pixel size and an origin per axis (napari's scale and translate)."""

import numpy as np
import pytest

from napari_simwarp.registration.grid import Grid, unit_grid


def test_grid_maps_pixels_to_physical_as_napari_scale_and_translate():
    grid = Grid.make(3, (4.0, 0.5, 0.25), (10.0, -2.0, 3.0))
    pixel = np.array([2.0, 7.0, 1.0, 1.0])
    # napari shows data pixel p at world position translate + scale * p
    assert np.allclose(grid.to_physical() @ pixel, [18.0, 1.5, 3.25, 1.0])
    assert np.allclose(grid.to_pixels() @ grid.to_physical(), np.eye(4))


def test_grid_defaults_and_scalars_broadcast():
    assert Grid.make(2) == unit_grid(2) and unit_grid(2).is_unit
    grid = Grid.make(2, 0.2, 5)
    assert grid.spacing == (0.2, 0.2) and grid.origin == (5.0, 5.0) and not grid.is_unit


@pytest.mark.parametrize(
    "spacing,origin,error,words",
    [
        ((1.0, 2.0, 3.0), None, ValueError, "fixed_spacing must have one value per axis \\(2"),
        ((0.0, 1.0), None, ValueError, "fixed_spacing must be positive"),
        ((-1.0, 1.0), None, ValueError, "fixed_spacing must be positive"),
        ((np.inf, 1.0), None, ValueError, "fixed_spacing must be finite"),
        (None, (1.0,), ValueError, "fixed_origin must have one value per axis"),
        (None, (np.nan, 0.0), ValueError, "fixed_origin must be finite"),
        ("0.2", None, TypeError, "fixed_spacing"),
        ((1.0, "x"), None, TypeError, "fixed_spacing"),
        (True, None, TypeError, "fixed_spacing"),
    ],
)
def test_bad_grids_name_the_argument(spacing, origin, error, words):
    with pytest.raises(error, match=words):
        Grid.make(2, spacing, origin, name="fixed")
