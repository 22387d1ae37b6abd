"""Every widget as users dock it: from the Plugins menu (``add_plugin_dock_widget``), which
hands it napari's ``PublicOnlyProxy`` viewer and layers, in a shown viewer, on the sample
data (issue 27).

Each run must reuse its result layers (no layer removed after the first display: a
removal runs napari's garbage collection and a GL finish, and re-adding selects the new
layer) and must leave the user's layer selection as it was. The results must equal the
library's own calls.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import napari_simwarp as sw
from napari_simwarp import ops
from napari_simwarp._qt._common import layer_by_name

from .conftest import no_workers_running, slow_reports

PLUGIN = "napari-simwarp"


@pytest.fixture
def shown_viewer(make_napari_viewer, qtbot):
    """A shown viewer (the drawing a user waits for happens); on teardown, waits until
    every worker has ended."""
    v = make_napari_viewer(show=True)
    yield v
    qtbot.waitUntil(no_workers_running, timeout=60000)


def _from_menu(viewer, name):
    """The widget ``name`` docked as the Plugins menu docks it."""
    _, widget = viewer.window.add_plugin_dock_widget(PLUGIN, name)
    # the path under test: napari hands the widget a proxy, not the viewer itself
    assert type(widget._viewer).__name__ == "PublicOnlyProxy"
    return widget


class _Watch:
    """Counts the viewer's layer removals and additions, and the selection's events (a
    change, even one put back at once, repopulates napari's layer controls), from now on."""

    def __init__(self, viewer):
        self.removed: list[str] = []
        self.added: list[str] = []
        self.selection_events: list[str] = []
        viewer.layers.events.removed.connect(lambda e: self.removed.append(e.value.name))
        viewer.layers.events.inserted.connect(lambda e: self.added.append(e.value.name))
        for name in ("changed", "active", "_current"):
            getattr(viewer.layers.selection.events, name).connect(
                lambda e, name=name: self.selection_events.append(name)
            )


def _select(viewer, layer):
    viewer.layers.selection.active = layer
    return {layer}


def _run_register(qtbot, w, timeout=180000):
    w.run()
    qtbot.waitUntil(lambda: w.result is not None and not w.busy, timeout=timeout)


def test_register_docked_over_two_images_takes_them_as_fixed_then_moving(shown_viewer):
    viewer = shown_viewer
    viewer.open_sample(PLUGIN, "deformed_pair")
    w = _from_menu(viewer, "Register")
    assert w._fixed.value is viewer.layers["fixed"]  # was empty, and moving was "fixed"
    assert w._moving.value is viewer.layers["moving"]
    w._moving.value = viewer.layers["fixed"]  # a user's choice stays (fixed is set)
    viewer.add_image(np.zeros((8, 8)), name="another")
    assert w._moving.value is viewer.layers["fixed"]


def test_register_docked_from_the_menu_reuses_its_layers_and_keeps_the_selection(
    shown_viewer, qtbot, monkeypatch
):
    viewer = shown_viewer
    slow_reports(monkeypatch)  # several live displays, also on a busy machine
    viewer.open_sample(PLUGIN, "deformed_pair")
    fixed, moving = viewer.layers["fixed"], viewer.layers["moving"]
    w = _from_menu(viewer, "Register")
    w._fixed.value, w._moving.value = fixed, moving
    w._iterations.value = 30
    selected = _select(viewer, fixed)  # the user works on the fixed layer
    _run_register(qtbot, w)
    assert set(viewer.layers.selection) == selected  # a run never takes the selection
    assert w.snapshots_shown >= 2
    watch = _Watch(viewer)
    w._run = None  # result None until the rerun ends
    _run_register(qtbot, w)
    assert watch.removed == [] and watch.added == []  # reused, not removed and re-added
    assert set(viewer.layers.selection) == selected
    assert viewer.layers.selection.active is fixed

    # The library's own call with the widget's settings gives the same transform.
    api = sw.register(fixed.data, moving.data, model="affine", levels=w._run.levels, iterations=30)
    np.testing.assert_allclose(w.result.transform.matrix, api.transform.matrix, atol=1e-4)
    np.testing.assert_allclose(viewer.layers["moving registered"].data, api.warped, atol=1e-3)


def test_register_first_run_from_the_menu_adds_its_layers_once_unselected_with_its_own_bar(
    shown_viewer, qtbot, monkeypatch
):
    # The first run adds the result layers: napari selected each one and the widget put
    # the user's selection back (two layer-control repopulations per layer), and made
    # napari's progress bar (150-400 ms of the GUI thread for the session's first). Now:
    # no selection event at all, no napari progress bar, the widget's own bar full.
    from napari.utils import progress

    viewer = shown_viewer
    viewer.open_sample(PLUGIN, "deformed_pair")
    fixed, moving = viewer.layers["fixed"], viewer.layers["moving"]
    w = _from_menu(viewer, "Register")
    w._fixed.value, w._moving.value = fixed, moving
    w._model.value, w._iterations.value = "deformable", 20
    _select(viewer, moving)
    bars = []
    real_init = progress.__init__
    monkeypatch.setattr(
        progress, "__init__", lambda self, *a, **k: bars.append(k) or real_init(self, *a, **k)
    )
    watch = _Watch(viewer)
    _run_register(qtbot, w)
    assert watch.added == ["moving registered", "displacement", "similarity gradient"]
    assert watch.selection_events == [] and watch.removed == []
    assert set(viewer.layers.selection) == {moving}
    assert bars == []
    assert w._bar.value == w._bar.max == w._run.expected_steps() + 1
    assert w._bar.visible


def test_register_progress_bar_moves_without_a_repaint_of_its_own(shown_viewer, qtbot):
    # QProgressBar.setValue repaints at once, and any repaint composes the whole window
    # with its OpenGL canvas (10-14 ms each under software OpenGL): the bar is moved
    # with the display's batch and painted with the window's next repaint.
    from qtpy.QtCore import QEvent, QObject

    w = _from_menu(shown_viewer, "Register")
    qtbot.waitUntil(lambda: w._bar.native.isVisible(), timeout=10000)
    paints = []

    class Paints(QObject):
        def eventFilter(self, obj, event):  # noqa: N802 (Qt's name)
            if event.type() == QEvent.Type.Paint:
                paints.append(obj)
            return False

    watcher = Paints()
    w._bar.native.installEventFilter(watcher)
    w._bar.max = 10
    qtbot.wait(50)
    paints.clear()
    w._set_bar(4)
    assert paints == [] and w._bar.value == 4  # moved, not painted yet
    qtbot.waitUntil(lambda: len(paints) > 0, timeout=5000)  # painted with the next repaint
    w._set_bar(40)
    assert w._bar.value == 10  # at most its maximum
    w._bar.native.removeEventFilter(watcher)


def test_drift_docked_from_the_menu_reuses_its_layers_and_keeps_the_selection(
    shown_viewer, qtbot, tmp_path
):
    viewer = shown_viewer
    viewer.open_sample(PLUGIN, "drifting_timelapse")
    stack = viewer.layers["time-lapse"]
    other = viewer.add_image(np.zeros((8, 8), np.float32), name="notes")
    w = _from_menu(viewer, "Register")
    w._mode.value = "time-lapse (drift)"
    w._moving.value = stack
    selected = _select(viewer, other)
    _run_register(qtbot, w)
    watch = _Watch(viewer)
    w._run = None
    _run_register(qtbot, w)
    assert watch.removed == [] and watch.added == []
    assert set(viewer.layers.selection) == selected
    # the bar counts the frames aligned (of every pass), ending on all of them
    frames = w._run.frame_total * w._run.passes
    assert w._bar.value == w._bar.max == frames
    assert w._bar.native.text().startswith(f"{frames}/{frames} frames")

    api = sw.register_stack(stack.data, model="translation", reference="first")
    np.testing.assert_allclose(w.result.shifts, api.shifts, atol=1e-4)
    # the result keeps the movie's colormap (a grey movie stays grey)
    assert viewer.layers["time-lapse registered"].colormap.name == "gray"


def test_similarity_map_docked_from_the_menu_reuses_its_layer_and_keeps_the_selection(
    shown_viewer, qtbot
):
    viewer = shown_viewer
    viewer.open_sample(PLUGIN, "deformed_pair")
    fixed = viewer.layers["fixed"]
    w = _from_menu(viewer, "Similarity map")
    selected = _select(viewer, viewer.layers["moving"])
    w._image.value = fixed
    w._window.value = 9
    qtbot.waitUntil(lambda: w.results_shown >= 1 and not w.busy, timeout=60000)
    assert set(viewer.layers.selection) == selected
    watch = _Watch(viewer)
    for window in (11, 15):
        shown = w.results_shown
        w._window.value = window
        qtbot.waitUntil(lambda s=shown: w.results_shown > s and not w.busy, timeout=60000)
    assert watch.removed == [] and watch.added == []
    assert set(viewer.layers.selection) == selected
    x = torch.from_numpy(np.ascontiguousarray(fixed.data, np.float32))[None, None]
    expected = ops.local_std(x, window=15)[0, 0].numpy()
    np.testing.assert_allclose(viewer.layers["similarity map"].data, expected, rtol=1e-5, atol=1e-6)


def test_template_matching_docked_from_the_menu_reuses_its_layers_and_keeps_the_selection(
    shown_viewer, qtbot
):
    viewer = shown_viewer
    viewer.open_sample(PLUGIN, "deformed_pair")
    fixed = viewer.layers["fixed"]
    y0, x0, h, wd = 200, 220, 32, 40
    box = np.array([[y0, x0], [y0, x0 + wd], [y0 + h, x0 + wd], [y0 + h, x0]], float) - 0.5
    w = _from_menu(viewer, "Template matching")
    shapes = viewer.add_shapes([box], shape_type="rectangle", name="template box")
    # the rectangle combo picks the Shapes layer that exists (no "-----" first)
    assert w._shapes.value is not None and w._shapes.value.name == "template box"
    w._image.value = fixed
    selected = _select(viewer, shapes)
    for run in range(2):
        if run == 1:
            watch = _Watch(viewer)
        w.result = None
        w.run()
        qtbot.waitUntil(lambda: w.result is not None and not w.busy, timeout=60000)
        assert set(viewer.layers.selection) == selected
    assert watch.removed == [] and watch.added == []

    from skimage.feature import match_template

    image = np.asarray(fixed.data, np.float64)
    expected = match_template(image, image[y0 : y0 + h, x0 : x0 + wd], pad_input=True)
    np.testing.assert_allclose(viewer.layers["ZNCC map"].data, expected, atol=1e-4)
    assert tuple(viewer.layers["matches"].data[0]) == (y0 + h // 2, x0 + wd // 2)


def _map_shown_at_draw(viewer):
    """At a canvas draw: None when the similarity map layer shows nothing on the viewer's
    current frame, else (the frame the viewer is on, the frame the map layer is of, the
    2-D map napari has sliced for display)."""
    layer = layer_by_name(viewer, "similarity map")
    if layer is None or layer._slice.empty:
        return None
    frame_on_screen = int(viewer.dims.current_step[0])
    frame_of_map = round(float(layer.translate[0] / layer.scale[0]))
    return frame_on_screen, frame_of_map, np.array(layer._slice.image.view)


def test_similarity_map_never_shows_a_map_of_another_frame(shown_viewer, qtbot):
    # Issue 27: during playback the map of an earlier frame stayed on screen, looking
    # current, for the debounce and the next frame's computation.
    from scipy import ndimage

    viewer = shown_viewer
    rng = np.random.default_rng(1)
    # each frame's texture differs in amplitude, so each frame's map is its own
    movie = np.stack([rng.standard_normal((64, 72)) * (t + 1) for t in range(8)]).astype(np.float32)
    viewer.add_image(movie, name="movie")
    viewer.dims.set_current_step(0, 0)
    w = _from_menu(viewer, "Similarity map")
    w._image.value = viewer.layers["movie"]
    w._window.value = 5
    qtbot.waitUntil(lambda: w.results_shown >= 1 and not w.busy, timeout=60000)

    seen = []
    canvas = viewer.window._qt_viewer.canvas._scene_canvas
    canvas.events.draw.connect(lambda e: seen.append(_map_shown_at_draw(viewer)))
    for t in [1, 2, 3, 5, 4, 7, 6, 0, 2]:  # steps faster than the maps: playback-like
        viewer.dims.set_current_step(0, t)
        qtbot.wait(15)
    qtbot.waitUntil(lambda: not w.busy, timeout=60000)
    qtbot.wait(100)  # the last map's draw

    def reference(t):
        f = movie[t].astype(np.float64)
        mean = ndimage.uniform_filter(f, 5, mode="reflect")
        return np.sqrt(np.maximum(ndimage.uniform_filter(f * f, 5, mode="reflect") - mean**2, 0))

    drawn = [s for s in seen if s is not None]
    assert drawn, "no map was ever drawn"
    for on_screen, of_map, view in drawn:
        assert of_map == on_screen  # a map is drawn on its own frame only
        np.testing.assert_allclose(view, reference(on_screen), rtol=1e-4, atol=1e-4)
    assert seen[-1] is not None and seen[-1][0] == 2  # the frame the viewer stopped on
    assert f"({2},)" in w._status.value  # the status names the frame the map is of


def test_register_plot_before_a_run_names_what_a_run_will_plot(shown_viewer):
    # Issue 27: the empty plot read "loss" against "snapshot", which no run plots.
    viewer = shown_viewer
    viewer.open_sample(PLUGIN, "deformed_pair")
    w = _from_menu(viewer, "Register")
    axis = w._plot._view.getPlotItem().getAxis

    def titles():
        return axis("bottom").labelText, axis("left").labelText

    assert titles() == ("iteration (all levels)", "similarity (ZNCC)")
    w._metric.value = "mi"
    assert titles() == ("iteration (all levels)", "similarity (normalized MI)")
    w._mode.value = "time-lapse (drift)"
    assert titles() == ("frame", "shift (px)")


def test_register_an_rgb_fixed_layer_is_registered_on_its_luminance_and_says_so(
    shown_viewer, qtbot
):
    # Issue 27: an RGB fixed image was used as luminance without a word.
    from skimage.color import rgb2gray

    viewer = shown_viewer
    viewer.open_sample(PLUGIN, "deformed_pair")
    gray = np.asarray(viewer.layers["fixed"].data, np.float32)
    tint = np.array([1.0, 0.8, 0.6], np.float32)
    rgb = viewer.add_image(gray[..., None] * tint, name="photo", rgb=True)
    moving = viewer.layers["moving"]
    w = _from_menu(viewer, "Register")
    w._fixed.value, w._moving.value = rgb, moving
    w._iterations.value = 30
    _run_register(qtbot, w)
    assert "the fixed layer 'photo' is RGB: registered on luminance" in w._status.value
    api = sw.register(
        rgb2gray(rgb.data), moving.data, model="affine", levels=w._run.levels, iterations=30
    )
    np.testing.assert_allclose(w.result.transform.matrix, api.transform.matrix, atol=1e-3)


def test_register_never_takes_another_widgets_result_layer_as_an_input(shown_viewer, qtbot):
    # Issue 27 (a screenshot): docked over one image, the Register widget made the
    # Similarity map's new result layer its moving image.
    viewer = shown_viewer
    viewer.open_sample(PLUGIN, "drifting_timelapse")
    movie = viewer.layers["time-lapse"]
    reg = _from_menu(viewer, "Register")
    sim = _from_menu(viewer, "Similarity map")
    sim._image.value = movie
    qtbot.waitUntil(lambda: sim.results_shown >= 1 and not sim.busy, timeout=60000)
    assert "similarity map" in viewer.layers
    assert reg._fixed.value is None and reg._moving.value is movie
    # a user's second image is still taken as the pair, fixed then moving
    other = viewer.add_image(np.asarray(movie.data[0]), name="reference frame")
    assert (reg._fixed.value, reg._moving.value) in ((movie, other), (other, movie))
