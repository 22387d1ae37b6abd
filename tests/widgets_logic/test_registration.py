"""The registration run adapter and vector helpers."""

from __future__ import annotations

import numpy as np
import pytest

from napari_simwarp import data
from napari_simwarp.registration import AffineTransform
from napari_simwarp.widgets_logic.geometry import apply_transforms, layer_affine
from napari_simwarp.widgets_logic.registration import RegistrationRun, RunSettings
from napari_simwarp.widgets_logic.vectors import field_to_vectors, shifts_to_vectors


def test_field_to_vectors():
    field = np.zeros((2, 8, 8), np.float32)
    field[0] = 1.0
    v = field_to_vectors(field, 4)
    assert v.shape == (4, 2, 2)
    np.testing.assert_array_equal(v[:, 0], [[2, 2], [2, 6], [6, 2], [6, 6]])
    np.testing.assert_array_equal(v[:, 1], [[1, 0]] * 4)
    s = shifts_to_vectors(np.array([[0, 0], [1, 2]]), (9, 9))
    np.testing.assert_array_equal(s[1], [[1, 4, 4], [0, 1, 2]])


def test_pair_snapshots_and_stop():
    fixed = data.camera()[200:264, 200:264]
    from scipy import ndimage as ndi

    moving = ndi.shift(fixed, (2.0, -1.0), order=1, mode="nearest")
    run = RegistrationRun(fixed, moving, RunSettings(model="translation", iterations=200,
                                                     levels=1, report_every=1))
    gen = run.snapshots()
    first = next(gen)
    assert first.warped.shape == fixed.shape and first.displacement.shape[1:] == (2, 2)
    assert first.gradient.shape == first.displacement.shape
    run.stop()
    rest = list(gen)
    assert rest[-1].final and rest[-1].stopped and run.result.stopped
    assert len(rest) <= 3


def test_stack_snapshots():
    stack, shifts = data.drifting_timelapse(frames=4, size=64)
    run = RegistrationRun(None, stack, RunSettings(mode="stack", model="translation"))
    snaps = list(run.snapshots())
    assert snaps[-1].final and snaps[-1].warped.shape == stack.shape
    np.testing.assert_allclose(run.result.shifts, shifts, atol=0.3)
    with pytest.raises(ValueError, match="T ≥ 2"):
        RegistrationRun(None, stack[0], RunSettings(mode="stack"))


def test_apply_and_layer_affine():
    t = AffineTransform(np.array([[1, 0, 2.0], [0, 1, -1.0], [0, 0, 1]]), "translation")
    labels = np.zeros((10, 10), np.int32)
    labels[4:6, 4:6] = 3
    out = apply_transforms([t], labels, labels=True)
    assert out.dtype == np.int32 and out[2:4, 5:7].tolist() == [[3, 3], [3, 3]]
    np.testing.assert_allclose(layer_affine(t)[:2, 2], (-2.0, 1.0))
