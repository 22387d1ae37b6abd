"""The Register widget's plot data (widgets_logic/curves.py): the similarity against the
iteration for pairs, the shift per frame for drift runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp import data
from napari_simwarp.registration.quality import RegistrationWarning
from napari_simwarp.registration.transforms import AffineTransform
from napari_simwarp.widgets_logic.curves import (
    FrameShifts,
    empty_curve,
    frame_similarity_curve,
    shift_curve,
    similarity_curve,
    snapshot_curve,
)
from napari_simwarp.widgets_logic.registration import RegistrationRun, RunSettings


def test_snapshot_curve_is_loss_against_snapshot_without_non_finite_values():
    c = snapshot_curve([3.0, float("nan"), 2.0, 1.0], [0, 0, 1, 1])
    assert c.x == (0.0, 2.0, 3.0) and c.y == (3.0, 2.0, 1.0) and c.levels == (0, 1, 1)
    assert c.x_label == "snapshot" and c.now == "now 1" and c.log
    assert not snapshot_curve([-0.9, -0.5]).log  # −NCC: no logarithm


def test_similarity_curve_names_levels_as_napari_does():
    c = similarity_curve([0, 5, 9], [0.9, 0.95, 0.99], [2, 1, 0])
    # 0: full resolution; the coarsest (first in the legend) says what the numbers are
    assert c.name(0) == "0 (full)" and c.name(1) == "1" and c.name(2) == "level 2"
    assert similarity_curve([0], [0.9], [0]).name(0) == "level 0 (full)"
    assert c.x_label == "iteration (all levels)" and c.y_label == "similarity (ZNCC)"
    assert not c.log and c.now == "ZNCC 0.990"
    # one quantity through the levels: joined across them; a drift plot's axes are not
    assert c.joined and not shift_curve(np.zeros((3, 2))).joined


def _shift(*t):
    m = np.eye(len(t) + 1)
    m[:-1, -1] = t
    return AffineTransform(m, "translation")


def test_frame_shifts_are_each_frames_translation_per_axis():
    shifts = FrameShifts(4, 2)
    shifts.update({0: _shift(0.0, 0.0), 2: _shift(1.5, -2.0)})
    c = shifts.curve()
    by_axis = {
        c.name(k): {x: y for x, y, k2 in zip(c.x, c.y, c.levels) if k2 == k} for k in set(c.levels)
    }
    assert by_axis == {"y": {0: 0.0, 2: 1.5}, "x": {0: 0.0, 2: -2.0}}  # frames 1, 3: not yet
    assert c.x_label == "frame" and c.y_label == "shift (px)" and not c.log


def test_shift_curve_names_the_frame_of_lowest_similarity():
    c = shift_curve(np.zeros((4, 3)), similarity=[1.0, 0.98, 0.2, 0.97])
    assert c.now == "lowest ZNCC 0.200 (frame 2)" and {c.name(k) for k in c.levels} == {
        "z",
        "y",
        "x",
    }


def test_frame_similarity_curve_spans_zero_to_one_and_names_the_worst_frame():
    c = frame_similarity_curve([1.0, 0.98, 0.2, 0.97])
    assert c.x == (0.0, 1.0, 2.0, 3.0) and c.y == (1.0, 0.98, 0.2, 0.97)
    assert c.y_range == (0.0, 1.0) and not c.log and c.now == "lowest 0.200 (frame 2)"
    assert frame_similarity_curve([0.9, -0.3]).y_range == (-0.3, 1.0)


def test_a_drift_run_plots_each_frames_shift_and_names_a_failed_frame():
    pytest.importorskip("dask")  # the drift display shows a lazy stack (focus_stack)
    stack, true = data.drifting_timelapse(frames=6, size=64)
    failed = 3
    stack[failed] = np.random.default_rng(1).random((64, 64), dtype=np.float32)  # noise
    run = RegistrationRun(None, stack, RunSettings(mode="stack", model="translation"))
    with pytest.warns(RegistrationWarning, match=rf"frame\(s\) {failed}\b"):
        snaps = list(run.snapshots())
    for snap in snaps[:-1]:  # live: x is a frame index, never a snapshot count
        assert snap.curve.x_label == "frame" and set(snap.curve.x) <= set(range(6))
    final = snaps[-1].curve
    assert final.y_label == "shift (px)" and f"(frame {failed})" in final.now
    got = np.full((6, 2), np.nan)
    for x, y, axis in zip(final.x, final.y, final.levels):
        got[int(x), axis] = y
    np.testing.assert_array_equal(got, run.result.shifts)  # the plot is the result's shifts
    good = [t for t in range(6) if t != failed]
    np.testing.assert_allclose(got[good], true[good], atol=0.3)  # against the true drift


def test_a_pair_run_plots_the_similarity_the_result_reports():
    fixed, moving, _ = data.deformed_pair()
    run = RegistrationRun(
        fixed[::4, ::4], moving[::4, ::4], RunSettings(model="affine", levels=2, iterations=10)
    )
    final = list(run.snapshots())[-1]
    c, res = final.curve, run.result
    assert c.x_label == "iteration (all levels)" and c.y_label == "similarity (ZNCC)"
    # starts at the result's initial similarity, ends at its final one (status agrees)
    assert c.y[0] == pytest.approx(res.initial_similarity) and c.y[-1] == pytest.approx(
        res.similarity
    )
    assert c.levels[0] == 1 and c.levels[-1] == 0  # napari's numbering: 0 is full resolution
    assert list(c.x) == sorted(c.x)
    # the points in between are the masked ZNCC of the pre-blurred images the engine sees
    # (independent check of one: the result's own transform gives its similarity)
    value = run._similarity(res.transform, res.warped)
    assert value == pytest.approx(res.similarity, abs=2e-3)
    assert torch.is_tensor(run._similarity_inputs[0])


def test_empty_curve_names_what_a_run_of_the_mode_will_plot():
    pair = empty_curve("pair", "lncc")
    assert (pair.x, pair.y) == ((), ())
    assert (pair.x_label, pair.y_label) == ("iteration (all levels)", "similarity (ZNCC)")
    assert empty_curve("pair", "mi").y_label == "similarity (normalized MI)"
    drift = empty_curve("stack")
    assert (drift.x_label, drift.y_label) == ("frame", "shift (px)")
    with pytest.raises(ValueError, match="mode must be 'pair' or 'stack'"):
        empty_curve("pairs")
