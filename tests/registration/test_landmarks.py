"""Landmark fits against scikit-image's estimators and SciPy's Kabsch; the checks."""

import numpy as np
import pytest
import skimage.transform as skt
from scipy.spatial.transform import Rotation

from napari_simwarp.registration.grid import Grid
from napari_simwarp.registration.landmarks import fit_landmarks, landmark_errors

SKIMAGE = {
    "rigid": skt.EuclideanTransform,
    "similarity": skt.SimilarityTransform,
    "affine": skt.AffineTransform,
}


def _pairs(rng, d, n=12, noise=0.3):
    """Fixed points, and moving points from a random affine plus noise (array order)."""
    x = rng.uniform(0, 100, (n, d))
    a = np.eye(d) + rng.normal(0, 0.15, (d, d))
    y = x @ a.T + rng.normal(0, 10, d) + rng.normal(0, noise, (n, d))
    return x, y


def _skimage_matrix(model, x, y):
    """scikit-image's estimate in x, y, z order, turned back into array order."""
    d = x.shape[1]
    est = SKIMAGE[model].from_estimate(x[:, ::-1], y[:, ::-1])
    order = [*range(d - 1, -1, -1), d]
    return np.asarray(est.params)[np.ix_(order, order)]


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("model", ["rigid", "similarity"])
def test_fit_matches_scikit_image(rng, d, model):
    x, y = _pairs(rng, d)
    fit = fit_landmarks(x, y, model)
    np.testing.assert_allclose(fit.matrix, _skimage_matrix(model, x, y), atol=1e-8)
    assert fit.kind == model


@pytest.mark.parametrize("d", [2, 3])
def test_affine_is_exact_without_noise_and_least_squares_with_it(rng, d):
    x, y = _pairs(rng, d, noise=0.0)
    exact = _skimage_matrix("affine", x, y)
    np.testing.assert_allclose(fit_landmarks(x, y, "affine").matrix, exact, atol=1e-8)
    x, y = _pairs(rng, d)
    m = fit_landmarks(x, y, "affine").matrix
    # the normal equations of min Σ |A x + t − y|²: the residual is orthogonal to [x, 1]
    residual = x @ m[:d, :d].T + m[:d, d] - y
    design = np.hstack([x, np.ones((len(x), 1))])
    np.testing.assert_allclose(design.T @ residual, 0, atol=1e-8)


def test_rigid_3d_matches_kabsch(rng):
    x, y = _pairs(rng, 3)
    fit = fit_landmarks(x, y, "rigid").matrix
    rotation, _ = Rotation.align_vectors(y - y.mean(0), x - x.mean(0))
    np.testing.assert_allclose(fit[:3, :3], rotation.as_matrix(), atol=1e-8)
    np.testing.assert_allclose(fit[:3, 3], y.mean(0) - rotation.apply(x.mean(0)), atol=1e-8)
    assert np.linalg.det(fit[:3, :3]) > 0  # never a reflection


def test_translation_is_the_mean_shift(rng):
    x, y = _pairs(rng, 2)
    fit = fit_landmarks(x, y, "translation")
    np.testing.assert_allclose(fit.matrix[:2, 2], (y - x).mean(0))
    np.testing.assert_array_equal(fit.matrix[:2, :2], np.eye(2))


def test_rigid_in_physical_space_with_anisotropic_grids(rng):
    """A rotation of the sample, seen through anisotropic voxels, is recovered exactly in
    physical space; the pixel matrix maps fixed pixels onto moving pixels."""
    fixed_grid = Grid.make(3, spacing=(3.0, 0.5, 0.5), origin=(1.0, -2.0, 5.0))
    moving_grid = Grid.make(3, spacing=(2.0, 0.25, 0.4), origin=(0.0, 3.0, -1.0))
    rotation = Rotation.from_rotvec([0.1, -0.2, 0.3]).as_matrix()
    p = rng.uniform(0, 40, (6, 3))  # physical fixed points
    q = p @ rotation.T + [1.5, -2.0, 0.7]  # physical moving points
    fit = fit_landmarks(p, q, "rigid", fixed_grid=fixed_grid, moving_grid=moving_grid)
    np.testing.assert_allclose(fit.physical_matrix[:3, :3], rotation, atol=1e-10)
    np.testing.assert_allclose(landmark_errors(fit, p, q), 0, atol=1e-9)
    pixels_fixed = (p - fixed_grid.origin) / fixed_grid.spacing
    pixels_moving = (q - moving_grid.origin) / moving_grid.spacing
    mapped = pixels_fixed @ fit.matrix[:3, :3].T + fit.matrix[:3, 3]
    np.testing.assert_allclose(mapped, pixels_moving, atol=1e-9)
    assert fit.fixed_grid == fixed_grid and fit.moving_grid == moving_grid


def test_landmark_errors_are_the_residuals(rng):
    x, y = _pairs(rng, 2, noise=0.0)
    y[0] += [3.0, 4.0]
    errors = landmark_errors(fit_landmarks(x, y, "affine"), x, y)
    assert errors.shape == (12,) and errors[0] > 2 * np.median(errors[1:])


@pytest.mark.parametrize(
    "model, d, n", [("rigid", 3, 2), ("similarity", 2, 1), ("affine", 2, 2), ("affine", 3, 3)]
)
def test_too_few_points_is_refused(model, d, n):
    x = np.arange(n * d, dtype=float).reshape(n, d) ** 1.5
    with pytest.raises(ValueError, match=f"at least {n + 1} point pairs, got {n}"):
        fit_landmarks(x, x, model)


def test_degenerate_configurations_are_refused():
    line = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [5.0, 5.0]])
    with pytest.raises(ValueError, match="on one line"):
        fit_landmarks(line, line, "affine")
    plane = np.array([[0, 0, 0], [0, 1, 0], [0, 0, 1], [0, 1, 1.0]])
    with pytest.raises(ValueError, match="in one plane"):
        fit_landmarks(plane, plane, "affine")
    fit_landmarks(plane[:3], plane[:3] + 1, "rigid")  # a plane fixes a 3-D rotation


def test_bad_points_are_refused():
    good = np.zeros((4, 2)) + np.arange(4)[:, None] * [1.0, 2.0] ** np.arange(4)[:, None]
    with pytest.raises(ValueError, match="same shape"):
        fit_landmarks(good, good[:3], "translation")
    with pytest.raises(ValueError, match=r"fixed_points must have shape \(n, 2\) or \(n, 3\)"):
        fit_landmarks(np.zeros((4, 4)), np.zeros((4, 4)), "translation")
    bad = good.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"moving_points holds NaN.*rows \[2\]"):
        fit_landmarks(good, bad, "translation")
    with pytest.raises(ValueError, match="model must be one of"):
        fit_landmarks(good, good, "deformable")
    with pytest.raises(ValueError, match="fixed_grid must be a Grid of 2 axes"):
        fit_landmarks(good, good, "translation", fixed_grid=Grid.make(3))


def test_inputs_are_not_modified(rng):
    x, y = _pairs(rng, 2)
    x0, y0 = x.copy(), y.copy()
    fit_landmarks(x, y, "similarity")
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)
