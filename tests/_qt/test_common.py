"""_qt/_common.py: result layers by name; the widgets' teardown at exit."""

import numpy as np
import pytest

da = pytest.importorskip("dask.array")  # the [large] extra

from napari_simwarp import data  # noqa: E402
from napari_simwarp._qt import RegisterWidget, _common  # noqa: E402
from napari_simwarp._qt._common import put_layer  # noqa: E402

from .conftest import dock  # noqa: E402


def test_a_lazy_result_is_put_in_a_layer_without_being_computed(viewer):
    computed = []
    lazy = da.zeros((6, 32, 32), chunks=(1, 32, 32)).map_blocks(
        lambda b: computed.append(1) or b, dtype=float
    )
    before = len(computed)  # what napari reads to show one plane is not put_layer's
    layer = put_layer(viewer, "image", "result", lazy)
    shown = len(computed) - before
    assert layer.data is lazy and shown <= 2, shown  # at most the plane on screen
    put_layer(viewer, "image", "result", lazy + 1)  # reused: the same layer, new data
    assert viewer.layers["result"] is layer and len(computed) - before <= 4
    assert np.shape(layer.data) == (6, 32, 32)


def test_the_exit_teardown_stops_a_running_widget_and_deletes_it_at_once(viewer, qtbot):
    # Run at exit before PyQt's own cleanup, whose deletion of our widgets mid-walk of
    # sip's wrappers crashed the process (tests/_qt/test_close.py runs the exit itself).
    fixed, moving, _ = data.deformed_pair()
    w = dock(viewer, RegisterWidget(viewer))
    w._fixed.value = viewer.add_image(fixed, name="fixed")
    w._moving.value = viewer.add_image(moving, name="moving")
    w._model.value, w._iterations.value = "deformable", 5000
    w.run()
    # In its thread (superqt starts a worker one turn of the event loop after start()).
    qtbot.waitUntil(lambda: w.snapshots_received > 0, timeout=60000)
    run, worker = w._run, w._worker
    assert w in _common._WIDGETS
    destroyed = []
    w.native.destroyed.connect(lambda *_: destroyed.append(True))

    _common.tear_down_widgets([w])
    assert destroyed  # deleted now, not left to PyQt's exit handler
    assert w._closed and run.stopping
    assert worker._simwarp_done.is_set()  # its worker has left its thread
    assert not w._display_timer.isActive() and not w._step_timer.isActive()
    _common.tear_down_widgets([w])  # again (the exit hook after a test): nothing to do


def test_put_layer_through_napari_proxy_reuses_the_layer_and_keeps_the_selection(viewer):
    # Docked from the Plugins menu a widget gets napari's PublicOnlyProxy viewer: its
    # layers' type is the proxy's, and a compare of type names replaced every result
    # layer at each display (issue 27).
    from napari.utils._proxies import PublicOnlyProxy

    proxy = PublicOnlyProxy(viewer)
    user = viewer.add_image(np.zeros((8, 8), np.float32), name="user's")
    viewer.layers.selection.active = user
    first = put_layer(proxy, "image", "result", np.ones((8, 8), np.float32))
    assert _common.same_kind(first, "image", np.ones((8, 8)))
    assert not _common.same_kind(first, "vectors", np.ones((8, 8)))
    removed = []
    viewer.layers.events.removed.connect(lambda e: removed.append(e.value.name))
    again = put_layer(proxy, "image", "result", np.full((8, 8), 2, np.float32))
    assert removed == [] and again == first and float(again.data[0, 0]) == 2.0
    assert set(viewer.layers.selection) == {user}  # adding never took the selection
    # a layer of another kind under the name is replaced, the selection still kept
    put_layer(proxy, "points", "result", np.zeros((3, 2), np.float32))
    assert removed == ["result"] and set(viewer.layers.selection) == {user}


@pytest.mark.parametrize("selected", [0, 1, 2])
def test_a_result_layer_is_added_without_a_single_selection_event(viewer, selected):
    # napari selects each layer it adds; putting the user's selection back afterwards
    # still ran every listener twice (napari's layer controls repopulated, 15-40 ms each
    # under software OpenGL, issue 27). No listener may see a change, whatever was
    # selected (nothing, one layer, several).
    from napari.utils._proxies import PublicOnlyProxy

    layers = [viewer.add_image(np.zeros((8, 8), np.float32), name=f"user {i}") for i in range(3)]
    viewer.layers.selection.clear()
    viewer.layers.selection.update(layers[:selected])
    before, active = set(viewer.layers.selection), viewer.layers.selection.active
    events = []
    for name in ("changed", "active", "_current"):
        getattr(viewer.layers.selection.events, name).connect(
            lambda e, name=name: events.append(name)
        )
    proxy = PublicOnlyProxy(viewer)  # as the widgets docked from the Plugins menu get it
    put_layer(proxy, "image", "result", np.ones((8, 8), np.float32))
    put_layer(proxy, "vectors", "arrows", np.zeros((1, 2, 2), np.float32))
    assert "result" in viewer.layers and "arrows" in viewer.layers
    assert events == []
    assert set(viewer.layers.selection) == before
    assert viewer.layers.selection.active is active
    # napari's layer list shows the same selection (it follows the events it never got)
    from qtpy.QtCore import Qt

    view = viewer.window._qt_viewer.layers
    rows = view.selectionModel().selectedRows()
    assert {index.data(Qt.ItemDataRole.UserRole) for index in rows} == before


def test_a_cached_kernel_build_is_loaded_as_a_widget_opens_a_first_build_is_not(
    viewer, monkeypatch
):
    # Loading a cached build takes about a second, which the first run used to wait for
    # (issue 27); a first build (a minute of both cores) waits until a run asks for it.
    started = []
    monkeypatch.setattr(_common, "kernels_pending", lambda: True)
    monkeypatch.setattr(_common, "_start_kernel_build", lambda: started.append(1))
    for cached in (False, True):
        monkeypatch.setattr(_common, "kernels_cached", lambda cached=cached: cached)
        dock(viewer, RegisterWidget(viewer))
        assert started == ([1] if cached else [])


def test_a_cached_kernel_load_makes_no_napari_progress_bar_a_build_does(viewer, qtbot, monkeypatch):
    # The session's first napari progress bar took 150-400 ms of the GUI thread to make:
    # a cached load (about a second, as a widget opens) goes without it (issue 27).
    from napari.utils import progress

    from napari_simwarp.ops import _kernels

    bars = []
    real_init = progress.__init__
    monkeypatch.setattr(
        progress, "__init__", lambda self, *a, **k: bars.append(k) or real_init(self, *a, **k)
    )
    monkeypatch.setattr(_kernels, "ensure_loaded", lambda: None)
    monkeypatch.setitem(_common._KERNEL_BUILD, "worker", None)
    monkeypatch.setitem(_common._KERNEL_BUILD, "waiters", [])
    for cached in (True, False):
        monkeypatch.setattr(_common, "kernels_cached", lambda cached=cached: cached)
        _common._start_kernel_build()
        qtbot.waitUntil(lambda: _common._KERNEL_BUILD["worker"] is None, timeout=10000)
        assert len(bars) == (0 if cached else 1)
    assert "Building" in bars[0]["desc"]


def test_the_gil_switch_interval_is_short_while_a_worker_runs_and_put_back_after(qtbot):
    # A worker's torch calls each take the GIL back from a GUI thread running Python,
    # which gives it up only every switch interval (issue 27: a registration's worker
    # ran 1.5-2.5x its CPU time in a shown viewer).
    import sys
    import threading

    from napari.qt.threading import create_worker

    before = sys.getswitchinterval()
    release = threading.Event()
    seen = []

    def work():
        seen.append(sys.getswitchinterval())
        release.wait(10)

    first, second = create_worker(work), create_worker(work)
    _common.start_worker(first)
    _common.start_worker(second)
    qtbot.waitUntil(lambda: len(seen) == 2, timeout=10000)
    assert seen == [_common.WORKER_SWITCH_INTERVAL] * 2
    release.set()
    qtbot.waitUntil(lambda: first._simwarp_done.is_set() and second._simwarp_done.is_set())
    assert sys.getswitchinterval() == before  # put back when the last one ended
    # a worker that never runs (closed while queued behind busy ones) counts as ended
    import time

    from qtpy.QtCore import QThreadPool

    threads = QThreadPool.globalInstance().maxThreadCount()
    busy = [create_worker(time.sleep, 0.3) for _ in range(threads)]
    for worker in busy:
        _common.start_worker(worker)
    ran = []
    queued = create_worker(lambda: ran.append(1))
    _common.start_worker(queued)
    qtbot.wait(50)  # superqt hands its workers to the pool at the next turn of the loop
    _common.wait_for(queued)  # queued behind the busy ones: taken out, never run
    assert queued._simwarp_done.is_set() and sys.getswitchinterval() != before
    # nor left in superqt's set of started workers (which the tests' teardown waits on)
    assert queued not in type(queued)._worker_set
    for worker in busy:
        _common.wait_for(worker)
    assert sys.getswitchinterval() == before and not ran
    mine = [first, second, queued, *busy]
    # superqt forgets a worker at a queued signal: wait for it (the next tests' teardown
    # waits for superqt's workers to end)
    qtbot.waitUntil(lambda: not set(mine) & type(queued)._worker_set, timeout=10000)
    assert sys.getswitchinterval() == before and _common._SWITCH["workers"] == 0


def test_kernels_cached_names_the_build_the_kernels_load_from():
    from napari_simwarp.ops import _kernels

    if _kernels.requested_backend() == "torch" or not _kernels.state()["cpu"]:
        import pytest

        pytest.skip("no compiled kernels here")
    assert _common.kernels_cached()  # the session built (or found) them: conftest


def test_a_docked_widget_leaves_a_core_to_the_viewer(viewer, monkeypatch):
    # every widget (they share WorkerWidget) applies the thread policy when made
    import torch

    from napari_simwarp import _threads
    from napari_simwarp._qt import RegisterWidget, SimilarityMapWidget, TemplateMatchingWidget

    before = torch.get_num_threads()
    for widget in (RegisterWidget, SimilarityMapWidget, TemplateMatchingWidget):
        monkeypatch.setitem(_threads._state, "done", False)
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
        torch.set_num_threads(3)
        try:
            dock(viewer, widget(viewer))
            assert torch.get_num_threads() == 2, widget.__name__
        finally:
            torch.set_num_threads(before)
