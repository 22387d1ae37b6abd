"""The "Similarity map" widget on a real viewer."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from scipy import ndimage

da = pytest.importorskip("dask.array")  # the [large] extra

from napari_simwarp import ops  # noqa: E402
from napari_simwarp._qt import SimilarityMapWidget  # noqa: E402

from .conftest import dock  # noqa: E402


def _wait_idle(qtbot, widget, shown=1, timeout=30000):
    qtbot.waitUntil(lambda: widget.results_shown >= shown and not widget.busy, timeout=timeout)


def test_local_std_map_equals_op(viewer, qtbot, camera_crop):
    layer = viewer.add_image(camera_crop.copy(), name="camera")
    w = dock(viewer, SimilarityMapWidget(viewer))
    w._image.value = layer
    w._window.value = 9
    _wait_idle(qtbot, w)
    expected = ops.local_std(torch.from_numpy(camera_crop)[None, None], window=9)[0, 0].numpy()
    out = viewer.layers["similarity map"]
    np.testing.assert_allclose(out.data, expected, rtol=1e-5, atol=1e-6)
    assert out.colormap.name == "magma" and out.contrast_limits[0] == 0.0
    np.testing.assert_array_equal(layer.data, camera_crop)  # input untouched


def test_live_updates_debounced_and_latest_wins(viewer, qtbot, camera_crop):
    layer = viewer.add_image(camera_crop.copy(), name="camera")
    w = dock(viewer, SimilarityMapWidget(viewer))
    w._image.value = layer
    _wait_idle(qtbot, w)
    shown = w.results_shown
    for size in (3, 5, 7, 9, 11, 13, 21):  # a burst of changes: one or two refreshes
        w._window.value = size
    _wait_idle(qtbot, w, shown + 1)
    assert w.results_shown <= shown + 2
    expected = ops.local_std(torch.from_numpy(camera_crop)[None, None], window=21)[0, 0].numpy()
    np.testing.assert_allclose(viewer.layers["similarity map"].data, expected, rtol=1e-5, atol=1e-6)
    assert len([lay for lay in viewer.layers if lay.name.startswith("similarity map")]) == 1

    # A change of the layer's data refreshes the map too.
    shown = w.results_shown
    layer.data = camera_crop[::-1].copy()
    _wait_idle(qtbot, w, shown + 1)
    expected = ops.local_std(torch.from_numpy(camera_crop[::-1].copy())[None, None], window=21)[
        0, 0
    ].numpy()
    np.testing.assert_allclose(viewer.layers["similarity map"].data, expected, rtol=1e-5, atol=1e-6)


def test_two_layer_metrics(viewer, qtbot, small_pair):
    fixed, moving, _ = small_pair
    a = viewer.add_image(fixed.copy(), name="fixed")
    b = viewer.add_image(moving.copy(), name="moving")
    w = dock(viewer, SimilarityMapWidget(viewer))
    w._image.value, w._second.value = a, b
    w._metric.value = "local NCC"
    w._window.value = 7
    _wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: w._status.value.startswith("local NCC, window 7"), timeout=30000)
    ta, tb = (torch.from_numpy(x)[None, None] for x in (fixed, moving))
    np.testing.assert_allclose(
        viewer.layers["similarity map"].data,
        ops.local_ncc(ta, tb, window=7)[0, 0].numpy(),
        atol=1e-5,
    )
    assert tuple(viewer.layers["similarity map"].contrast_limits) == (-1.0, 1.0)

    shown = w.results_shown
    w._metric.value = "SSIM"
    _wait_idle(qtbot, w, shown + 1)
    rng = float(max(fixed.max(), moving.max()) - min(fixed.min(), moving.min()))
    np.testing.assert_allclose(
        viewer.layers["similarity map"].data,
        ops.ssim(ta, tb, window=7, data_range=rng, reduction="none")[0, 0].numpy(),
        atol=1e-5,
    )
    np.testing.assert_array_equal(a.data, fixed)
    np.testing.assert_array_equal(b.data, moving)


def test_missing_second_layer_is_reported_not_raised(viewer, qtbot, camera_crop):
    layer = viewer.add_image(camera_crop, name="camera")
    w = dock(viewer, SimilarityMapWidget(viewer))
    w._image.value = layer
    w._second.value = None
    w._metric.value = "SSIM"
    qtbot.waitUntil(lambda: "needs a second layer" in w._status.value, timeout=5000)


def test_3d_map(viewer, qtbot):
    vol = np.random.default_rng(0).random((16, 20, 24), dtype=np.float32)
    layer = viewer.add_image(vol, name="vol")
    w = dock(viewer, SimilarityMapWidget(viewer))
    w._image.value = layer
    assert w._mode.value == "2D per plane"  # the viewer shows it plane by plane
    w._mode.value = "3D volume"
    w._window.value = 5
    _wait_idle(qtbot, w)
    expected = ops.local_std(torch.from_numpy(vol)[None, None], window=5)[0, 0].numpy()
    np.testing.assert_allclose(viewer.layers["similarity map"].data, expected, rtol=1e-5, atol=1e-6)


def test_own_result_layer_as_input_is_refused_not_looped(viewer, qtbot, camera_crop, errors):
    # Each result written into the result layer fired its data event, which scheduled the
    # next computation from it: a loop that never stopped.
    layer = viewer.add_image(camera_crop.copy(), name="camera")
    w = dock(viewer, SimilarityMapWidget(viewer))
    w._image.value = layer  # live update (on by default) computes the first map
    _wait_idle(qtbot, w)
    w.reset_choices()
    w._image.value = viewer.layers["similarity map"]
    qtbot.wait(1500)
    assert w.results_shown == 1 and not w.busy
    w.compute()
    assert w.results_shown == 1 and any("result layer" in e for e in errors)


def _scipy_local_std(frame, window):
    """Population local std over a box window, reflect borders, in float64 (SciPy)."""
    f = frame.astype(np.float64)
    mean = ndimage.uniform_filter(f, window, mode="reflect")
    return np.sqrt(np.maximum(ndimage.uniform_filter(f * f, window, mode="reflect") - mean**2, 0))


def _stack(t=6):
    """A time-lapse (t, 48, 56): frames of the sample picture shifted, each different."""
    from napari_simwarp import data

    cam = data.camera()
    return np.stack([cam[40 + 5 * i : 88 + 5 * i, 60 + 3 * i : 116 + 3 * i] for i in range(t)])


def test_time_lapse_maps_are_per_frame_and_follow_the_step(viewer, qtbot):
    # A (T, Y, X) stack was taken for a volume: the local std mixed frames.
    stack = _stack()
    layer = viewer.add_image(stack, name="movie")
    viewer.dims.set_current_step(0, 0)  # napari opens a stack on its middle frame
    w = dock(viewer, SimilarityMapWidget(viewer))
    w._image.value = layer
    w._window.value = 7
    _wait_idle(qtbot, w)
    assert w._mode.value == "2D per plane"
    out = viewer.layers["similarity map"]
    # the map of frame 0, placed on frame 0 (one plane of the time axis: napari shows it
    # on that frame only)
    assert out.data.shape == (1, *stack.shape[1:]) and out.translate[0] == 0
    np.testing.assert_allclose(out.data[0], _scipy_local_std(stack[0], 7), rtol=1e-4, atol=1e-5)

    shown = w.results_shown
    viewer.dims.set_current_step(0, 4)  # the viewer moves to frame 4: the map follows
    _wait_idle(qtbot, w, shown + 1)
    np.testing.assert_allclose(
        viewer.layers["similarity map"].data[0], _scipy_local_std(stack[4], 7), rtol=1e-4, atol=1e-5
    )
    assert viewer.layers["similarity map"].translate[0] == 4
    assert "(4,)" in w._status.value and "note" not in w._status.value
    shown = w.results_shown
    viewer.dims.order = (1, 0, 2)  # the viewer now shows (t, x): the map stays per frame
    w.compute()
    _wait_idle(qtbot, w, shown + 1)
    assert "the viewer shows axes" in w._status.value
    np.testing.assert_array_equal(layer.data, _stack())  # input untouched


def test_two_layer_metric_per_frame_equals_the_frames_op(viewer, qtbot):
    stack = _stack(4)
    moved = np.roll(stack, 2, axis=2)
    a = viewer.add_image(stack, name="a")
    b = viewer.add_image(moved, name="b")
    viewer.dims.set_current_step(0, 2)
    w = dock(viewer, SimilarityMapWidget(viewer))
    w._image.value, w._second.value = a, b
    w._metric.value = "local NCC"
    w._window.value = 5
    qtbot.waitUntil(lambda: w._status.value.startswith("local NCC, window 5"), timeout=30000)
    ta, tb = (torch.from_numpy(np.ascontiguousarray(x[2]))[None, None] for x in (stack, moved))
    np.testing.assert_allclose(
        viewer.layers["similarity map"].data[0],
        ops.local_ncc(ta, tb, window=5)[0, 0].numpy(),
        atol=1e-5,
    )


class _CountingStack:
    """An array-like (T, Y, X) that records each read (thread, first frame, frames)."""

    def __init__(self, array):
        self.array, self.shape, self.dtype, self.ndim = array, array.shape, array.dtype, 3
        self.reads = []

    def __getitem__(self, key):
        part = self.array[key]
        t = key[0] if isinstance(key, tuple) else key
        frames = range(*t.indices(self.shape[0])) if isinstance(t, slice) else [t]
        self.reads.append((threading.current_thread() is threading.main_thread(), list(frames)))
        return part


def test_lazy_layer_reads_only_the_plane_shown(viewer, qtbot):
    # A lazy (300, 2048, 2048) layer was computed whole as soon as the widget docked.
    stack = _stack(12)
    counting = _CountingStack(stack)
    lazy = da.from_array(counting, chunks=(1, *stack.shape[1:]), asarray=False)
    layer = viewer.add_image(lazy, name="lazy movie")
    viewer.dims.set_current_step(0, 0)
    w = dock(viewer, SimilarityMapWidget(viewer))
    counting.reads.clear()  # what napari read to show the layer is not the widget's
    w._image.value = layer
    w._window.value = 5
    _wait_idle(qtbot, w)
    np.testing.assert_allclose(
        viewer.layers["similarity map"].data[0], _scipy_local_std(stack[0], 5), rtol=1e-4, atol=1e-5
    )
    worker_reads = [frames for main, frames in counting.reads if not main]
    assert worker_reads and all(frames == [0] for frames in worker_reads)

    counting.reads.clear()
    shown = w.results_shown
    viewer.dims.set_current_step(0, 7)
    _wait_idle(qtbot, w, shown + 1)
    worker_reads = [frames for main, frames in counting.reads if not main]
    assert worker_reads and all(frames == [7] for frames in worker_reads)
    np.testing.assert_allclose(
        viewer.layers["similarity map"].data[0], _scipy_local_std(stack[7], 5), rtol=1e-4, atol=1e-5
    )


def test_multiscale_layer_uses_the_chosen_level(viewer, qtbot):
    rng = np.random.default_rng(3)
    full = rng.random((3, 64, 80), dtype=np.float32)
    half = np.ascontiguousarray(full[:, ::2, ::2])
    layer = viewer.add_image([full, half], name="pyramid", multiscale=True)
    viewer.dims.set_current_step(0, 0)
    w = dock(viewer, SimilarityMapWidget(viewer))
    w._image.value = layer
    assert not w._level.native.isHidden() and w._level.value == 0  # shown; the full level fits
    w._window.value = 5
    _wait_idle(qtbot, w)
    np.testing.assert_allclose(
        viewer.layers["similarity map"].data[0], _scipy_local_std(full[0], 5), rtol=1e-4, atol=1e-5
    )
    shown = w.results_shown
    w._level.value = 1
    _wait_idle(qtbot, w, shown + 1)
    out = viewer.layers["similarity map"]
    np.testing.assert_allclose(out.data[0], _scipy_local_std(half[0], 5), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out.scale, [1.0, 2.0, 2.0])  # over the full-resolution grid


def test_window_larger_than_an_axis_is_an_error_not_a_clip(viewer, qtbot, errors):
    vol = np.random.default_rng(0).random((16, 20, 24), dtype=np.float32)
    layer = viewer.add_image(vol, name="vol")
    w = dock(viewer, SimilarityMapWidget(viewer))
    w._image.value = layer
    w._mode.value = "3D volume"
    w._window.value = 19
    qtbot.waitUntil(lambda: "larger than" in w._status.value and not w.busy, timeout=30000)
    assert "at most 15" in w._status.value and any("larger than" in e for e in errors)
    assert "similarity map" not in viewer.layers


def test_kernel_build_is_a_visible_step_off_the_gui_thread(viewer, qtbot, camera_crop, monkeypatch):
    # The first map built the kernels inside the computation: a minute with no word.
    import time

    from napari_simwarp._qt import RegisterWidget, _common
    from napari_simwarp.ops import _kernels
    from napari_simwarp.widgets_logic import device

    built = {"done": False, "thread": None}

    def fake_build(verbose=False):
        built["thread"] = threading.current_thread()
        time.sleep(0.5)
        built["done"] = True
        return True

    monkeypatch.setattr(_common, "kernels_pending", lambda: not built["done"])

    monkeypatch.setattr(_common, "kernels_cached", lambda: False)  # a first use
    monkeypatch.setattr(_kernels, "ensure_loaded", fake_build)
    # the kernel label's own text, as the backend report would give it before and after
    monkeypatch.setattr(
        device,
        "describe_backend",
        lambda *a: "kernels: " + ("compiled" if built["done"] else "not loaded yet"),
    )
    monkeypatch.setitem(_common._KERNEL_BUILD, "seconds", None)  # no earlier build's time
    other = dock(viewer, RegisterWidget(viewer))  # open, not waiting for the build
    assert other._backend.value == "kernels: not loaded yet"
    layer = viewer.add_image(camera_crop.copy(), name="camera")
    w = dock(viewer, SimilarityMapWidget(viewer))
    w._image.value = layer
    # a 0.5 s load says no more than that (no "about a minute", issue 27)
    qtbot.waitUntil(lambda: "loading the compiled kernels" in w._status.value, timeout=5000)
    assert w.results_shown == 0
    assert w._backend.value == "kernels: not loaded yet"
    _wait_idle(qtbot, w)
    assert built["done"] and built["thread"] is not threading.main_thread()
    assert w._status.value.startswith("local std")
    # Both labels updated when the build ended, with its time apart from the map's: at
    # least the 0.5 s the build slept.
    for widget in (w, other):
        label = widget._backend.value
        assert label.startswith("kernels: compiled (loaded in "), label
        assert float(label.rsplit("in ", 1)[1].split(" s")[0]) >= 0.5
    # a backend that does not run the kernels claims no load time
    monkeypatch.setattr(device, "describe_backend", lambda *a: "kernels: pure torch (mps)")
    other._backend.refresh()
    assert other._backend.value == "kernels: pure torch (mps)"


def test_pure_torch_while_the_kernels_build_computes_at_once(
    viewer, qtbot, camera_crop, monkeypatch
):
    # Issue 13: a setting to use the torch path while the kernels build (about a minute).
    from napari_simwarp._qt import RegisterWidget, _common
    from napari_simwarp.ops import _kernels

    release, built = threading.Event(), threading.Event()
    callers = []

    def fake_build(verbose=False):
        callers.append("build" if not callers else threading.current_thread().name)
        if len(callers) == 1:  # the widgets' build worker: a build that takes a while
            release.wait(30)
            built.set()
        return True

    monkeypatch.setattr(_common, "kernels_pending", lambda: not built.is_set())

    monkeypatch.setattr(_common, "kernels_cached", lambda: False)  # a first use
    monkeypatch.setattr(_kernels, "ensure_loaded", fake_build)
    monkeypatch.setitem(_kernels._state, "tried", False)  # not loaded, as on first use
    monkeypatch.setattr(_kernels, "_torch_until_loaded", threading.Event())  # off, restored
    try:
        other = dock(viewer, RegisterWidget(viewer))
        layer = viewer.add_image(camera_crop.copy(), name="camera")
        w = dock(viewer, SimilarityMapWidget(viewer))
        w._image.value = layer
        qtbot.waitUntil(lambda: "building the compiled kernels" in w._status.value, timeout=5000)
        # the build's own thread has started building (it may start after the status: CI
        # once saw the map computed before it had)
        qtbot.waitUntil(lambda: callers == ["build"], timeout=5000)
        assert not w._torch_meanwhile.native.isHidden() and not w._torch_meanwhile.value
        assert w.results_shown == 0 and "similarity map" not in viewer.layers
        w._torch_meanwhile.value = True  # the map comes while the build still runs
        _wait_idle(qtbot, w)
        assert callers == ["build"]  # the map's worker neither built nor waited
        assert not built.is_set() and _kernels.torch_until_loaded()
        assert other._torch_meanwhile.value  # one setting, every widget shows it
        np.testing.assert_allclose(
            viewer.layers["similarity map"].data,
            _scipy_local_std(camera_crop, w._window.value),
            atol=1e-4,
        )
    finally:
        release.set()
    qtbot.waitUntil(lambda: w._torch_meanwhile.native.isHidden(), timeout=10000)
    assert other._torch_meanwhile.native.isHidden()  # built: nothing to choose any more


@pytest.fixture
def dask_in_the_calling_thread():
    """Each dask read runs in the thread that asked for it (the widget's worker, or
    napari's slicing on the GUI thread), not in dask's pool, so reads can be told apart."""
    import dask

    with dask.config.set(scheduler="synchronous"):
        yield


def test_whole_stack_map_is_an_explicit_lazy_action(
    viewer, qtbot, tmp_path, dask_in_the_calling_thread
):
    stack = _stack(8)
    counting = _CountingStack(stack)
    lazy = da.from_array(counting, chunks=(1, *stack.shape[1:]), asarray=False)
    layer = viewer.add_image(
        lazy, name="lazy movie", scale=(1.0, 0.5, 0.5), translate=(0.0, 3.0, -2.0)
    )
    viewer.dims.set_current_step(0, 3)
    w = dock(viewer, SimilarityMapWidget(viewer))
    w._live.value = False  # only the explicit action runs (after the map docking made)
    w._image.value = layer
    w._window.value = 5
    qtbot.waitUntil(lambda: not w.busy, timeout=30000)
    counting.reads.clear()
    w.compute_stack()
    qtbot.waitUntil(lambda: "similarity map (stack)" in viewer.layers and not w.busy, timeout=3e4)
    out = viewer.layers["similarity map (stack)"]
    assert isinstance(out.data, da.Array) and out.data.shape == stack.shape
    np.testing.assert_allclose(out.scale, [1.0, 0.5, 0.5])
    # nothing read on the GUI thread but what napari shows; the worker read frame 3 only
    # (the contrast limits come from the map of the frame on screen)
    assert all(frames == [3] for main, frames in counting.reads if not main), counting.reads
    assert len([f for main, f in counting.reads if main]) <= 2
    for t in (0, 7):
        np.testing.assert_allclose(
            out.data[t].compute(), _scipy_local_std(stack[t], 5), rtol=1e-4, atol=1e-5
        )
    assert "lazy" in w._status.value and "'tyx'" in w._status.value

    # to an OME-Zarr store: written, then shown from it (all its levels) with the pixel size
    w._stack_store.value = str(tmp_path / "map.zarr")
    w.compute_stack()
    qtbot.waitUntil(lambda: "written to" in w._status.value and not w.busy, timeout=30000)
    from napari_simwarp.io.omezarr import read_ome_zarr

    stored, axes, pixel_size, origin = read_ome_zarr(tmp_path / "map.zarr")
    assert axes == "tyx" and pixel_size == [0.5, 0.5] and origin == [3.0, -2.0]
    np.testing.assert_allclose(stored[5].compute(), _scipy_local_std(stack[5], 5), atol=1e-4)
    assert viewer.layers["similarity map (stack)"].data.shape == stack.shape


def test_the_reused_map_comes_back_on_top_of_a_newer_layer(viewer, qtbot, camera_crop):
    # Issue 13: the reused map layer stayed under layers added since, hidden by them.
    layer = viewer.add_image(camera_crop.copy(), name="camera")
    w = dock(viewer, SimilarityMapWidget(viewer))
    w._image.value = layer
    _wait_idle(qtbot, w)
    assert viewer.layers[-1].name == "similarity map"
    viewer.add_image(np.ones_like(camera_crop), name="newer")  # opaque, above the map
    shown = w.results_shown
    w._window.value = 9
    _wait_idle(qtbot, w, shown=shown + 1)
    names = [lay.name for lay in viewer.layers]
    assert names[-1] == "similarity map" and names.count("similarity map") == 1, names
    assert "newer" in names
    # a map the user moved under a layer stays there
    viewer.layers.move(viewer.layers.index("newer"), len(viewer.layers))
    shown = w.results_shown
    w._window.value = 11
    _wait_idle(qtbot, w, shown=shown + 1)
    assert [lay.name for lay in viewer.layers][-2:] == ["similarity map", "newer"]
