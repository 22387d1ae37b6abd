"""The registration run adapter (widgets_logic/registration.py): snapshots, stop, stacks."""

from __future__ import annotations

import numpy as np
import pytest

from napari_simwarp import data
from napari_simwarp.widgets_logic.registration import RegistrationRun, RunSettings


def test_pair_snapshots_and_stop():
    fixed = data.camera()[200:264, 200:264]
    from scipy import ndimage as ndi

    moving = ndi.shift(fixed, (2.0, -1.0), order=1, mode="nearest")
    run = RegistrationRun(
        fixed, moving, RunSettings(model="translation", iterations=200, levels=1, report_every=1)
    )
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
