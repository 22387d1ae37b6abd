"""The "Template matching" widget on a real viewer."""

from __future__ import annotations

import numpy as np

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
    wdg.run()
    qtbot.waitUntil(lambda: wdg.result is not None and not wdg.busy, timeout=30000)
    np.testing.assert_array_equal(viewer.layers["matches"].data[0], (14, 16, 12))
    assert viewer.layers["matches"].features["score"][0] > 0.999


def test_no_rectangle_is_a_notification(viewer, qtbot, errors):
    layer = viewer.add_image(data.camera()[:64, :64], name="camera")
    wdg = dock(viewer, TemplateMatchingWidget(viewer))
    wdg._image.value = layer
    wdg.run()
    assert errors and "rectangle" in errors[0] and not wdg.busy
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
    w.run()
    qtbot.waitUntil(lambda: w.result is not None and not w.busy, timeout=30000)
    assert BOXES_LAYER not in viewer.layers and "matches" in viewer.layers
