"""The "Template matching" widget on a real viewer."""

from __future__ import annotations

import numpy as np
import pytest

from napari_simwarp import data
from napari_simwarp._qt import TemplateMatchingWidget

from .conftest import dock


def test_template_from_rectangle_found_where_cut(viewer, qtbot):
    image = np.ascontiguousarray(data.camera()[100:260, 150:310])  # 160²
    layer = viewer.add_image(image.copy(), name="camera")
    y0, x0, h, w = 60, 40, 24, 30  # the template is cut from here
    shapes = viewer.add_shapes(
        [np.array([[y0, x0], [y0, x0 + w], [y0 + h, x0 + w], [y0 + h, x0]], float) - 0.5],
        shape_type="rectangle",
        name="template box",
    )
    wdg = dock(viewer, TemplateMatchingWidget(viewer))
    wdg._image.value, wdg._shapes.value = layer, shapes
    wdg._k.value, wdg._threshold.value = 3, 0.3
    np.testing.assert_array_equal(wdg.template(), image[y0 : y0 + h, x0 : x0 + w])
    wdg.run()
    qtbot.waitUntil(lambda: wdg.result is not None and not wdg.busy, timeout=30000)
    points = viewer.layers["matches"]
    center = (y0 + h // 2, x0 + w // 2)
    np.testing.assert_array_equal(points.data[0], center)
    assert points.features["score"][0] > 0.999
    assert (np.diff(points.features["score"]) <= 0).all() and len(points.data) <= 3
    assert viewer.layers["ZNCC map"].data.shape == image.shape
    box = viewer.layers["match boxes"].data[0]
    np.testing.assert_allclose(box.min(axis=0) + 0.5, (y0, x0))
    np.testing.assert_array_equal(layer.data, image)

    # A rerun reuses the result layers.
    n_layers = len(viewer.layers)
    wdg._k.value = 1
    wdg.result = None
    wdg.run()
    qtbot.waitUntil(lambda: wdg.result is not None and not wdg.busy, timeout=30000)
    assert len(viewer.layers) == n_layers and len(viewer.layers["matches"].data) == 1


def test_template_layer_3d(viewer, qtbot):
    vol = data.blobs_volume(32)
    layer = viewer.add_image(vol.copy(), name="vol")
    tpl = viewer.add_image(vol[8:20, 10:22, 6:18].copy(), name="tpl")
    wdg = dock(viewer, TemplateMatchingWidget(viewer))
    wdg._source.value = "image layer"
    wdg._image.value, wdg._template.value = layer, tpl
    wdg._mode.value = "3D volume"  # in a 2-D view, "2D per plane" is proposed
    wdg.run()
    qtbot.waitUntil(lambda: wdg.result is not None and not wdg.busy, timeout=30000)
    np.testing.assert_array_equal(viewer.layers["matches"].data[0], (14, 16, 12))
    assert viewer.layers["matches"].features["score"][0] > 0.999


@pytest.mark.parametrize("building", [False, True])
def test_no_rectangle_is_a_notification(viewer, qtbot, errors, monkeypatch, building):
    from napari_simwarp._qt import _common

    # while the kernels would still build, the missing input is said at once, no build
    monkeypatch.setattr(_common, "kernels_pending", lambda: building)
    monkeypatch.setattr(_common, "kernels_cached", lambda: False)  # a first use
    started = []
    monkeypatch.setattr(_common, "_start_kernel_build", lambda: started.append(1))
    layer = viewer.add_image(data.camera()[:64, :64], name="camera")
    wdg = dock(viewer, TemplateMatchingWidget(viewer))
    wdg._image.value = layer
    wdg.run()
    assert errors and "rectangle" in errors[0] and not wdg.busy and not started
    assert "rectangle" in wdg._status.value  # said in the widget, not only in a toast


def test_a_3d_run_removes_the_2d_boxes(viewer, qtbot):
    # Boxes are drawn in 2D only: after a 3D run the old 2D boxes no longer matched the points.
    from napari_simwarp._qt._matching import BOXES_LAYER

    viewer.add_shapes([np.array([[1, 1], [3, 3]])], shape_type="rectangle", name=BOXES_LAYER)
    vol = data.blobs_volume(32)
    image = viewer.add_image(vol, name="volume")
    template = viewer.add_image(vol[8:16, 8:16, 8:16].copy(), name="cube")
    w = dock(viewer, TemplateMatchingWidget(viewer))
    w._source.value = "image layer"
    w._image.value, w._template.value = image, template
    w._mode.value = "3D volume"
    w.run()
    qtbot.waitUntil(lambda: w.result is not None and not w.busy, timeout=30000)
    assert BOXES_LAYER not in viewer.layers and "matches" in viewer.layers


def _counted(array, chunks):
    """A dask array over ``array`` that records each chunk read: ``(chunk location,
    thread id)``."""
    import threading

    da = pytest.importorskip("dask.array")

    reads = []

    def counted(block, block_info=None):
        reads.append((tuple(block_info[0]["chunk-location"]), threading.get_ident()))
        return block

    lazy = da.from_array(array, chunks=chunks).map_blocks(counted, dtype=array.dtype)
    return lazy, reads


def test_rectangle_on_a_frame_of_a_lazy_stack_reads_that_frame_only_in_the_worker(viewer, qtbot):
    import threading

    frames = [np.ascontiguousarray(data.camera()[40 * t : 40 * t + 160, 150:310]) for t in range(5)]
    stack = np.stack(frames)  # (5, 160, 160): frames that differ
    lazy, reads = _counted(stack, (1, 160, 160))
    layer = viewer.add_image(lazy, name="stack", contrast_limits=(0, 1))
    y0, x0, h, w = 60, 40, 24, 30
    shapes = viewer.add_shapes(  # a 2-D rectangle drawn over the stack
        [np.array([[y0, x0], [y0, x0 + w], [y0 + h, x0 + w], [y0 + h, x0]], float) - 0.5],
        shape_type="rectangle",
        name="box",
    )
    viewer.dims.set_current_step(0, 3)
    wdg = dock(viewer, TemplateMatchingWidget(viewer))
    wdg._image.value, wdg._shapes.value = layer, shapes
    assert wdg._mode.value == "2D per plane"
    gui = threading.get_ident()
    reads.clear()  # napari reads the plane it shows, on its own
    wdg.run()
    # Starting the run read nothing on the GUI thread (the worker, in its own thread, may
    # already have begun: a read of it here is no failure; CI saw one on a loaded machine).
    assert not [read for read in reads if read[1] == gui]
    qtbot.waitUntil(lambda: wdg.result is not None and not wdg.busy, timeout=30000)
    assert {loc for loc, _ in reads} <= {(3, 0, 0)}  # only frame 3, never the stack
    assert all(thread != gui for _, thread in reads[:1])
    np.testing.assert_array_equal(wdg.template(), stack[3, y0 : y0 + h, x0 : x0 + w])
    center = (y0 + h // 2, x0 + w // 2)
    np.testing.assert_array_equal(viewer.layers["matches"].data[0], center)
    assert viewer.layers["matches"].features["score"][0] > 0.999
    assert "plane (3,)" in wdg._status.value


def test_multiscale_layer_is_matched_at_the_chosen_level_only(viewer, qtbot):
    full = np.ascontiguousarray(data.camera()[100:356, 150:406])  # 256²
    half = np.ascontiguousarray(full.reshape(128, 2, 128, 2).mean(axis=(1, 3)))
    lazy_full, reads_full = _counted(full, (64, 64))
    lazy_half, reads_half = _counted(half, (64, 64))
    layer = viewer.add_image([lazy_full, lazy_half], name="pyramid", contrast_limits=(0, 1))
    y0, x0, h, w = 30, 20, 16, 20  # at level 1 (full-resolution coordinates are twice these)
    shapes = viewer.add_shapes(
        [np.array([[y0, x0], [y0, x0 + w], [y0 + h, x0 + w], [y0 + h, x0]], float) * 2 - 0.5],
        shape_type="rectangle",
    )
    wdg = dock(viewer, TemplateMatchingWidget(viewer))
    wdg._image.value, wdg._shapes.value = layer, shapes
    assert not wdg._level.native.isHidden()  # a level choice, for multiscale layers
    wdg._level.value = 1
    reads_full.clear()
    reads_half.clear()
    wdg.run()
    qtbot.waitUntil(lambda: wdg.result is not None and not wdg.busy, timeout=30000)
    assert not reads_full  # the full-resolution level is never read
    np.testing.assert_array_equal(wdg.template(), half[y0 : y0 + h, x0 : x0 + w])
    np.testing.assert_array_equal(viewer.layers["matches"].data[0], (y0 + h // 2, x0 + w // 2))
    np.testing.assert_array_equal(viewer.layers["ZNCC map"].scale, (2.0, 2.0))  # on screen


def test_a_plane_beyond_the_memory_budget_is_refused_before_reading(viewer, qtbot, monkeypatch):
    stack = np.stack([data.camera()[:128, :128]] * 3)
    lazy, reads = _counted(stack, (1, 128, 128))
    layer = viewer.add_image(lazy, name="stack", contrast_limits=(0, 1))
    shapes = viewer.add_shapes([np.array([[10, 10], [10, 30], [30, 30], [30, 10]], float)])
    wdg = dock(viewer, TemplateMatchingWidget(viewer))
    wdg._image.value, wdg._shapes.value = layer, shapes
    monkeypatch.setenv("SIMWARP_MEMORY_BUDGET", "100KiB")
    reads.clear()
    wdg.run()
    assert not wdg.busy and not reads and wdg.result is None
    status = wdg._status.value
    assert "needs about" in status and "100.0 KiB" in status and "coarser level" in status


def test_first_run_waits_for_the_kernel_build_in_the_status_line(viewer, qtbot, monkeypatch):
    # ZNCC runs on the local std kernels: the first match built them inside the run under
    # "matching a … template…" for a minute (issue 13). Now a visible step, then the run.
    import threading

    from napari_simwarp._qt import _common
    from napari_simwarp.ops import _kernels

    release, built = threading.Event(), threading.Event()

    def fake_build(verbose=False):
        release.wait(30)
        built.set()
        return True

    monkeypatch.setattr(_common, "kernels_pending", lambda: not built.is_set())

    monkeypatch.setattr(_common, "kernels_cached", lambda: False)  # a first use
    monkeypatch.setattr(_kernels, "ensure_loaded", fake_build)
    _, wdg = _camera_with_a_box(viewer)
    try:
        wdg.run()
        assert wdg._status.value == "loading the compiled kernels…"  # a cached load: no more
        qtbot.waitUntil(lambda: "building the compiled kernels" in wdg._status.value)
        assert not wdg.busy and wdg.result is None and "matches" not in viewer.layers
    finally:
        release.set()
    qtbot.waitUntil(lambda: wdg.result is not None and not wdg.busy, timeout=30000)
    np.testing.assert_array_equal(viewer.layers["matches"].data[0], (72, 55))  # 60+12, 40+15


def test_rerun_results_come_back_on_top_of_a_newer_layer(viewer, qtbot):
    # Issue 13: reused result layers stayed under layers added since, hidden by them.
    image, wdg = _camera_with_a_box(viewer)
    results = ["ZNCC map", "matches", "match boxes"]
    for rerun in range(2):
        wdg.result = None
        wdg.run()
        qtbot.waitUntil(lambda: wdg.result is not None and not wdg.busy, timeout=30000)
        names = [lay.name for lay in viewer.layers]
        assert names[-3:] == results and len(names) == 3 + 2 + rerun, names
        viewer.add_image(np.ones_like(image), name=f"newer {rerun}")  # opaque, above them


def _camera_with_a_box(viewer):
    """A 160² camera crop, a 24×30 rectangle at (60, 40) over it and the widget on both."""
    image = np.ascontiguousarray(data.camera()[100:260, 150:310])
    layer = viewer.add_image(image.copy(), name="camera")
    shapes = viewer.add_shapes(
        [np.array([[60, 40], [60, 70], [84, 70], [84, 40]], float) - 0.5],
        shape_type="rectangle",
        name="template box",
    )
    wdg = dock(viewer, TemplateMatchingWidget(viewer))
    wdg._image.value, wdg._shapes.value = layer, shapes
    return image, wdg
