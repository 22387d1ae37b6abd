"""The "Register" widget on a real viewer: pairs, 3-D, stacks, cancel, close."""

from __future__ import annotations

import dataclasses
import weakref

import numpy as np
import pytest

from napari_simwarp import data
from napari_simwarp._qt import RegisterWidget
from napari_simwarp._qt._plot import LEVEL_COLORS
from napari_simwarp.registration import load_transform

from .conftest import dock, no_workers_running, slow_reports


def _setup(viewer, fixed, moving, **values):
    f = viewer.add_image(fixed.copy(), name="fixed") if fixed is not None else None
    m = viewer.add_image(moving.copy(), name="moving")
    w = dock(viewer, RegisterWidget(viewer))
    w._fixed.value, w._moving.value = f, m
    for key, value in values.items():
        getattr(w, f"_{key}").value = value
    return w, f, m


def _run(qtbot, w, timeout=120000):
    w.run()
    qtbot.waitUntil(lambda: w.result is not None and not w.busy, timeout=timeout)


def test_deformable_pair_within_tolerance(viewer, qtbot, small_pair, tmp_path):
    fixed, moving, true = small_pair
    w, f, m = _setup(viewer, fixed, moving, model="deformable", iterations=25)
    _run(qtbot, w)
    assert w.snapshots_received >= 2 and w.snapshots_shown >= 1  # live updates arrived
    est = w.result.transform.to_displacement(fixed.shape)
    inner = (slice(8, -8), slice(8, -8))
    err = np.sqrt(((est - true) ** 2).sum(0))[inner].mean()
    before = np.sqrt((true**2).sum(0))[inner].mean()
    # Tolerance: mean end-point error under 0.5 px (the true field averages ~2 px here).
    assert err < 0.5 and before > 1.0, (err, before)
    warped = viewer.layers["moving registered"]
    np.testing.assert_allclose(warped.data, w.result.warped)
    disp, grad = viewer.layers["displacement"], viewer.layers["similarity gradient"]
    assert disp.data.shape[1:] == (2, 2) and grad.data.shape[1:] == (2, 2)
    assert len(disp.data) <= 21**2 < fixed.size  # subsampled: about 20 arrows per axis
    np.testing.assert_array_equal(f.data, fixed)
    np.testing.assert_array_equal(m.data, moving)
    assert w._save_btn.enabled and w._apply_btn.enabled and not w._affine_btn.enabled

    # Save and load the transform; apply it to a labels layer (nearest neighbor).
    path = w.save_transform(tmp_path / "t.npz")[0]
    np.testing.assert_allclose(load_transform(path).to_displacement(fixed.shape), est)
    labels = viewer.add_labels((moving > 0.5).astype(np.int32) * 7, name="mask")
    out = w.apply_to_layer(labels)
    assert out.name == "mask registered" and out.data.dtype == np.int32
    assert set(np.unique(out.data)) <= {0, 7}

    # A rerun reuses the result layers.
    n_layers = len(viewer.layers)
    _run(qtbot, w)
    assert len(viewer.layers) == n_layers


def test_affine_shown_through_layer_affine(viewer, qtbot, camera_crop):
    from scipy import ndimage as ndi

    moving = ndi.shift(camera_crop, (3.0, -2.0), order=3, mode="nearest").astype(np.float32)
    w, _f, m = _setup(viewer, camera_crop, moving, model="translation", iterations=30, metric="ncc")
    _run(qtbot, w)
    np.testing.assert_allclose(w.result.transform.translation, (3.0, -2.0), atol=0.2)
    assert w._affine_btn.enabled
    w.show_affine()
    np.testing.assert_allclose(m.affine.affine_matrix[:2, 2], (-3.0, 2.0), atol=0.2)
    np.testing.assert_array_equal(m.data, moving)  # shown aligned, not resampled


def test_3d_pair(viewer, qtbot):
    fixed, moving, _ = data.deformed_volume_pair(size=32, amplitude=2.0)
    w, _f, _m = _setup(
        viewer, fixed, moving, model="affine", iterations=10, levels=2, gradient=True
    )
    _run(qtbot, w)
    assert viewer.layers["moving registered"].data.shape == fixed.shape
    assert viewer.layers["displacement"].data.shape[1:] == (2, 3)
    assert viewer.layers["similarity gradient"].data.shape[1:] == (2, 3)


def test_drift_stack(viewer, qtbot):
    stack, shifts = data.drifting_timelapse(frames=6, size=64)
    w, _, m = _setup(viewer, None, stack, mode="time-lapse (drift)")
    assert w._model.value == "translation"
    _run(qtbot, w)
    np.testing.assert_allclose(w.result.shifts, shifts, atol=0.25)
    assert viewer.layers["moving registered"].data.shape == stack.shape
    assert viewer.layers["displacement"].data.shape[1:] == (2, 3)  # (t, y, x) arrows
    np.testing.assert_array_equal(m.data, stack)


def test_drift_live_display_warps_only_the_frame_on_screen_and_follows_it(
    viewer, qtbot, monkeypatch
):
    import threading

    from napari_simwarp.widgets_logic.registration import RegistrationRun

    stack, shifts = data.drifting_timelapse(frames=12, size=64)
    w, _, _ = _setup(viewer, None, stack, mode="time-lapse (drift)", iterations=30)
    settings = w.settings
    w.settings = lambda: dataclasses.replace(settings(), min_interval=0.0)  # every snapshot
    viewer.dims.set_current_step(0, 4)
    warps, moved = [], threading.Event()
    real = RegistrationRun._warp_frame

    def counted(run, t, transform, frame):
        warps.append((run._step, t))
        moved.wait(30)  # the first snapshot waits until the test has moved the slider
        return real(run, t, transform, frame)

    monkeypatch.setattr(RegistrationRun, "_warp_frame", counted)
    w.run()
    qtbot.waitUntil(lambda: len(warps) >= 1, timeout=60000)
    viewer.dims.set_current_step(0, 9)  # the user moves the slider mid-run
    assert w._run.focus == 9
    moved.set()
    qtbot.waitUntil(lambda: w.result is not None and not w.busy, timeout=120000)
    np.testing.assert_allclose(w.result.shifts, shifts, atol=0.25)
    steps = [step for step, _ in warps]
    assert len(steps) == len(set(steps))  # one frame warped per snapshot at most, not 12
    assert warps[0][1] == 4 and warps[-1][1] == 9 and {t for _, t in warps} == {4, 9}
    assert viewer.layers["moving registered"].data.shape == stack.shape


def test_drift_of_a_lazy_stack_reads_it_only_in_the_worker(viewer, qtbot):
    import threading

    da = pytest.importorskip("dask.array")

    stack, shifts = data.drifting_timelapse(frames=6, size=64)
    gui = threading.get_ident()
    readers = set()

    def counted(block):
        readers.add(threading.get_ident())
        return block

    lazy = da.from_array(stack, chunks=(1, 64, 64)).map_blocks(counted, dtype=stack.dtype)
    w, _, _ = _setup(viewer, None, lazy, mode="time-lapse (drift)")
    readers.clear()  # napari itself reads the plane it shows, on its own
    w.run()
    assert gui not in readers  # starting the run read nothing on the GUI thread
    qtbot.waitUntil(lambda: w.result is not None and not w.busy, timeout=120000)
    np.testing.assert_allclose(w.result.shifts, shifts, atol=0.25)
    registered = viewer.layers["moving registered"]
    assert isinstance(registered.data, da.Array) and registered.data.shape == stack.shape


def test_drift_stack_on_the_layers_grid(viewer, qtbot):
    stack, shifts = data.drifting_timelapse(frames=3, size=64)
    w, _, m = _setup(viewer, None, stack, mode="time-lapse (drift)")
    m.scale, m.translate = (1.0, 0.5, 0.25), (0.0, 3.0, -1.0)
    _run(qtbot, w)
    np.testing.assert_allclose(w.result.shifts, shifts, atol=0.25)
    grid = w.result.transforms[1].fixed_grid
    assert grid.spacing == (0.5, 0.25) and grid.origin == (3.0, -1.0)


def test_cancel_stops_the_run(viewer, qtbot):
    fixed, moving, _ = data.deformed_pair()
    w, _, _ = _setup(viewer, fixed, moving, model="deformable", iterations=500)
    w.run()
    assert w.busy and w._cancel_btn.enabled
    # Cancel at once: the run is asked to stop at its first snapshot (iteration 5 of
    # 5 × 500), whatever the speed of the machine.
    w.cancel()
    qtbot.waitUntil(lambda: not w.busy, timeout=60000)
    assert w.result is not None and w.result.stopped
    assert len(w.result.loss_history) < 50
    assert w.snapshots_shown >= 1  # the best-so-far result reached the layers
    assert viewer.layers["moving registered"].data.shape == fixed.shape
    qtbot.waitUntil(no_workers_running, timeout=30000)
    assert w._run_btn.enabled and not w._cancel_btn.enabled and w._save_btn.enabled


def test_closing_the_viewer_mid_run_leaves_no_worker(make_napari_viewer, qtbot):
    fixed, moving, _ = data.deformed_pair()
    viewer = make_napari_viewer()
    w, _, _ = _setup(viewer, fixed, moving, model="deformable", iterations=500)
    w.run()
    run = w._run
    viewer.close()  # while the worker runs
    assert run.stopping
    qtbot.waitUntil(no_workers_running, timeout=30000)
    assert run.result is None or run.result.stopped


def test_bad_input_is_a_notification(viewer, qtbot, errors):
    w, _, _ = _setup(viewer, np.zeros((8, 8, 8), np.float32) + 1, np.ones((16, 16), np.float32))
    w.run()
    assert errors and "dimensionality" in errors[0] and not w.busy


def test_affine_display_with_scaled_and_translated_layers(viewer, qtbot, camera_crop):
    # napari applies a layer's affine after its own scale/translate: moving data q must
    # land where the fixed layer shows M⁻¹ q (it was off by the scale before).
    from scipy import ndimage as ndi

    moving = ndi.shift(camera_crop, (3.0, -2.0), order=3, mode="nearest")
    w, f, m = _setup(viewer, camera_crop, moving, model="translation")
    f.scale, f.translate = (2.0, 2.0), (10.0, -4.0)
    m.scale, m.translate = (2.0, 2.0), (10.0, -4.0)
    _run(qtbot, w)
    w.show_affine()
    q = np.array([50.0, 50.0])
    matrix = w.result.transform.matrix
    p = np.linalg.solve(matrix, np.r_[q, 1.0])[:2]  # fixed data position of moving q
    np.testing.assert_allclose(m.data_to_world(q), f.data_to_world(p), atol=1e-6)


def test_apply_refuses_rgb_layers_with_a_notification(viewer, qtbot, camera_crop, errors):
    w, _f, _m = _setup(viewer, camera_crop, camera_crop, model="translation", iterations=5)
    _run(qtbot, w)
    rgb = viewer.add_image(np.stack([camera_crop] * 3, -1), name="color", rgb=True)
    n_layers = len(viewer.layers)
    assert w.apply_to_layer(rgb) is None
    assert len(viewer.layers) == n_layers
    assert any("RGB" in str(e) for e in errors)
    # The whole message in the widget too (a toast cuts long ones).
    assert "Split RGB" in w._status.value and "apply the transform to each" in w._status.value


def test_a_run_without_gradient_removes_the_old_gradient_layer(viewer, qtbot, camera_crop):
    w, _f, _m = _setup(viewer, camera_crop, camera_crop, model="translation", iterations=5)
    _run(qtbot, w)
    assert "similarity gradient" in viewer.layers
    w._gradient.value = False
    _run(qtbot, w)
    assert "similarity gradient" not in viewer.layers


def test_an_implausible_result_is_shown_as_warnings(viewer, qtbot, monkeypatch):
    from scipy import ndimage as ndi

    from napari_simwarp._qt import _common

    seen: list[str] = []
    monkeypatch.setattr(_common, "show_warning", lambda msg: seen.append(msg))
    rng = np.random.default_rng(3)
    fixed = ndi.gaussian_filter(rng.random((64, 64)), 2).astype(np.float32)
    unrelated = ndi.gaussian_filter(rng.random((64, 64)), 2).astype(np.float32)
    w, _, _ = _setup(viewer, fixed, unrelated)
    w.model.value = "translation"
    w.run()
    qtbot.waitUntil(lambda: not w.busy, timeout=60000)
    assert w.result.warnings and any("similarity is low" in m for m in seen)
    assert "warning" in w._status.value and "ZNCC" in w._status.value


def test_layers_aligned_on_screen_at_two_pixel_sizes_stay_aligned(viewer, qtbot, camera_crop):
    # A fixed layer with pixels of 0.2 and a half-resolution moving layer (pixels of 0.4,
    # its pixel centers a half fixed pixel further in), already aligned on screen.
    from scipy import ndimage as ndi

    fixed = camera_crop
    moving = ndi.zoom(ndi.gaussian_filter(fixed, 1.0), 0.5, order=1, grid_mode=True, mode="nearest")
    w, f, m = _setup(viewer, fixed, moving, model="affine")
    f.scale = (0.2, 0.2)
    m.scale, m.translate = (0.4, 0.4), (0.1, 0.1)
    _run(qtbot, w)
    res = w.result
    assert res.similarity > 0.98 and not res.warnings, (res.similarity, res.warnings)
    # the transform is (close to) the identity in world space: nothing moved on screen
    np.testing.assert_allclose(res.transform.physical_matrix, np.eye(3), atol=0.02)
    warped = viewer.layers["moving registered"]
    assert tuple(warped.scale) == (0.2, 0.2) and warped.data.shape == fixed.shape
    arrows = viewer.layers["displacement"].data[:, 1]
    assert np.abs(arrows).max() < 0.3  # in fixed pixels: no motion to show
    w.show_affine()
    q = np.array([20.0, 30.0])  # a moving pixel lands where the transform says, on screen
    p = np.linalg.solve(res.transform.matrix, np.r_[q, 1.0])[:2]
    np.testing.assert_allclose(m.data_to_world(q), f.data_to_world(p), atol=1e-6)


def test_a_rotated_layer_is_refused_with_a_notification(viewer, qtbot, camera_crop, errors):
    w, _f, m = _setup(viewer, camera_crop, camera_crop, model="translation")
    m.rotate = 15
    w.run()
    assert errors and "rotation" in errors[0] and "scale and translate" in errors[0]
    assert not w.busy and w.result is None


def test_result_layers_styled_once_then_only_data(viewer, qtbot, small_pair, monkeypatch):
    # Each snapshot re-set scale, translate, edge width, length and colour on every result
    # layer (each a redraw): the live display cost 7-27x the registration itself.
    from napari_simwarp._qt import _register

    fixed, moving, _ = small_pair
    calls: list[str] = []
    real = _register.put_layer
    monkeypatch.setattr(
        _register,
        "put_layer",
        lambda v, k, name, *a, **kw: calls.append(name) or real(v, k, name, *a, **kw),
    )
    w, f, m = _setup(viewer, fixed, moving, model="deformable", iterations=40)
    settings = w.settings
    w.settings = lambda: dataclasses.replace(settings(), min_interval=0.0)  # every snapshot
    slow_reports(monkeypatch)  # several displays, also on a busy machine
    _run(qtbot, w)
    assert w.snapshots_received > 3 and w.snapshots_shown >= 2
    for name in ("moving registered", "displacement", "similarity gradient"):
        assert calls.count(name) == 1, (name, calls.count(name))
    # On screen: the registered layer in a colour other than the fixed one's, the
    # moving layer hidden, the results above the inputs.
    out = viewer.layers["moving registered"]
    assert out.colormap.name == "magenta" and f.colormap.name == "gray"
    assert not m.visible and f.visible
    names = [layer.name for layer in viewer.layers]
    assert names.index("moving registered") > names.index("moving")


def test_result_layers_are_added_before_the_worker_starts(viewer, qtbot, small_pair, monkeypatch):
    # napari's add_image / add_vectors are the costliest GUI-thread steps: done first, one
    # per turn of the event loop, not while the worker competes for the GIL.
    from napari_simwarp._qt import _register

    fixed, moving, _ = small_pair
    seen = {}
    real = _register.start_worker

    def start(worker, **kwargs):
        for name in ("moving registered", "displacement", "similarity gradient"):
            # napari's LayerList has no .get()
            layer = viewer.layers[name] if name in viewer.layers else None  # noqa: SIM401
            seen[name] = None if layer is None else (type(layer).__name__, layer.data.shape)
            seen[f"{name} visible"] = None if layer is None else layer.visible
        seen["limits"] = tuple(viewer.layers["moving registered"].contrast_limits)
        seen["repainting at start"] = w.native.window().updatesEnabled()
        real(worker, **kwargs)

    monkeypatch.setattr(_register, "start_worker", start)
    w, _f, m = _setup(viewer, fixed, moving, model="affine", iterations=20)
    # the window is not repainted between two additions (one repaint for them all)
    repainting = []
    viewer.layers.events.inserted.connect(
        lambda e: repainting.append(w.native.window().updatesEnabled())
    )
    m.contrast_limits = (0.1, 0.7)
    _run(qtbot, w)
    assert seen["moving registered"] == ("Image", fixed.shape)
    assert seen["displacement"] == ("Vectors", (1, 2, 2))
    assert seen["similarity gradient"] == ("Vectors", (1, 2, 2))
    assert seen["limits"] == (0.1, 0.7)  # the moving layer's, none computed on the blank
    assert repainting == [False, False, False] and seen["repainting at start"]
    # hidden while blank (their first draw comes with their data, during the run), then
    # shown; a user's later choice to hide one stays (a rerun does not show it again)
    results = ("moving registered", "displacement", "similarity gradient")
    assert not any(seen[f"{name} visible"] for name in results)
    assert all(viewer.layers[name].visible for name in results)
    viewer.layers["displacement"].visible = False
    w._run = None
    _run(qtbot, w)
    assert not viewer.layers["displacement"].visible
    assert viewer.layers["moving registered"].visible
    registered = viewer.layers["moving registered"].data
    np.testing.assert_allclose(registered, w.result.warped)  # then the result replaced it


def test_closing_the_widget_while_its_layers_are_added_leaves_the_window_repainting(
    viewer, qtbot, small_pair
):
    # The window is not repainted while the result layers are added, before the worker
    # starts; a widget closed then must not leave the viewer's window frozen.
    fixed, moving, _ = small_pair
    w, _f, _m = _setup(viewer, fixed, moving, model="affine", iterations=20)
    window = w.native.window()
    w.run()
    assert not window.updatesEnabled()  # frozen: the layers are being added
    viewer.window.remove_dock_widget(w.native.parent())
    w.native.deleteLater()
    qtbot.waitUntil(lambda: window.updatesEnabled(), timeout=10000)
    qtbot.waitUntil(no_workers_running, timeout=30000)


def test_a_first_runs_result_is_drawn_in_one_repaint(viewer, qtbot, small_pair, monkeypatch):
    # Issue 27: a first run's result display gives its placeholders their first data (first
    # draws, thumbnails), over several turns of the event loop; the window is not
    # repainted between them (a result half drawn, 40-80 ms a repaint with software
    # OpenGL), and repaints again once the result is shown. A later run's display, on
    # layers already drawn, leaves the window as it is.
    from napari_simwarp._qt import _register

    monkeypatch.setattr(_register, "LIVE_AFTER_MS", 60_000)  # the result is the only display
    fixed, moving, _ = small_pair
    w, _f, _m = _setup(viewer, fixed, moving, model="affine", iterations=20)
    window = weakref.ref(w.native.window())  # weakly: the viewer's teardown checks leaks
    repainting = []  # (layer, whether the window repaints) at each result layer's data

    def watch(event):
        name = event.value.name
        event.value.events.data.connect(
            lambda e: repainting.append((name, window().updatesEnabled()))
        )

    viewer.layers.events.inserted.connect(watch)
    _run(qtbot, w)
    results = {"moving registered", "displacement", "similarity gradient"}
    assert {name for name, _ in repainting} == results
    assert not any(on for _, on in repainting)
    assert window().updatesEnabled()
    repainting.clear()
    w._run = None
    _run(qtbot, w)
    assert {name for name, _ in repainting} == results
    assert all(on for _, on in repainting)


def test_a_run_shorter_than_live_after_shows_its_result_only(
    viewer, qtbot, small_pair, monkeypatch
):
    # Issue 27: a run that ends within a moment is not displayed live (each display cost
    # it 0.05-0.1 s on 2 cores with software OpenGL): one snapshot, the final one.
    from napari_simwarp._qt import _register

    monkeypatch.setattr(_register, "LIVE_AFTER_MS", 10**9)
    fixed, moving, _ = small_pair
    w, _f, _m = _setup(viewer, fixed, moving, model="affine", iterations=20)
    _run(qtbot, w)
    assert w.snapshots_received == 1 and w.snapshots_shown == 1
    np.testing.assert_allclose(viewer.layers["moving registered"].data, w.result.warped)
    assert viewer.layers["moving registered"].visible
    assert w._bar.native.value() == w._bar.max  # the bar ends full
    assert len(w._plot.curve.x) >= 2  # the similarity from the start to the result


def test_result_layers_stay_on_top_and_keep_their_order_between_runs(
    viewer, qtbot, small_pair, monkeypatch
):
    # A move re-emits the layer list's events (10-15 ms of GUI thread): the results are
    # moved only above a layer that is not a result, not past each other at every run.
    fixed, moving, _ = small_pair
    w, _f, _m = _setup(viewer, fixed, moving, model="affine", iterations=10)
    _run(qtbot, w)
    results = ["moving registered", "displacement", "similarity gradient"]
    names = [layer.name for layer in viewer.layers]
    order = [n for n in names if n in results]
    assert set(order) == set(results) and names[-3:] == order
    moves = []
    real_move = type(viewer.layers).move
    monkeypatch.setattr(
        type(viewer.layers), "move", lambda self, *a: moves.append(a) or real_move(self, *a)
    )
    _run(qtbot, w)
    assert moves == [] and [layer.name for layer in viewer.layers] == names
    viewer.add_image(fixed, name="newer")  # a newer layer above the results
    _run(qtbot, w)
    names = [layer.name for layer in viewer.layers]
    assert names[-3:] == order and names.index("newer") < names.index(order[0])


def test_live_snapshots_redraw_in_place_and_never_write_into_a_result(
    viewer, qtbot, small_pair, monkeypatch
):
    # A data assignment re-emits through the layer list and redraws the thumbnail: live
    # snapshots are copied into the array the run gave the layer, the canvas refreshed.
    from napari_simwarp._qt import _register

    fixed, moving, _ = small_pair
    w, _f, _m = _setup(viewer, fixed, moving, model="deformable", iterations=40)
    settings = w.settings
    w.settings = lambda: dataclasses.replace(settings(), min_interval=0.0, vectors_interval=0.0)
    monkeypatch.setattr(_register, "VECTORS_MS", 0)  # arrows at every display too
    _run(qtbot, w)
    held = viewer.layers["moving registered"].data
    first = w.result.warped.copy()
    in_place = []
    real = _register.redraw_in_place
    monkeypatch.setattr(
        _register,
        "redraw_in_place",
        lambda layer, data: in_place.append(layer.name) or real(layer, data),
    )
    # long enough for several displays (slow_reports): the first live one styles the
    # layer, the second replaces the previous result's array by a copy, the next ones
    # fill that copy
    slow_reports(monkeypatch)
    w._iterations.value = 400
    _run(qtbot, w)
    assert in_place.count("moving registered") >= 1
    assert in_place.count("displacement") >= 1
    np.testing.assert_array_equal(held, first)  # the first run's result is untouched
    shown = viewer.layers["moving registered"].data
    np.testing.assert_array_equal(shown, w.result.warped)  # the final snapshot: the result


def test_fixed_equal_to_moving_is_refused_in_the_status_line(viewer, qtbot, camera_crop, errors):
    w, f, _ = _setup(viewer, camera_crop, camera_crop)
    w._moving.value = f
    w.run()
    assert not w.busy and "same layer" in w._status.value and any("same layer" in e for e in errors)


def test_apply_to_lists_only_image_and_labels_layers(viewer, qtbot, camera_crop):
    w, f, m = _setup(viewer, camera_crop, camera_crop)
    labels = viewer.add_labels(np.zeros((128, 128), np.int32), name="labels")
    viewer.add_points(np.zeros((1, 2)), name="points")
    viewer.add_vectors(np.zeros((1, 2, 2)), name="vectors")
    w.reset_choices()
    offered = [c for c in w._apply_to.choices if c is not None]
    assert offered == [f, m, labels]


def test_similarity_curve_has_one_colour_per_level_named_as_napari_names_levels(viewer, qtbot):
    from napari_simwarp._qt._plot import log_scale

    assert log_scale([0.5, 0.1]) and not log_scale([-0.9, -0.5]) and not log_scale([])
    fixed, moving, _ = data.deformed_pair()
    w, _, _ = _setup(viewer, fixed[::2, ::2], moving[::2, ::2], model="affine", levels=3)
    _run(qtbot, w)
    plot, res = w._plot, w.result
    assert len(plot.levels) == len(plot.values) >= 3
    # napari's numbering: the coarsest (2) first, 0 the full resolution, last
    assert plot.levels == sorted(plot.levels, reverse=True) and set(plot.levels) == {0, 1, 2}
    assert plot.curve.y_label == "similarity (ZNCC)" and not plot.log
    # the curve ends on the similarity the final status gives
    assert plot.values[0] == pytest.approx(res.initial_similarity)
    assert plot.values[-1] == pytest.approx(res.similarity)
    assert f"{res.similarity:.3f}" in w._status.value
    legend = [label.text for _, label in plot._legend.items]
    assert legend == ["level 2", "1", "0 (full)"]
    # one faint line through every point in iteration order, across the levels (a level
    # without a point of its own still sits on the trend); not in the legend
    trend_x, trend_y = plot._trend.getData()
    order = np.argsort(plot.curve.x, kind="stable")
    np.testing.assert_array_equal(trend_x, np.asarray(plot.curve.x)[order])
    np.testing.assert_array_equal(trend_y, np.asarray(plot.values)[order])
    assert len(legend) == len({*plot.levels})
    image = plot.grab().toImage()  # painted: axes, curves and the value, without error
    colours = {image.pixelColor(x, y).getRgb()[:3] for x in range(image.width())
               for y in range(0, image.height(), 2)}  # fmt: skip
    assert {LEVEL_COLORS[0], LEVEL_COLORS[1], LEVEL_COLORS[2]} <= colours


def test_drift_plot_is_each_frames_shift_and_names_a_failed_frame(
    viewer, qtbot, monkeypatch, tmp_path
):
    import time

    import pandas as pd

    from napari_simwarp.widgets_logic.registration import RegistrationRun

    real_snapshot = RegistrationRun._snapshot

    def slowed(run, *args):  # each step 30 ms: a run long enough for live displays
        time.sleep(0.03)
        return real_snapshot(run, *args)

    monkeypatch.setattr(RegistrationRun, "_snapshot", slowed)
    stack, true = data.drifting_timelapse(frames=8, size=64)
    failed = 5
    stack[failed] = np.random.default_rng(1).random((64, 64), dtype=np.float32)  # noise
    w, _, m = _setup(viewer, None, stack, mode="time-lapse (drift)", iterations=30)
    m.scale = (1.0, 0.5, 0.25)  # a pixel of 0.5 × 0.25 (world units)
    shown, statuses = [], []
    real = w._plot.set_curve
    w._plot.set_curve = lambda curve: (shown.append(curve), real(curve))
    from napari_simwarp.widgets_logic.registration import Snapshot

    real_describe = Snapshot.describe  # what the status line shows at each display
    monkeypatch.setattr(
        Snapshot, "describe", lambda snap: statuses.append(real_describe(snap)) or statuses[-1]
    )
    _run(qtbot, w)
    shown = [curve for curve in shown if curve.y]  # (the run starts on an empty plot)
    assert len(shown) >= 2  # live curves, then the final one
    for curve in shown:  # per frame, never against the snapshot
        assert curve.x_label == "frame" and set(curve.x) <= set(range(8))
    assert any(s.startswith("running: frame ") and s.endswith("/8") for s in statuses)
    plot = w._plot
    assert plot.curve.y_label == "shift (px)" and f"(frame {failed})" in plot.curve.now
    trend_x, _ = plot._trend.getData()  # the axes are different quantities: not joined
    assert trend_x is None or len(trend_x) == 0
    legend = [label.text for _, label in plot._legend.items]
    assert legend == ["y", "x"]
    shifts = w.result.shifts
    good = [t for t in range(8) if t != failed]
    np.testing.assert_allclose(shifts[good], true[good], atol=0.3)
    # one arrow per frame (a translation moves every pixel alike), not a grid of them
    assert len(viewer.layers["displacement"].data) == 8

    saved = w.save_transform(tmp_path / "drift.npz")
    table = pd.read_csv(tmp_path / "drift_shifts.csv")
    assert len(saved) == 9 and list(table["frame"]) == list(range(8))
    np.testing.assert_allclose(table[["shift_y_px", "shift_x_px"]], shifts, rtol=1e-12)
    np.testing.assert_allclose(
        table[["shift_y_world", "shift_x_world"]], shifts * [0.5, 0.25], rtol=1e-12
    )


def _far_pair(camera_crop):
    """The crop and a copy rotated by 70° and shifted by (9, -12) px: beyond the pyramid."""
    from scipy import ndimage as ndi

    from tests.registration.cases import centered_affine

    t = np.deg2rad(70)
    linear = np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])
    m = centered_affine(linear, [9.0, -12.0], camera_crop.shape)
    moving = ndi.affine_transform(camera_crop, np.linalg.inv(m), order=3, mode="nearest")
    return moving.astype(np.float32), m


def test_landmarks_from_two_points_layers_at_other_scales(viewer, qtbot, camera_crop):
    from tests.registration.cases import corner_error

    moving, m = _far_pair(camera_crop)
    w, f, mv = _setup(viewer, camera_crop, moving, model="rigid", levels=3)
    f.scale = mv.scale = (0.5, 0.5)  # both images: 0.5 units per pixel, aligned at 0
    fixed_pixels = np.array([[20.0, 25.0], [30.0, 100.0], [100.0, 40.0], [90.0, 95.0]])
    moving_pixels = fixed_pixels @ m[:2, :2].T + m[:2, 2]
    # The fixed points in fixed pixels on a layer scaled like the image; the moving points
    # in world units on a layer of scale 1 and a translate: both name the same places.
    fp = viewer.add_points(fixed_pixels, name="fixed points", scale=(0.5, 0.5))
    mp = viewer.add_points(moving_pixels * 0.5 - (3.0, 1.0), name="moving points")
    mp.translate = (3.0, 1.0)
    w.reset_choices()
    assert w._fixed_points.value is None and w._moving_points.value is None  # off by default
    w._fixed_points.value, w._moving_points.value = fp, mp
    w._landmark_weight.value = 0.01
    assert w.settings().landmark_weight == 0.01
    _run(qtbot, w)
    assert corner_error(w.result.transform.matrix, m, camera_crop.shape) < 0.2
    np.testing.assert_array_equal(fp.data, fixed_pixels)  # the layers are left as they were


def test_landmark_layers_that_do_not_pair_up_are_a_notification(viewer, qtbot, camera_crop, errors):
    w, _f, _m = _setup(viewer, camera_crop, camera_crop)
    fp = viewer.add_points(np.array([[1.0, 2.0], [3.0, 4.0], [50.0, 9.0]]), name="a")
    mp = viewer.add_points(np.array([[1.0, 2.0], [3.0, 4.0]]), name="b")
    w.reset_choices()
    w._fixed_points.value = fp
    w.run()
    assert errors and "both a fixed points layer and a moving points layer" in errors[-1]
    w._moving_points.value = mp
    w.run()
    assert "3 fixed and 2 moving points" in errors[-1] and not w.busy
    mp.rotate = 30
    w.run()
    assert "rotation" in errors[-1] and not w.busy


def _counted(array, chunks):
    """A dask array over ``array`` recording each chunk read ``(location, thread id)``."""
    import threading

    da = pytest.importorskip("dask.array")

    reads = []

    def counted(block, block_info=None):
        reads.append((tuple(block_info[0]["chunk-location"]), threading.get_ident()))
        return block

    return da.from_array(array, chunks=chunks).map_blocks(counted, dtype=array.dtype), reads


def test_multiscale_pair_registered_at_the_chosen_level_read_only_in_the_worker(
    viewer, qtbot, camera_crop
):
    import threading

    from scipy import ndimage as ndi

    full_f = np.ascontiguousarray(data.camera()[100:292, 150:342])  # 192²
    full_m = ndi.shift(full_f, (4.0, -6.0), order=3, mode="nearest").astype(np.float32)
    half = [a.reshape(96, 2, 96, 2).mean(axis=(1, 3)) for a in (full_f, full_m)]
    layers, reads = [], []
    for name, full, low in (("fixed", full_f, half[0]), ("moving", full_m, half[1])):
        lazy_full, r_full = _counted(full, (64, 64))
        lazy_low, r_low = _counted(np.ascontiguousarray(low), (48, 48))
        layers.append(viewer.add_image([lazy_full, lazy_low], name=name, contrast_limits=(0, 1)))
        reads.append((r_full, r_low))
    w = dock(viewer, RegisterWidget(viewer))
    w._fixed.value, w._moving.value = layers
    w._model.value, w._metric.value = "translation", "ncc"
    assert not w._level.native.isHidden()  # a level choice, for multiscale layers
    w._level.value = 1
    gui = threading.get_ident()
    for r_full, r_low in reads:
        r_full.clear()
        r_low.clear()
    w.run()
    assert not any(r for pair in reads for r in pair)  # starting the run read nothing
    qtbot.waitUntil(lambda: w.result is not None and not w.busy, timeout=120000)
    assert not reads[0][0] and not reads[1][0]  # the full-resolution levels: never read
    workers = {t for _, r_low in reads for _, t in r_low[:4]}
    assert workers and gui not in workers  # the levels were read in the worker
    # level-1 pixels are 2 world units wide: the shift (4, -6) is found in world units
    np.testing.assert_allclose(w.result.transform.physical_matrix[:2, 2], (4.0, -6.0), atol=0.3)
    registered = viewer.layers["moving registered"]
    assert registered.data.shape == (96, 96)
    np.testing.assert_array_equal(registered.scale, (2.0, 2.0))


def test_a_pair_beyond_the_memory_budget_is_refused_before_reading(viewer, qtbot, monkeypatch):
    image = np.ascontiguousarray(data.camera()[:128, :128])
    (lazy_f, reads_f), (lazy_m, reads_m) = _counted(image, (64, 64)), _counted(image, (64, 64))
    f = viewer.add_image(lazy_f, name="fixed", contrast_limits=(0, 1))
    m = viewer.add_image(lazy_m, name="moving", contrast_limits=(0, 1))
    w = dock(viewer, RegisterWidget(viewer))
    w._fixed.value, w._moving.value = f, m
    monkeypatch.setenv("SIMWARP_MEMORY_BUDGET", "1MiB")
    reads_f.clear()
    reads_m.clear()
    w.run()
    assert not w.busy and w.result is None and not reads_f and not reads_m
    status = w._status.value
    assert "needs about 3.1 MiB" in status and "1.0 MiB" in status and "coarser level" in status


def test_arrows_hidden_by_default_over_a_volume_only(viewer, qtbot):
    # 3-D arrows cover the volume they sit in (issue 13): off until asked for, and at about
    # 20 per axis. The arrows of a 2-D time-lapse are (t, y, x) too, but on one plane: shown.
    fixed, moving, _ = data.deformed_volume_pair(size=32, amplitude=2.0)
    w, _f, _m = _setup(
        viewer, fixed, moving, model="affine", iterations=10, levels=2, gradient=True
    )
    _run(qtbot, w)
    for name in ("displacement", "similarity gradient"):
        layer = viewer.layers[name]
        assert not layer.visible, name
        assert len(layer.data) <= 21**3 < fixed.size, name
    viewer.layers.clear()
    stack, _shifts = data.drifting_timelapse(frames=6, size=64)
    w, _, _m = _setup(viewer, None, stack, mode="time-lapse (drift)")
    _run(qtbot, w)
    assert viewer.layers["displacement"].data.shape[1:] == (2, 3)
    assert viewer.layers["displacement"].visible


def test_a_rejected_run_replaces_the_previous_runs_status(viewer, qtbot, camera_crop, errors):
    # A rejected run left "done in 2.0 s" from the run before (issue 13).
    w, _f, m = _setup(viewer, camera_crop, camera_crop, model="translation", iterations=5)
    _run(qtbot, w)
    assert w._status.value.startswith("done in")
    m.rotate = 15
    w.run()
    assert not w.busy
    assert w._status.value.startswith("error:") and "rotation" in w._status.value
    assert "done in" not in w._status.value and len(errors) == 1


FIRST_RUNS = """
import importlib, sys
import numpy as np
from napari_simwarp._qt import _register
from napari_simwarp.ops import _kernels
for name in _register.WARM_IMPORTS:
    importlib.import_module(name)
_kernels.ensure_loaded()  # as the widget's preload does when a build is cached
from napari_simwarp import data
from napari_simwarp.widgets_logic.registration import RegistrationRun, RunSettings
fixed = data.camera()[100:196, 100:196]
moving = np.roll(fixed, 2, axis=0)
stack = np.stack([fixed, moving, np.roll(fixed, 1, axis=1)])
every = dict(min_interval=0.0, vectors_interval=0.0, yield_interval=0.0, live_after=0.0,
             iterations=5, report_every=1)  # every display the widget can make
for model in ("affine", "rigid", "deformable", "diffeomorphic", "drift"):
    before = set(sys.modules)
    if model == "drift":
        run = RegistrationRun(None, stack, RunSettings(mode="stack", model="translation", **every))
    else:
        run = RegistrationRun(fixed, moving, RunSettings(model=model, **every))
    assert sum(1 for _ in run.snapshots()) > 2
    new = sorted(set(sys.modules) - before)
    assert not new, (model, new[:10])
"""


def test_the_warm_up_imports_what_a_first_run_would():
    # Issue 27: a first run's imports (the solvers; sympy through torch's first
    # backward(gradient), 0.3 s; dask.array for the live drift stack) are made as the widget
    # opens, in the background, not during the run. A fresh process: after WARM_IMPORTS,
    # each kind of run with every live display imports nothing more.
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    env.setdefault("QT_QPA_PLATFORM", "offscreen")  # imports Qt, makes no window
    done = subprocess.run(
        [sys.executable, "-c", FIRST_RUNS], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_run_and_its_rerun_warn_of_no_private_napari_api(viewer, qtbot, small_pair, recwarn):
    # Every update printed napari's FutureWarning about the private `_type_string` (issue
    # 13; napari 0.9 no longer warns there): a run and a rerun, which reuses the result
    # layers, trigger no deprecation of napari's (private or deprecated API).
    fixed, moving, _ = small_pair
    w, _f, _m = _setup(viewer, fixed, moving, model="deformable", iterations=10, gradient=True)
    _run(qtbot, w)
    _run(qtbot, w)  # the rerun reuses the result layers (the kind check)
    napari_future = [
        f"{r.filename}:{r.lineno}: {r.message}"
        for r in recwarn
        if issubclass(r.category, (FutureWarning, DeprecationWarning))
        and ("napari" in r.filename or "napari" in str(r.message))
    ]
    assert not napari_future, napari_future


def test_drift_beyond_the_memory_budget_names_no_batch_size(viewer, qtbot, monkeypatch):
    # The refusal advised "a smaller batch_size", a setting the widget does not have
    # (issue 13): it gives what the user can do here, whole, in the status line.
    stack, _shifts = data.drifting_timelapse(frames=6, size=64)
    w, _, _m = _setup(viewer, None, stack, mode="time-lapse (drift)")
    monkeypatch.setenv("SIMWARP_MEMORY_BUDGET", "16KiB")
    w.run()
    qtbot.waitUntil(lambda: not w.busy and "error" in w._status.value, timeout=30000)
    status = w._status.value
    assert w.result is None and "16.0 KiB" in status, status
    assert "batch_size" not in status and "crop or downsample the frames" in status
