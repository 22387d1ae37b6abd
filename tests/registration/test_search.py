"""The capture range of linear registration (registration/search.py): rotations up to
30° and shifts up to a quarter of the image, found without an initial transform, checked
against the known transform that made each pair."""

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from napari_simwarp import register
from napari_simwarp.registration import search
from napari_simwarp.registration.quality import RegistrationWarning
from tests.registration.cases import affine_pair, centered_affine, corner_error


def rotation(degrees):
    th = np.deg2rad(degrees)
    return np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])


SHAPE = (96, 96)
QUARTER = SHAPE[0] / 4

CASES_2D = {
    "translation": np.eye(2),
    "rigid": rotation(30),
    "similarity": 1.06 * rotation(-27),
    "affine": rotation(25) @ np.array([[1.08, 0.06], [0.0, 0.94]]),
}


@pytest.mark.parametrize("model", list(CASES_2D))
def test_2d_linear_models_find_large_rotations_and_shifts(model):
    matrix = centered_affine(CASES_2D[model], [QUARTER, -QUARTER / 2], SHAPE)
    fixed, moving = affine_pair(np.random.default_rng(3), SHAPE, matrix)
    result = register(fixed, moving, model=model, device="cpu")
    assert corner_error(result.transform.matrix, matrix, SHAPE) < 0.25


def test_descent_alone_misses_a_30_degree_rotation():
    """The same 30° pair started from the identity (``init`` given: no search) is not
    found: the search is what widens the capture range."""
    matrix = centered_affine(rotation(30), [QUARTER, -QUARTER / 2], SHAPE)
    fixed, moving = affine_pair(np.random.default_rng(3), SHAPE, matrix)
    with pytest.warns(RegistrationWarning, match="similarity is low"):
        result = register(fixed, moving, model="rigid", init=np.eye(3), device="cpu")
    assert corner_error(result.transform.matrix, matrix, SHAPE) > 2.0


def test_3d_rigid_finds_a_25_degree_rotation_and_a_quarter_shift():
    shape = (40, 40, 40)
    linear = Rotation.from_rotvec([0.0, np.deg2rad(25), 0.0]).as_matrix()
    matrix = centered_affine(linear, [shape[0] / 4, 0.0, -3.0], shape)
    fixed, moving = affine_pair(np.random.default_rng(4), shape, matrix)
    result = register(fixed, moving, model="rigid", device="cpu")
    assert corner_error(result.transform.matrix, matrix, shape) < 0.3


@pytest.mark.parametrize("model", ["rigid", "affine"])
@pytest.mark.parametrize("axis", [(1.0, 1.0, 1.0), (0.3, -1.0, 0.5)])
def test_3d_finds_30_degrees_about_an_oblique_axis_and_a_quarter_shift(model, axis):
    """The candidates turn about the array axes only; 30° about (1, 1, 1) is 25° from the
    nearest of them (started from the identity, without the search, rigid ends 40 px off
    and affine 17 px) and 30° about (0.3, -1, 0.5) 15°: the descent from the best
    candidate covers the rest."""
    shape = (40, 40, 40)
    axis = np.asarray(axis) / np.linalg.norm(axis)
    linear = Rotation.from_rotvec(np.deg2rad(30) * axis).as_matrix()
    matrix = centered_affine(linear, [shape[0] / 4, -2.0, 3.0], shape)
    fixed, moving = affine_pair(np.random.default_rng(4), shape, matrix)
    result = register(fixed, moving, model=model, device="cpu")
    assert corner_error(result.transform.matrix, matrix, shape) < 0.3


def test_candidate_set_is_the_documented_one():
    v2 = search.rotation_vectors(2)
    assert v2.shape == (13, 1) and v2[0, 0] == 0
    assert np.allclose(np.sort(np.rad2deg(v2[:, 0])), np.arange(-30, 31, 5))
    v3 = search.rotation_vectors(3)
    assert v3.shape == (19, 3) and not v3[0].any()
    # each 3-D candidate turns about one axis only, by at most 30°
    assert ((v3[1:] != 0).sum(1) == 1).all()
    assert np.isclose(np.abs(v3).max(), np.deg2rad(30))
