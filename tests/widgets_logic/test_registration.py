"""The registration run adapter (widgets_logic/registration.py): snapshots, stop, stacks."""

from __future__ import annotations

import numpy as np
import pytest

from napari_simwarp import data
from napari_simwarp.registration import AffineTransform
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


def test_snapshots_are_throttled_to_what_the_display_can_show_and_lose_no_loss():
    # Issue 13: every progress report crossed to the GUI thread with its arrays. With
    # intervals longer than the run, one snapshot with arrays (the first) and the final one
    # cross; the reports in between are merged, and the curve still has every loss.
    fixed = data.camera()[200:264, 200:264]
    from scipy import ndimage as ndi

    moving = ndi.shift(fixed, (2.0, -1.0), order=1, mode="nearest")
    long = 1e9  # seconds: never due again within this run
    settings = RunSettings(
        model="translation",
        metric="lncc",
        iterations=30,
        levels=1,
        report_every=1,
        min_interval=long,
        vectors_interval=long,
        yield_interval=long,
    )
    run = RegistrationRun(fixed, moving, settings)
    snaps = list(run.snapshots())
    assert len(snaps) == 2 and snaps[-1].final
    assert snaps[0].warped is not None  # the first shows the image at once
    reports = len(run.result.loss_history)
    assert reports >= 10 and len(run.losses) >= reports - 1  # merged, not dropped


def test_a_run_within_live_after_shows_its_result_only_and_computes_no_display(monkeypatch):
    # Issue 27: a live display of a run that ends within a moment cost it a third of its
    # time. Within settings.live_after, nothing crosses to the GUI thread but the final
    # snapshot and no display data (warped image, similarity, arrows) is made for it.
    from scipy import ndimage as ndi

    fixed = data.camera()[200:264, 200:264]
    moving = ndi.shift(fixed, (2.0, -1.0), order=1, mode="nearest")
    fills = []
    real_fill = RegistrationRun._fill_pair
    monkeypatch.setattr(
        RegistrationRun,
        "_fill_pair",
        lambda self, snap, *a, **k: (
            fills.append(k.get("final", False)) or real_fill(self, snap, *a, **k)
        ),
    )
    settings = dict(model="translation", iterations=30, levels=1, report_every=1)
    quiet = RegistrationRun(fixed, moving, RunSettings(**settings, live_after=1e9))
    snaps = list(quiet.snapshots())
    assert len(snaps) == 1 and snaps[0].final and snaps[0].warped is not None
    assert fills == [True]  # the final snapshot's only
    assert len(quiet.losses) >= len(quiet.result.loss_history) - 1  # every loss kept
    # the curve still runs from the start to the result
    assert len(snaps[0].curve.x) >= 2 and snaps[0].curve.x[0] == 0
    fills.clear()
    live = RegistrationRun(fixed, moving, RunSettings(**settings, live_after=0.0))
    assert len(list(live.snapshots())) > 2 and fills.count(False) >= 1
    # what the run computes does not depend on what it shows
    np.testing.assert_array_equal(
        quiet.result.transform.to_displacement(fixed.shape),
        live.result.transform.to_displacement(fixed.shape),
    )


def test_a_quiet_first_level_keeps_its_place_on_the_similarity_curve(monkeypatch):
    # The curve's point before the run belongs to the level the run began on (the
    # coarsest), also when that level ended within the quiet start and so has no point
    # of its own (the first measured point then comes from a later level).
    from scipy import ndimage as ndi

    fixed = data.camera()[128:256, 128:256]
    moving = ndi.shift(fixed, (2.0, -1.0), order=1, mode="nearest")
    real_snapshot = RegistrationRun._snapshot
    state = {"quiet": True}

    def snapshot(self, progress, fill):
        state["quiet"] = int(progress.level) == 0  # the engine's coarsest level, quiet
        return real_snapshot(self, progress, fill)

    monkeypatch.setattr(RegistrationRun, "_snapshot", snapshot)
    monkeypatch.setattr(RegistrationRun, "_quiet", lambda self, now=None: state["quiet"])
    settings = RunSettings(
        model="translation", levels=3, iterations=8, report_every=1, min_interval=0.0
    )
    run = RegistrationRun(fixed, moving, settings)
    final = list(run.snapshots())[-1]
    coarsest = run.levels - 1  # napari's numbering: 0 is the full resolution
    assert final.curve.x[0] == 0 and final.curve.levels[0] == coarsest
    assert coarsest not in final.curve.levels[1:]  # no point of its own: it was quiet
    assert final.curve.levels[-1] == 0  # the result, at the full resolution


def test_drift_frames_aligned_within_live_after_reach_the_first_live_shift_plot(monkeypatch):
    # The quiet start makes no display data, but the frames it aligned are on the shift
    # plot of the first snapshot after it (not only on the final one). Batches of 2
    # frames, quiet through the whole first batch: the first live plot must hold the
    # first batch's frames, which no later report carries.
    stack, _ = data.drifting_timelapse(frames=8, size=64)
    real_kwargs, real_snapshot = RegistrationRun._engine_kwargs, RegistrationRun._snapshot
    monkeypatch.setattr(
        RegistrationRun, "_engine_kwargs", lambda self: {**real_kwargs(self), "batch_size": 2}
    )
    state = {"quiet": True, "batches": []}

    def snapshot(self, progress, fill):
        state["quiet"] = progress.frames.start == 0  # quiet through the first batch
        state["batches"].append((progress.frames.start, progress.frames.stop))
        return real_snapshot(self, progress, fill)

    monkeypatch.setattr(RegistrationRun, "_snapshot", snapshot)
    monkeypatch.setattr(RegistrationRun, "_quiet", lambda self, now=None: state["quiet"])
    settings = RunSettings(
        mode="stack", model="translation", iterations=5, report_every=1, min_interval=0.0
    )
    run = RegistrationRun(None, stack, settings)
    snaps = []
    for snap in run.snapshots():
        if not snaps and not snap.final:
            reported = set(state["batches"])  # the batches reported up to the first live one
        snaps.append(snap)
    live = [s for s in snaps if not s.final]
    assert live, "no snapshot after the quiet start"
    assert (0, 2) in reported and len(reported) >= 2  # the first batch came before, quiet
    aligned = {frame for begin, stop in reported for frame in range(begin, stop)}
    shown = set(np.asarray(live[0].curve.x, int).tolist())  # frames on its shift plot
    assert aligned <= shown, (sorted(aligned), sorted(shown))
    assert np.isfinite(run._frame_shifts.shifts).all()  # every frame, by the end


def test_abort_ends_the_run_at_the_next_report_with_no_result():
    # A closing viewer wants the run over, not finished: no final level, no result.
    fixed, moving, _ = data.deformed_pair()
    run = RegistrationRun(
        fixed, moving, RunSettings(model="deformable", iterations=500, report_every=1)
    )
    reports = []
    real = run._snapshot
    run._snapshot = lambda progress, fill: reports.append(progress.level) or real(progress, fill)
    gen = run.snapshots()
    next(gen)
    run.abort()
    rest = list(gen)
    assert rest == [] and run.result is None and run.stopping
    assert len(reports) <= 2 and reports[-1] == 0  # still on the coarsest level


def test_the_status_counts_the_levels_the_run_optimizes():
    """Above Adam's full-resolution size (256²) the engine skips the finest level: the
    status names the levels that run as napari does (4 to 1 of a 5-level pyramid), as the
    curve's legend does, and says where it ends; a 128² pair runs every level."""
    fixed, moving, _ = data.deformed_pair()  # 512²: 5 levels, the finest skipped
    run = RegistrationRun(fixed, moving, RunSettings(model="deformable", iterations=2))
    snaps = list(run.snapshots())
    ran = sorted(set(run.loss_levels))
    assert run.levels == 5 and run.run_levels == len(ran) == 4
    # levels named as napari names them (0: full resolution): 4 … 1 here, as in the legend
    named = {int(snap.describe().split("level ")[1].split(" ")[0]) for snap in snaps}
    assert named == {run.levels - 1 - lv for lv in ran} == {4, 3, 2, 1}
    assert set(snaps[-1].curve.levels) <= named
    assert snaps[-1].final and snaps[-1].describe().startswith("done: level 1 (1 above full")
    small = RegistrationRun(fixed[:128, :128], moving[:128, :128], RunSettings(model="affine"))
    assert small.run_levels == small.levels


def test_stack_snapshots():
    pytest.importorskip("dask")  # the drift display shows a lazy stack (focus_stack)
    stack, shifts = data.drifting_timelapse(frames=4, size=64)
    run = RegistrationRun(None, stack, RunSettings(mode="stack", model="translation"))
    snaps = list(run.snapshots())
    assert snaps[-1].final and snaps[-1].warped.shape == stack.shape
    np.testing.assert_allclose(run.result.shifts, shifts, atol=0.3)
    with pytest.raises(ValueError, match="T ≥ 2"):
        RegistrationRun(None, stack[0], RunSettings(mode="stack"))


def test_displayed_displacement_is_the_physical_motion_in_fixed_pixels():
    from napari_simwarp.registration.grid import Grid
    from napari_simwarp.widgets_logic.registration import physical_displacement

    fixed_grid, moving_grid = Grid.make(2, (0.5, 0.25), (1.0, 2.0)), Grid.make(2, 1.0, (0.0, 3.0))
    physical = np.array([[1.0, 0.0, 0.3], [0.0, 1.0, -0.2], [0, 0, 1]])  # a physical shift
    pixels = moving_grid.to_pixels() @ physical @ fixed_grid.to_physical()
    t = AffineTransform(pixels, "translation").with_grids(fixed_grid, moving_grid)
    shown = physical_displacement(t, t.to_displacement((6, 5)))
    # the shift (0.3, -0.2) in fixed pixels of (0.5, 0.25): (0.6, -0.8) everywhere
    np.testing.assert_allclose(shown[0], 0.6, atol=1e-5)
    np.testing.assert_allclose(shown[1], -0.8, atol=1e-5)
    same = AffineTransform(np.eye(3), "translation")
    d = np.ones((2, 6, 5), np.float32)
    assert physical_displacement(same, d) is d


def test_points_layers_give_world_coordinates_and_must_pair_up():
    from types import SimpleNamespace

    from napari_simwarp.widgets_logic.registration import check_landmarks, landmarks_from_layers

    fixed = SimpleNamespace(
        name="f", data=np.array([[1.0, 2.0], [3.0, 5.0]]), scale=(0.5, 2.0), translate=(1.0, -1.0)
    )
    moving = SimpleNamespace(
        name="m", data=np.array([[4.0, 4.0]]), scale=(1.0, 1.0), translate=(0, 0)
    )
    x, y = landmarks_from_layers(fixed, moving)
    np.testing.assert_allclose(x, [[1.5, 3.0], [2.5, 9.0]])  # data · scale + translate
    np.testing.assert_allclose(y, [[4.0, 4.0]])
    assert landmarks_from_layers(None, None) is None
    with pytest.raises(ValueError, match="both a fixed points layer and a moving points layer"):
        landmarks_from_layers(fixed, None)
    with pytest.raises(ValueError, match="2 fixed and 1 moving points"):
        check_landmarks((x, y), RunSettings(), 2)
    with pytest.raises(ValueError, match="must be 2-D like the images"):
        check_landmarks((np.zeros((2, 3)), np.zeros((2, 3))), RunSettings(), 2)
    with pytest.raises(ValueError, match="a landmark weight needs fixed and moving points"):
        check_landmarks(None, RunSettings(landmark_weight=0.1), 2)
    moving.rotate = np.array([[0.0, -1.0], [1.0, 0.0]])
    with pytest.raises(ValueError, match="rotation"):
        landmarks_from_layers(fixed, moving)


def test_stack_mode_registers_on_the_stack_layers_grid():
    pytest.importorskip("dask")  # the drift display shows a lazy stack (focus_stack)
    from napari_simwarp.registration.grid import Grid

    stack, shifts = data.drifting_timelapse(frames=3, size=64)
    grid = Grid.make(2, (0.5, 0.25), (1.0, 2.0))
    settings = RunSettings(mode="stack", model="translation")
    run = RegistrationRun(None, stack, settings, moving_grid=grid)
    assert run._engine_kwargs()["spacing"] == grid.spacing
    list(run.snapshots())
    np.testing.assert_allclose(run.result.shifts, shifts, atol=0.3)  # pixel shifts as before
    assert all(t.fixed_grid == grid and t.moving_grid == grid for t in run.result.transforms)


def test_stack_mode_keeps_a_lazy_stack_lazy():
    da = pytest.importorskip("dask.array")

    stack, _ = data.drifting_timelapse(frames=6, size=64)
    reads = []

    def counted(block, block_info=None):
        reads.append(block_info[0]["chunk-location"][0])
        return block

    lazy = da.from_array(stack, chunks=(1, 64, 64)).map_blocks(counted, dtype=stack.dtype)
    settings = RunSettings(mode="stack", model="rigid", iterations=5, min_interval=0.0)
    run = RegistrationRun(None, lazy, settings)
    assert run.lazy and reads == []  # nothing read on the thread that made the run
    snaps = list(run.snapshots())
    live = [s.warped for s in snaps[:-1] if s.warped is not None]
    assert live and all(isinstance(w, da.Array) for w in live)
    assert isinstance(snaps[-1].warped, da.Array)
    reads.clear()
    frame = np.asarray(snaps[-1].warped[3])  # what napari does for the frame it shows
    assert reads == [3]
    # the same run on the NumPy stack: the same transforms and aligned frame
    eager = RegistrationRun(None, stack, settings)
    list(eager.snapshots())
    for lazy_t, eager_t in zip(run.result.transforms, eager.result.transforms):
        np.testing.assert_allclose(lazy_t.matrix, eager_t.matrix, atol=1e-4)
    np.testing.assert_allclose(frame, eager.result.warped[3], atol=1e-4)


def _counting_warps(run):
    """Record ``(snapshot step, frame)`` of each frame the run warps for the display."""
    warps = []
    real = run._warp_frame

    def counted(t, transform, frame):
        warps.append((run._step, t))
        return real(t, transform, frame)

    run._warp_frame = counted
    return warps


@pytest.mark.parametrize("lazy", [False, True])
def test_drift_display_warps_only_the_focused_frame_and_follows_it(lazy):
    pytest.importorskip("dask")  # the drift display shows a lazy stack (focus_stack)
    from scipy import ndimage as ndi

    stack, _ = data.drifting_timelapse(frames=8, size=64)
    moving = stack
    if lazy:
        da = pytest.importorskip("dask.array")

        moving = da.from_array(stack, chunks=(1, 64, 64))
    settings = RunSettings(mode="stack", model="translation", iterations=30, min_interval=0.0)
    run = RegistrationRun(None, moving, settings)
    warps = _counting_warps(run)
    run.focus = 3
    gen = run.snapshots()
    shown = []
    for i, snap in enumerate(gen):
        if snap.final:
            break
        if i == 0:  # the user moves the slider while the first snapshot is shown
            run.focus = 6
        live = snap.warped
        assert live.shape == stack.shape
        t = run._focus_shown[0]
        tr = run._current[t]
        # the focused frame, warped by its current transform (SciPy: linear, zeros outside)
        expected = ndi.affine_transform(stack[t], tr.matrix, order=1, mode="grid-constant")
        np.testing.assert_allclose(np.asarray(live[t]), expected, atol=1e-4)
        other = 0 if t else 1
        # the other frames as they are (NumPy) or blank (lazy: nothing read for them)
        np.testing.assert_array_equal(np.asarray(live[other]), 0 if lazy else stack[other])
        shown.append(t)
    steps = [step for step, _ in warps]
    assert len(steps) == len(set(steps))  # at most one frame warped per snapshot
    assert len(shown) >= 2 and shown[0] == 3 and set(shown[1:]) == {6}
    assert {t for _, t in warps} == {3, 6}
    assert run.result.warped.shape == stack.shape  # the final result: every frame


def test_stack_arrows_of_linear_transforms_equal_the_dense_field_at_their_positions():
    from napari_simwarp.widgets_logic.vectors import field_to_vectors

    stack, _ = data.drifting_timelapse(frames=3, size=64)
    run = RegistrationRun(None, stack, RunSettings(mode="stack", model="affine"))
    m = np.array([[1.02, 0.05, 1.5], [-0.03, 0.98, -2.0], [0, 0, 1]])
    arrows = run._stack_vectors({2: AffineTransform(m, "affine")})
    # the dense field d(x) = A x + b - x, by NumPy, then sampled where the arrows start
    grid = np.stack(np.meshgrid(np.arange(64.0), np.arange(64.0), indexing="ij"))
    dense = np.tensordot(m[:2, :2], grid, axes=1) + m[:2, 2, None, None] - grid
    expected = field_to_vectors(dense, run.spacing)
    np.testing.assert_allclose(arrows[:, 0, 1:], expected[:, 0])
    np.testing.assert_allclose(arrows[:, 1, 1:], expected[:, 1], atol=1e-5)
    assert (arrows[:, 0, 0] == 2).all() and (arrows[:, 1, 0] == 0).all()
