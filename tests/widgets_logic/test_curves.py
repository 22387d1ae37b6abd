"""The Register widget's plot data (widgets_logic/curves.py): per snapshot for pairs,
per frame for drift runs."""

from __future__ import annotations

import numpy as np
import pytest

from napari_simwarp import data
from napari_simwarp.registration.quality import RegistrationWarning
from napari_simwarp.widgets_logic.curves import (
    FrameLosses,
    frame_similarity_curve,
    snapshot_curve,
)
from napari_simwarp.widgets_logic.registration import RegistrationRun, RunSettings


def test_snapshot_curve_is_loss_against_snapshot_without_non_finite_values():
    c = snapshot_curve([3.0, float("nan"), 2.0, 1.0], [0, 0, 1, 1])
    assert c.x == (0.0, 2.0, 3.0) and c.y == (3.0, 2.0, 1.0) and c.levels == (0, 1, 1)
    assert c.x_label == "snapshot" and c.now == "now 1" and c.log
    assert not snapshot_curve([-0.9, -0.5]).log  # −NCC: no logarithm


def test_frame_losses_give_each_frame_its_batchs_latest_loss_per_level():
    # 7 stack frames, reference "previous": moving frame i is stack frame i + 1.
    frames = FrameLosses(7, offset=1)
    frames.update(slice(0, 3), 0, 5.0)
    frames.update(slice(0, 3), 0, 4.0)  # the batch improves: its frames show the latest
    frames.update(slice(0, 3), 1, 2.0)
    frames.update(slice(3, 6), 0, 9.0)
    c = frames.curve()
    assert c.x_label == "frame" and c.now == "frames 4–6: 9"
    by_level = {
        lv: {x: y for x, y, l2 in zip(c.x, c.y, c.levels) if l2 == lv} for lv in set(c.levels)
    }
    assert by_level[0] == {1: 4.0, 2: 4.0, 3: 4.0, 4: 9.0, 5: 9.0, 6: 9.0}
    assert by_level[1] == {1: 2.0, 2: 2.0, 3: 2.0}  # frame 0 is the reference: no loss


def test_frame_similarity_curve_spans_zero_to_one_and_names_the_worst_frame():
    c = frame_similarity_curve([1.0, 0.98, 0.2, 0.97])
    assert c.x == (0.0, 1.0, 2.0, 3.0) and c.y == (1.0, 0.98, 0.2, 0.97)
    assert c.y_range == (0.0, 1.0) and not c.log and c.now == "lowest 0.200 (frame 2)"
    assert frame_similarity_curve([0.9, -0.3]).y_range == (-0.3, 1.0)


def test_a_drift_run_is_plotted_per_frame_and_a_failed_frame_is_a_drop():
    pytest.importorskip("dask")  # the drift display shows a lazy stack (focus_stack)
    stack, _ = data.drifting_timelapse(frames=6, size=64)
    failed = 3
    stack[failed] = np.random.default_rng(1).random((64, 64), dtype=np.float32)  # noise
    run = RegistrationRun(None, stack, RunSettings(mode="stack", model="translation"))
    with pytest.warns(RegistrationWarning, match=rf"frame\(s\) {failed}\b"):
        snaps = list(run.snapshots())
    for snap in snaps[:-1]:  # live: x is a frame index, never a snapshot count
        assert snap.curve.x_label == "frame" and set(snap.curve.x) <= set(range(6))
    final = snaps[-1].curve
    assert final.x == tuple(range(6)) and final.x_label == "frame"
    sims = dict(zip(final.x, final.y))
    # Noise shares nothing with the scene (ZNCC ~0); the drifting frames, once aligned,
    # are the scene again (ZNCC near 1).
    assert abs(sims[failed]) < 0.2
    assert min(v for t, v in sims.items() if t != failed) > 0.8
    assert f"frame {failed}" in final.now


def test_a_pair_run_keeps_the_loss_per_snapshot():
    fixed, moving, _ = data.deformed_pair()
    run = RegistrationRun(
        fixed[::4, ::4], moving[::4, ::4], RunSettings(model="affine", levels=2, iterations=10)
    )
    final = list(run.snapshots())[-1]
    assert final.curve.x_label == "snapshot" and final.curve.y == tuple(final.losses)
    assert final.curve.x == tuple(range(len(final.losses)))
    assert final.curve.levels == tuple(final.loss_levels) and set(final.loss_levels) == {0, 1}
