"""Closing the viewer or a widget mid-computation, in a fresh process: it must end cleanly.

A worker reporting to a widget whose Qt objects were deleted aborted the process
("wrapped C/C++ object ... has been deleted"); only a separate process shows the abort
(exit status) and the message (stderr).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import napari
    from qtpy.QtWidgets import QApplication
    from napari_simwarp import data
    from napari_simwarp._qt import RegisterWidget, SimilarityMapWidget

    what = sys.argv[1]
    app = QApplication.instance() or QApplication([])
    fixed, moving, _ = data.deformed_pair()
    viewer = napari.Viewer(show=False)
    f = viewer.add_image(fixed, name="fixed")
    m = viewer.add_image(moving, name="moving")
    stack = viewer.add_image(np.stack([fixed] * 8), name="stack")
    reg = RegisterWidget(viewer)
    sim = SimilarityMapWidget(viewer)
    regdock = viewer.window.add_dock_widget(reg)
    simdock = viewer.window.add_dock_widget(sim)
    reg.reset_choices(); sim.reset_choices()
    reg._fixed.value, reg._moving.value = f, m
    reg._model.value, reg._iterations.value = "deformable", 2000
    sim._image.value, sim._second.value = stack, stack
    sim._metric.value = "SSIM"
    reg.run()
    sim.compute()

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            app.processEvents()
            time.sleep(0.005)

    spin(1.0)  # mid-run: snapshots are arriving
    assert reg.busy, "the registration ended before the close"
    if what == "viewer":
        viewer.close()
    elif what == "quit":  # the window closed and the process leaving at once
        viewer.close()
        print("closed cleanly")
        sys.exit(0)
    else:
        viewer.window.remove_dock_widget(regdock)
        viewer.window.remove_dock_widget(simdock)
        reg.native.deleteLater(); sim.native.deleteLater()
        from qtpy.QtCore import QCoreApplication, QEvent
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # delete now
    spin(3.0)  # queued signals of the workers arrive after the close
    print("closed cleanly")
    """
)


@pytest.mark.parametrize("what", ["viewer", "quit", "widgets"])
def test_closing_mid_run_exits_cleanly(what, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, what],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "closed cleanly" in proc.stdout
    assert "has been deleted" not in out, out[-3000:]
