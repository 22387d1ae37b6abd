"""``register(..., landmarks=, landmark_weight=)``: landmarks start the run and constrain it.

Ground truth is the matrix each pair was built from; the physical case's expected pixel
matrix is written out by hand from the grids.
"""

import numpy as np
import pytest
import torch
from scipy import ndimage as ndi

from napari_simwarp.registration import register
from napari_simwarp.registration._landmark_term import penalty
from napari_simwarp.registration.grid import Grid
from napari_simwarp.registration.models import DenseModel, LinearModel
from napari_simwarp.registration.quality import RegistrationWarning
from tests.registration.cases import centered_affine, corner_error, textured

SHAPE = (128, 128)


def _rotation(degrees):
    t = np.deg2rad(degrees)
    return np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])


@pytest.fixture(scope="module")
def far_pair():
    """A 75° rotation plus a (14, -18) px shift: beyond the pyramid's capture range."""
    rng = np.random.default_rng(3)
    m = centered_affine(_rotation(75), [14, -18], SHAPE)
    fixed = textured(rng, SHAPE)
    moving = ndi.affine_transform(fixed, np.linalg.inv(m), order=3, mode="nearest")
    return fixed, moving, m


def _mapped(m, points):
    return points @ m[:-1, :-1].T + m[:-1, -1]


FIXED_POINTS = np.array([[20.0, 25.0], [30.0, 100.0], [100.0, 40.0], [90.0, 95.0]])


def test_far_pair_fails_without_landmarks(far_pair):
    fixed, moving, m = far_pair
    with pytest.warns(RegistrationWarning, match="similarity is low"):
        res = register(fixed, moving, model="rigid", iterations=60)
    assert corner_error(res.transform.matrix, m, SHAPE) > 20  # really lost


@pytest.mark.parametrize("model", ["rigid", "affine"])
def test_far_pair_recovered_with_four_landmarks(far_pair, model):
    fixed, moving, m = far_pair
    # Clicked points are off by about a pixel: the image term does the rest.
    noise = np.random.default_rng(4).normal(0, 1.0, FIXED_POINTS.shape)
    moving_points = _mapped(m, FIXED_POINTS) + noise
    res = register(fixed, moving, model=model, landmarks=(FIXED_POINTS, moving_points))
    assert corner_error(res.transform.matrix, m, SHAPE) < 0.2


def test_landmarks_in_physical_space_with_two_grids(far_pair):
    fixed, _, _ = far_pair
    # Fixed pixels (0.5, 0.8) from (1, -2); moving pixels (0.7, 0.6) from (0, 3).
    gf = np.array([[0.5, 0, 1.0], [0, 0.8, -2.0], [0, 0, 1]])
    gm = np.array([[0.7, 0, 0.0], [0, 0.6, 3.0], [0, 0, 1]])
    center = np.array([1 + 0.5 * 63.5, -2 + 0.8 * 63.5])
    physical = np.eye(3)
    physical[:2, :2] = _rotation(-70)
    physical[:2, 2] = center + [5.0, -7.0] - _rotation(-70) @ center
    expected = np.linalg.inv(gm) @ physical @ gf  # fixed pixels -> moving pixels
    moving_shape = (110, 150)
    moving = ndi.affine_transform(
        fixed, np.linalg.inv(expected), output_shape=moving_shape, order=3, mode="nearest"
    )
    x = _mapped(gf, FIXED_POINTS)  # physical fixed points
    y = _mapped(physical, x)
    grids = dict(fixed_spacing=(0.5, 0.8), fixed_origin=(1.0, -2.0))
    grids.update(moving_spacing=(0.7, 0.6), moving_origin=(0.0, 3.0))
    start = register(fixed, moving, model="rigid", landmarks=(x, y), iterations=0, **grids)
    np.testing.assert_allclose(start.transform.matrix, expected, atol=1e-9)
    np.testing.assert_allclose(start.transform.physical_matrix, physical, atol=1e-9)
    # The same pairs as pixels, with unit grids: the pixel answer is the same matrix.
    pixels = register(
        fixed,
        moving,
        model="affine",
        landmarks=(FIXED_POINTS, _mapped(np.linalg.inv(gm), y)),
        iterations=0,
    )
    np.testing.assert_allclose(pixels.transform.matrix, expected, atol=1e-9)
    # Off by a rotation of 2° and 1 physical unit, the image term finds the truth.
    y_off = _mapped(centered_affine(_rotation(2), [1.0, 0.5], (0, 0)), y)
    res = register(fixed, moving, model="rigid", landmarks=(x, y_off), **grids)
    assert corner_error(res.transform.matrix, expected, SHAPE) < 0.2


@pytest.fixture(scope="module")
def periodic_pair():
    """A texture periodic with 24 px on both axes, shifted by (3, -2): every shift of one
    period more fits the images as well (but for the borders)."""
    rng = np.random.default_rng(1)
    tile = ndi.gaussian_filter(rng.standard_normal((24, 24)), 2.0, mode="wrap")
    fixed = np.tile(tile, (6, 6))
    true = np.array([3.0, -2.0])
    moving = ndi.shift(fixed, true, order=3, mode="grid-wrap")  # fixed(x) = moving(x + t)
    return fixed, moving, true


def test_the_soft_constraint_picks_the_landmarks_period(periodic_pair):
    fixed, moving, true = periodic_pair
    start = np.eye(3)
    start[:2, 2] = true + [22.0, 0.0]  # near the next period, (27, -2)
    points = np.array([[30.0, 40.0], [100.0, 90.0], [60.0, 120.0]])
    landmarks = (points, points + true)
    alone = register(fixed, moving, model="translation", init=start)
    np.testing.assert_allclose(alone.transform.translation, true + [24, 0], atol=0.2)
    held = register(
        fixed, moving, model="translation", init=start, landmarks=landmarks, landmark_weight=0.1
    )
    np.testing.assert_allclose(held.transform.translation, true, atol=0.1)


def test_deformable_starts_from_the_affine_fit_on_two_grids(far_pair):
    fixed, moving, m = far_pair
    # The moving image at twice the pixel size: the dense model resamples it onto the
    # fixed grid first, and its start must be the affine fit in that frame.
    small = ndi.zoom(moving, 0.5, order=1, grid_mode=True, mode="nearest")
    grids = dict(moving_spacing=2.0, moving_origin=0.5)
    physical = m  # unit fixed grid: pixel = physical
    x = FIXED_POINTS
    y = _mapped(physical, x)
    res = register(
        fixed, small, model="deformable", landmarks=(x, y), iterations=0, levels=1, **grids
    )
    d = res.transform.to_displacement(SHAPE)  # fixed pixels -> moving (small) pixels
    grid = np.stack(np.meshgrid(*[np.arange(n, dtype=float) for n in SHAPE], indexing="ij"))
    expected = np.einsum("ij,j...->i...", physical[:2, :2], grid) + physical[:2, 2].reshape(2, 1, 1)
    expected = (expected - 0.5) / 2.0 - grid  # into the small image's pixels
    np.testing.assert_allclose(d, expected, atol=1e-3)


@pytest.mark.parametrize("model", ["deformable", "diffeomorphic"])
def test_dense_models_start_from_landmarks_and_keep_them(far_pair, model):
    fixed, moving, m = far_pair
    noise = np.random.default_rng(4).normal(0, 1.0, FIXED_POINTS.shape)
    landmarks = (FIXED_POINTS, _mapped(m, FIXED_POINTS) + noise)
    res = register(fixed, moving, model=model, landmarks=landmarks, landmark_weight=0.01)
    assert not res.warnings  # judged from the landmarks' start, not the unaligned pair
    grid = np.stack(np.meshgrid(*[np.arange(n, dtype=float) for n in SHAPE], indexing="ij"))
    true = np.einsum("ij,j...->i...", m[:2, :2], grid) + m[:2, 2].reshape(2, 1, 1) - grid
    error = np.sqrt(((res.transform.to_displacement(SHAPE) - true) ** 2).sum(0))
    assert error[16:-16, 16:-16].mean() < 0.3


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("kind", ["linear", "dense"])
def test_penalty_value_and_gradient(rng, kind, d):
    """The term against NumPy (SciPy's order-1 sampling for the dense field, at the full
    and at a coarser level), and its gradient by torch's gradcheck (float64)."""
    shape, level = (20, 24, 12)[:d], (10, 12, 6)[:d]
    fg = Grid.make(d, (0.5, 0.8, 0.6)[:d], (1.0, -2.0, 0.5)[:d])
    mg = Grid.make(d, (0.7, 0.6, 0.9)[:d], (0.0, 3.0, -1.0)[:d])
    x = rng.uniform([2.0, -1.0, 1.0][:d], [10.0, 15.0, 7.0][:d], (5, d))
    y = x + rng.normal(0, 2, x.shape)
    if kind == "linear":
        mdl = LinearModel(
            "affine", shape, shape, 1, dtype=torch.float64, fixed_grid=fg, moving_grid=mg
        )
        with torch.no_grad():
            mdl.shift.normal_()
            mdl.linear.normal_()
        pixel = mdl.matrix()[0].detach().numpy()
        mapped = {s: _mapped(mg.to_physical() @ pixel @ fg.to_pixels(), x) for s in (shape, level)}
    else:
        mdl = DenseModel("deformable", shape, 1, dtype=torch.float64, spacing=fg.spacing)
        mdl.set_level(shape)
        with torch.no_grad():
            mdl.field.normal_()
        q = _mapped(fg.to_pixels(), x)
        mapped = {}
        for s in (shape, level):
            ratio = np.array(s, float) / np.array(shape, float)
            field = mdl.displacement(s)[0].detach().numpy() / ratio.reshape(-1, *[1] * d)
            where = (q + 0.5) * ratio - 0.5  # full pixel q on the level (align_corners=False)
            at = np.stack(
                [ndi.map_coordinates(c, where.T, order=1, mode="nearest") for c in field], -1
            )
            mapped[s] = _mapped(fg.to_physical(), q + at)
    term = penalty(mdl, x, y, 0.3, fg, mg, shape)
    for s in (shape, level):
        expected = 0.3 * ((mapped[s] - y) ** 2).sum(1).mean() / 0.5**2
        np.testing.assert_allclose(float(term(s)[0].detach()), expected, rtol=1e-6)

    names = ["shift", "linear"] if kind == "linear" else ["field"]

    def as_function(*values):
        for name, value in zip(names, values):
            setattr(mdl, name, value)
        return term(level)

    inputs = [getattr(mdl, name).detach().clone().requires_grad_(True) for name in names]
    assert torch.autograd.gradcheck(as_function, inputs)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        (dict(landmarks=(np.zeros((3, 2)), np.zeros((4, 2)))), ValueError, "same shape"),
        (dict(landmarks=(np.zeros((3, 3)), np.zeros((3, 3)))), ValueError, "3-D, the images 2-D"),
        (dict(landmarks=np.zeros((3, 2))), ValueError, "pair (fixed_points, moving_points)"),
        (dict(landmarks=5), TypeError, "pair (fixed_points, moving_points)"),
        (
            dict(landmarks=([[1.0, 2.0], [np.nan, 1.0], [3, 5]], np.zeros((3, 2)))),
            ValueError,
            "landmarks: fixed_points holds NaN",
        ),
        (dict(landmarks=(np.eye(2), np.eye(2))), ValueError, "at least 3 point pairs"),
        (
            dict(landmarks=([[0.0, 0], [1, 1], [2, 2]], np.zeros((3, 2)))),
            ValueError,
            "on one line",
        ),
        (dict(landmark_weight=0.5), ValueError, "landmark_weight > 0 needs landmarks"),
        (
            dict(landmarks=(np.eye(3)[:, :2], np.eye(3)[:, :2]), landmark_weight=-1),
            ValueError,
            "landmark_weight must be >= 0",
        ),
        (
            dict(landmarks=(np.eye(3)[:, :2], np.eye(3)[:, :2]), landmark_weight="1"),
            TypeError,
            "landmark_weight must be a number",
        ),
        (
            dict(landmarks=(np.eye(3)[:, :2], np.eye(3)[:, :2]), init=np.eye(3)),
            ValueError,
            "landmarks would be unused",
        ),
    ],
)
def test_bad_landmarks_are_refused(kwargs, error, words):
    image = np.zeros((32, 32), np.float32)
    image[8:20, 10:24] = 1
    with pytest.raises(error) as info:
        register(image, image, model="affine", iterations=0, **kwargs)
    assert words in str(info.value)


def test_the_deformable_model_needs_an_affine_worth_of_pairs():
    image = np.zeros((32, 32), np.float32)
    image[8:20, 10:24] = 1
    with pytest.raises(ValueError, match="2-D affine transform needs at least 3"):
        register(image, image, model="deformable", landmarks=(np.eye(2), np.eye(2)))


def test_landmarks_are_not_modified(far_pair):
    fixed, moving, m = far_pair
    x = FIXED_POINTS.copy()
    y = _mapped(m, x)
    y_copy = y.copy()
    register(fixed, moving, model="rigid", landmarks=(x, y), landmark_weight=1.0, iterations=2)
    np.testing.assert_array_equal(x, FIXED_POINTS)
    np.testing.assert_array_equal(y, y_copy)
