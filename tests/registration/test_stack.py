"""register_stack(): drift correction against known shifts, references, batching."""

import numpy as np
import pytest

from napari_simwarp.registration import register_stack
from tests.registration.cases import shifted_stack


@pytest.fixture(scope="module")
def drift_case():
    rng = np.random.default_rng(21)
    return shifted_stack(rng, (128, 128), 8, max_shift=6.0)


def test_translation_drift_subpixel(drift_case):
    stack, truth = drift_case
    result = register_stack(stack)
    err = np.linalg.norm(result.shifts - truth, axis=1)
    assert np.median(err) < 0.03, err
    assert result.warped.shape == stack.shape and len(result.transforms) == len(stack)
    assert result.transforms[0].kind == "translation"


@pytest.mark.parametrize("reference", ["mean", "previous", 3])
def test_references(drift_case, reference):
    stack, truth = drift_case
    result = register_stack(stack, reference=reference, batch_size=3)
    shifts = result.shifts
    if reference == 3:
        truth = truth - truth[3]
    else:  # "mean" and "previous" are expressed in frame 0's frame up to a constant
        shifts = shifts - shifts[0]
    tol = 0.08 if reference == "previous" else 0.04  # chaining accumulates error
    assert np.median(np.linalg.norm(shifts - truth, axis=1)) < tol


def test_integer_stack_and_rigid_model(drift_case):
    stack, truth = drift_case
    ints = (stack[:4] * 1000 + 200).astype(np.uint16)
    result = register_stack(ints, model="rigid", metric="ncc")
    assert np.median(np.linalg.norm(result.shifts - truth[:4], axis=1)) < 0.1


def test_callback_stops(drift_case):
    stack, _ = drift_case
    seen = []
    result = register_stack(stack, callback=lambda p: seen.append(p) or True)
    assert result.stopped and len(seen) == 1 and len(result.transforms) == len(stack)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"reference": "last"}, "reference"),
        ({"reference": 99}, "out of range"),
        ({"model": "spline"}, "model"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_stack_errors(drift_case, kwargs, match):
    with pytest.raises(ValueError, match=match):
        register_stack(drift_case[0][:3], **kwargs)


def test_stack_shape_error():
    with pytest.raises(ValueError, match="stack"):
        register_stack(np.random.rand(16, 16))


def test_mean_reference_for_a_linear_model(drift_case):
    stack, truth = drift_case
    result = register_stack(stack[:4], reference="mean", model="rigid", metric="ncc")
    shifts = result.shifts - result.shifts[0]
    # Looser than "first": the mean is slightly blurred by resampling (see the report).
    assert np.median(np.linalg.norm(shifts - truth[:4], axis=1)[1:]) < 0.15


def test_progress_transforms_are_in_full_resolution_pixels():
    rng = np.random.default_rng(4)
    stack, truth = shifted_stack(rng, (256, 256), 3, max_shift=4.0)
    seen = []
    register_stack(stack, callback=lambda p: seen.append(p.transforms) and False)
    last = np.stack([t.translation for t in seen[-1]])
    assert np.abs(last - truth).max() < 0.1


def test_deformable_stack_chained():
    rng = np.random.default_rng(8)
    stack, truth = shifted_stack(rng, (96, 96), 3, max_shift=2.0, noise=0.005)
    result = register_stack(stack, model="deformable", reference="previous")
    assert len(result.transforms) == 3 and result.warped.shape == stack.shape
    for t, d in zip(result.transforms, truth):
        mean = t.to_displacement((96, 96))[:, 16:-16, 16:-16].mean(axis=(1, 2))
        assert np.abs(mean - d).max() < 0.2
