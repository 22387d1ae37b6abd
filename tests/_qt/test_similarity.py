"""The "Similarity map" widget on a real viewer."""

from __future__ import annotations

import numpy as np
import torch

from napari_simwarp import ops
from napari_simwarp._qt import SimilarityMapWidget

from .conftest import dock


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
