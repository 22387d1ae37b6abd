"""The names the optimizer accepts: every metric is a loss; mutual information aligns
images whose intensities are related by a non-monotonic function, where local NCC fails."""

import warnings

import numpy as np
import pytest

from napari_simwarp import register
from napari_simwarp.ops import LOSSES
from napari_simwarp.registration import LINEAR_MODELS, METRICS, MODELS
from tests.registration.cases import affine_pair, centered_affine, corner_error


def test_every_metric_is_a_loss_and_linear_models_come_first():
    assert set(METRICS) <= set(LOSSES)
    assert MODELS[: len(LINEAR_MODELS)] == LINEAR_MODELS


@pytest.fixture(scope="module")
def remapped_pair():
    """An affine pair whose moving image went through ``sin(3π u)`` (u: its intensities
    in [0, 1]): bright and dark swap back and forth, no linear relation is left."""
    shape = (96, 96)
    theta = np.deg2rad(5)
    linear = 1.03 * np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    matrix = centered_affine(linear, [3.0, -2.0], shape)
    fixed, moving = affine_pair(np.random.default_rng(1), shape, matrix)
    lo, hi = np.percentile(moving, [0.5, 99.5])
    return fixed, np.sin(3 * np.pi * (moving - lo) / (hi - lo)), matrix


@pytest.mark.parametrize("metric, works", [("mi", True), ("lncc", False)])
def test_mutual_information_aligns_a_non_monotonic_remap(remapped_pair, metric, works):
    fixed, moving, matrix = remapped_pair
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the ZNCC plausibility checks of a multimodal pair
        result = register(fixed, moving, model="affine", metric=metric, device="cpu")
    error = corner_error(result.transform.matrix, matrix, fixed.shape)
    if works:
        assert error < 0.25
    else:
        assert error > 2.0


def test_default_metric_is_ncc_for_linear_models_and_lncc_for_dense_ones():
    """The documented defaults (register's docstring, README, CLI help): metric=None runs
    "ncc" for the linear models, "lncc" for the dense ones (global NCC folds the B-spline
    field under uneven illumination, issue 16); an explicit metric is kept, and moves the
    deformable model's own defaults to those measured with it."""
    import inspect

    from napari_simwarp.registration import register_iter
    from napari_simwarp.registration._names import DEFAULT_METRICS, default_metric

    assert DEFAULT_METRICS == {
        "translation": "ncc",
        "rigid": "ncc",
        "similarity": "ncc",
        "affine": "ncc",
        "deformable": "lncc",
        "diffeomorphic": "lncc",
    }
    for fn in (register, register_iter):
        assert inspect.signature(fn).parameters["metric"].default is None
    assert '"ncc" (global normalized cross-correlation) for the linear models' in " ".join(
        register.__doc__.split()
    )
    assert default_metric("rigid", "mse") == "mse"
    rng = np.random.default_rng(2)
    fixed, moving = affine_pair(rng, (32, 32), centered_affine(np.eye(2), [1.0, 0.0], (32, 32)))
    for model, expected in (("rigid", "ncc"), ("deformable", "lncc"), ("diffeomorphic", "lncc")):
        result = register(fixed, moving, model=model, iterations=2, device="cpu")
        assert result.metric == expected
    assert register(fixed, moving, model="rigid", metric="mse", iterations=2).metric == "mse"


def test_the_deformable_defaults_follow_the_metric():
    """The B-spline field's weight and iterations are the ones measured best with each
    metric (docs/benchmarks.md, issue 16): bending 4 and 60 iterations with local NCC, its
    default; 0.5 and 150 with global NCC; an explicit value is kept."""
    from napari_simwarp.registration.optimize import level_iterations, make_schedule

    def schedule(metric, regularization=None):
        return make_schedule("deformable", None, None, 1e-4, regularization, 5, metric, None)

    assert (schedule("lncc").reg_weight, schedule("lncc").iterations) == (4.0, 60)
    assert (schedule("ncc").reg_weight, schedule("ncc").iterations) == (0.5, 150)
    assert schedule("ncc", regularization=2.0).reg_weight == 2.0
    assert level_iterations(None, "deformable", (64, 64), 2, True, metric="ncc") == [150, 150]
    assert level_iterations(None, "deformable", (64, 64), 2, True) == [60, 60]


def test_a_window_without_a_metric_names_the_metric_that_takes_one(tmp_path):
    """A linear model's default metric is global NCC (no window): a ``window=`` given
    without ``metric=`` is refused before any work, by the API, the stack and the CLI, with
    a message that names the window and the metric to ask for; with ``metric="lncc"`` (or a
    model whose default is local NCC) the window is taken."""
    import subprocess
    import sys

    import tifffile

    from napari_simwarp import register_stack

    rng = np.random.default_rng(3)
    fixed, moving = affine_pair(rng, (32, 32), centered_affine(np.eye(2), [1.0, 0.0], (32, 32)))
    for call in (
        lambda: register(fixed, moving, model="affine", window=7),
        lambda: register_stack(np.stack([fixed, moving]), model="rigid", window=7),
    ):
        with pytest.raises(TypeError, match=r"window=7(\.0)? .*metric='lncc'"):
            call()
    for model, metric in (("affine", "lncc"), ("deformable", None)):
        result = register(fixed, moving, model=model, metric=metric, window=7, iterations=2)
        assert result.metric == "lncc"
    tifffile.imwrite(tmp_path / "f.tif", fixed.astype(np.float32))
    tifffile.imwrite(tmp_path / "m.tif", moving.astype(np.float32))
    run = subprocess.run(
        [sys.executable, "-m", "napari_simwarp", "register", "f.tif", "m.tif", "-o", "o.tif"]
        + ["--model", "affine", "--window", "7"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert "--metric lncc" in run.stderr and not (tmp_path / "o.tif").exists()
