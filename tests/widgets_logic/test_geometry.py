"""Applying a run's transforms to other layers and showing a linear one through the layer's
affine (widgets_logic/geometry.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage as ndi

from napari_simwarp.registration import AffineTransform, DisplacementTransform
from napari_simwarp.registration.grid import Grid
from napari_simwarp.widgets_logic.geometry import (
    apply_transforms,
    for_moving_grid,
    layer_affine,
    layer_grid,
)


def _translation(shift) -> AffineTransform:
    m = np.eye(3)
    m[:2, 2] = shift
    return AffineTransform(m, "translation")


def test_apply_to_labels_keeps_dtype_and_moves_by_the_inverse_shift():
    t = _translation((2.0, -1.0))
    labels = np.zeros((10, 10), np.int32)
    labels[4:6, 4:6] = 3
    out = apply_transforms([t], labels, labels=True)
    assert out.dtype == np.int32 and set(np.unique(out)) == {0, 3}
    # fixed(x) = moving(x + t): the square at rows 4-5, cols 4-5 lands at rows 2-3, cols 5-6
    expected = np.zeros_like(labels)
    expected[2:4, 5:7] = 3
    np.testing.assert_array_equal(out, expected)


def test_apply_one_transform_per_frame_matches_scipy(rng):
    frames = ndi.gaussian_filter(rng.random((3, 24, 26)), (0, 2, 2))
    shifts = [(0.0, 0.0), (1.5, -2.0), (-0.5, 3.25)]
    out = apply_transforms([_translation(s) for s in shifts], frames)
    assert out.shape == frames.shape
    inner = (slice(4, -4), slice(4, -4))
    for frame, s, got in zip(frames, shifts, out):
        ref = ndi.affine_transform(frame, np.eye(2), offset=s, order=1, mode="grid-constant")
        np.testing.assert_allclose(got[inner], ref[inner], atol=1e-5)


def test_apply_with_a_frame_count_mismatch_is_an_error():
    with pytest.raises(ValueError, match="one frame per transform"):
        apply_transforms([_translation((0, 0))] * 2, np.zeros((3, 8, 8)))


@pytest.mark.parametrize("geometry", [False, True])
def test_layer_affine_shows_moving_data_where_the_fixed_layer_shows_its_match(rng, geometry):
    # For a fixed data point p, the transform sends it to moving data q = M p; napari must
    # then draw q (through the moving layer's scale/translate and the returned affine) at
    # the world position where it draws p of the fixed layer.
    m = np.eye(3)
    m[:2, :2] += rng.normal(0, 0.1, (2, 2))
    m[:2, 2] = rng.normal(0, 3, 2)
    fixed_geo = ((0.5, 2.0), (10.0, -3.0)) if geometry else None
    moving_geo = ((1.5, 0.25), (-4.0, 7.0)) if geometry else None
    a = layer_affine(AffineTransform(m), fixed_geo, moving_geo)
    (fs, ft), (ms, mt) = fixed_geo or ((1, 1), (0, 0)), moving_geo or ((1, 1), (0, 0))
    for p in rng.uniform(0, 30, (5, 2)):
        q = (m @ np.append(p, 1))[:2]
        world_fixed = np.asarray(fs) * p + ft
        world_moving = (a @ np.append(np.asarray(ms) * q + mt, 1))[:2]
        np.testing.assert_allclose(world_moving, world_fixed, atol=1e-9)


def test_layer_affine_of_a_translation_is_minus_the_shift():
    np.testing.assert_allclose(layer_affine(_translation((2.0, -1.0)))[:2, 2], (-2.0, 1.0))


def test_layer_affine_refuses_a_dense_transform():
    with pytest.raises(ValueError, match="only linear models"):
        layer_affine(DisplacementTransform(np.zeros((2, 4, 4))))


def test_layer_grid_is_the_layers_scale_and_translate():
    layers = pytest.importorskip("napari.layers")
    layer = layers.Image(np.zeros((3, 10, 12)), scale=(5, 0.2, 0.3), translate=(0, 1, 2))
    grid = layer_grid(layer, "fixed")
    assert grid.spacing == (5.0, 0.2, 0.3) and grid.origin == (0.0, 1.0, 2.0)
    assert layer_grid(layer, "moving", skip=1).spacing == (0.2, 0.3)  # a time axis left out


@pytest.mark.parametrize(
    "placement,words",
    [
        (dict(rotate=10), "a rotation"),
        (dict(shear=[0.2]), "a shear"),
        (dict(affine=np.array([[1.0, 0.1, 0], [0, 1, 0], [0, 0, 1]])), "an affine"),
        (dict(scale=(1.0, -1.0)), "a flip"),
    ],
)
def test_layer_grid_refuses_a_placement_registration_cannot_honour(placement, words):
    layers = pytest.importorskip("napari.layers")
    layer = layers.Image(np.zeros((10, 10)), name="cells", **placement)
    with pytest.raises(ValueError, match=f"the moving layer 'cells' is placed with {words}"):
        layer_grid(layer, "moving")


def test_a_linear_transform_follows_a_layer_on_another_grid():
    # The moving image and its labels at half its resolution: the labels resampled with
    # the regridded transform land where the image lands.
    fixed_grid, moving_grid = Grid.make(2, 1.0), Grid.make(2, 1.0, (0.5, 0.0))
    labels_grid = Grid.make(2, 2.0, (1.0, 0.5))  # pixel p of the labels is moving pixel 2p + .5
    m = np.eye(3)
    m[:2, 2] = (3.0, -2.0)
    t = AffineTransform(m, "translation").with_grids(fixed_grid, moving_grid)
    regridded = for_moving_grid(t, labels_grid)
    np.testing.assert_allclose(regridded.physical_matrix, t.physical_matrix, atol=1e-12)
    np.testing.assert_allclose(
        regridded.matrix, labels_grid.to_pixels() @ moving_grid.to_physical() @ m, atol=1e-12
    )
    assert for_moving_grid(t, moving_grid) is t
    field = DisplacementTransform(np.zeros((2, 8, 8))).with_grids(fixed_grid, moving_grid)
    with pytest.raises(ValueError, match="dense transform applies only"):
        for_moving_grid(field, labels_grid)
