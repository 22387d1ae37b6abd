"""The GUI demo's set-up (what `napari-simwarp demo` opens), and sample data in a viewer."""

from __future__ import annotations

import numpy as np

from napari_simwarp._qt._demo import build_demo_viewer


def test_demo_viewer_has_sample_data_and_docked_widgets(viewer, qtbot):
    widgets = build_demo_viewer(viewer, device="cpu")
    assert set(widgets) == {"Similarity map", "Template matching", "Register"}
    for name in ("fixed", "moving", "time-lapse", "template box"):
        assert name in viewer.layers
    sim = widgets["Similarity map"]
    qtbot.waitUntil(lambda: sim.results_shown >= 1 and not sim.busy, timeout=60000)
    assert viewer.layers["similarity map"].data.shape == (512, 512)
    match = widgets["Template matching"]
    match.run()
    qtbot.waitUntil(lambda: match.result is not None and not match.busy, timeout=60000)
    np.testing.assert_array_equal(viewer.layers["matches"].data[0], (224, 254))  # 200+24, 230+24
    assert "device: cpu" in widgets["Register"]._backend.value
    # tabbed in one dock area (stacked, they overflowed a 1000-px screen), Register in front
    docks = [w.native.parent() for w in widgets.values()]
    window = viewer.window._qt_window
    assert all(len(window.tabifiedDockWidgets(d)) == 2 for d in docks)
    assert not widgets["Register"].native.visibleRegion().isEmpty() or not window.isVisible()


def test_npe2_sample_data_opens_in_napari(viewer):
    viewer.open_sample("napari-simwarp", "drifting_timelapse")
    assert viewer.layers["time-lapse"].data.shape == (20, 256, 256)
