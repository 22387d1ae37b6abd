"""Closing the viewer or the widgets mid-computation (a registration, a drift correction,
a similarity map, a template matching), in a fresh process: it must end cleanly.

A worker reporting to a widget whose Qt objects were deleted aborted the process
("wrapped C/C++ object ... has been deleted"); only a separate process shows the abort
(exit status) and the message (stderr).
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import napari_simwarp

SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import napari
    from qtpy.QtWidgets import QApplication
    from napari_simwarp import data
    from napari_simwarp._qt import (
        RegisterWidget, SimilarityMapWidget, TemplateMatchingWidget,
    )

    print("napari_simwarp from", __import__("napari_simwarp").__file__)
    what = sys.argv[1]
    app = QApplication.instance() or QApplication([])
    fixed, moving, _ = data.deformed_pair()
    frames, _ = data.drifting_timelapse(frames=24, size=192)
    viewer = napari.Viewer(show=False)
    f = viewer.add_image(fixed, name="fixed")
    m = viewer.add_image(moving, name="moving")
    stack = viewer.add_image(np.stack([fixed] * 8), name="stack")
    drifting = viewer.add_image(frames, name="drifting")
    box = viewer.add_shapes([np.array([[100, 100], [100, 160], [150, 160], [150, 100]])])
    reg, drift = RegisterWidget(viewer), RegisterWidget(viewer)
    sim, tm = SimilarityMapWidget(viewer), TemplateMatchingWidget(viewer)
    docks = [viewer.window.add_dock_widget(w) for w in (reg, drift, sim, tm)]
    for w in (reg, drift, sim, tm):
        w.reset_choices()
    reg._fixed.value, reg._moving.value = f, m
    reg._model.value, reg._iterations.value = "deformable", 2000
    drift._mode.value = "time-lapse (drift)"
    drift._moving.value = drifting
    drift._model.value, drift._iterations.value = "affine", 5000
    sim._image.value, sim._second.value = stack, stack
    sim._metric.value = "SSIM"
    tm._image.value, tm._shapes.value = f, box
    running = sys.argv[2].split(",") if len(sys.argv) > 2 else ["reg", "drift", "sim", "tm"]
    starts = {"reg": reg.run, "drift": drift.run, "sim": sim.compute, "tm": tm.run}
    for name in running:
        starts[name]()

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            app.processEvents()
            time.sleep(0.005)

    spin(1.0)  # mid-run: snapshots are arriving
    assert reg.busy, "the registration ended before the close"
    assert drift.busy, "the drift correction ended before the close"
    start = time.perf_counter()
    if what == "raise":  # the user's script fails while the workers run
        raise RuntimeError("the script failed")
    if what == "exit":  # the script leaves without closing anything
        sys.exit(0)
    if what == "viewer":
        viewer.close()
    elif what == "quit":  # the window closed and the process leaving at once
        viewer.close()
        print(f"closed cleanly in {time.perf_counter() - start:.2f} s")
        sys.exit(0)
    else:
        for dock in docks:
            viewer.window.remove_dock_widget(dock)
        for w in (reg, drift, sim, tm):
            w.native.deleteLater()
        from qtpy.QtCore import QCoreApplication, QEvent
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # delete now
    closing = time.perf_counter() - start
    spin(3.0)  # queued signals of the workers arrive after the close
    print(f"closed cleanly in {closing:.2f} s")
    """
)


def _run_script(cwd, *args):
    """The script in a fresh process: its result and its stdout + stderr."""
    cwd.mkdir(parents=True, exist_ok=True)
    # This package's own copy first: a relative PYTHONPATH ("src"), read in the script's
    # folder, would import another copy (an installed one, the main checkout's).
    package_root = str(pathlib.Path(napari_simwarp.__file__).parents[1])
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONFAULTHANDLER": "1",
        "PYTHONPATH": os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=cwd,
    )
    return proc, proc.stdout + proc.stderr


@pytest.mark.parametrize("what", ["viewer", "quit", "widgets"])
def test_closing_mid_run_exits_cleanly(what, tmp_path):
    proc, out = _run_script(tmp_path, what)
    assert f"napari_simwarp from {napari_simwarp.__file__}" in proc.stdout, out[-3000:]
    assert proc.returncode == 0, out[-3000:]
    assert "closed cleanly" in proc.stdout, out[-3000:]
    assert "has been deleted" not in out, out[-3000:]


@pytest.mark.parametrize("how, code, runs", [("raise", 1, 1), ("exit", 0, 4)])
def test_leaving_python_mid_run_ends_the_workers_first(how, code, runs, tmp_path):
    # A worker still running while the interpreter and Qt's objects were torn down
    # aborted the process ("WorkerBaseSignals has been deleted", exit 134; 4 of 6 runs
    # before the exit hook). With the four widgets computing, PyQt's own exit handler
    # then deleted our widgets while it walked sip's wrappers, and the Python their
    # deletion ran corrupted the walk: exit 139 in 5 of 40 runs, before the exit hook
    # tore the widgets down first (0 of 40). The exit case runs several processes at once:
    # with that crash in about one exit in eight (5 of 40 runs in all before the fix),
    # four runs show it about half the time, for the wall time of about two runs.
    with concurrent.futures.ThreadPoolExecutor(runs) as pool:
        results = list(
            pool.map(lambda i: _run_script(tmp_path / str(i), how, "reg,drift,sim,tm"), range(runs))
        )
    for proc, out in results:
        assert f"napari_simwarp from {napari_simwarp.__file__}" in proc.stdout, out[-3000:]
        assert proc.returncode == code, out[-3000:]
        assert "has been deleted" not in out, out[-3000:]
        if how == "raise":
            assert "RuntimeError: the script failed" in proc.stderr
