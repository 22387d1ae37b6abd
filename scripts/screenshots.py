"""Make docs/images/*.png: each widget in use on the sample data, in a real napari viewer.

    xvfb-run -a .venv/bin/python scripts/screenshots.py [--out docs/images]

Runs the same set-up as ``napari-simwarp demo`` (sample data, widgets docked), drives
each widget and grabs the whole window (``viewer.screenshot(canvas_only=False)``).
"""

from __future__ import annotations

import argparse
import pathlib
import time


def wait(condition, timeout: float = 300.0) -> None:
    from qtpy.QtWidgets import QApplication

    start = time.perf_counter()
    while not condition():
        QApplication.processEvents()
        time.sleep(0.02)
        if time.perf_counter() - start > timeout:
            raise TimeoutError("the widget did not finish in time")
    for _ in range(20):  # let the canvas draw the last update
        QApplication.processEvents()
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/images")
    parser.add_argument(
        "--iterations", type=int, default=60, help="registration iterations per level (default 60)"
    )
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import warnings

    warnings.filterwarnings("ignore", message=".*PyQt5.*")  # no deprecation toast in shots
    import napari
    from qtpy.QtWidgets import QApplication

    from napari_simwarp import backend_info
    from napari_simwarp._qt._demo import build_demo_viewer

    backend_info()  # build/load the kernels first, so timings shown are not first-use ones

    viewer = napari.Viewer(title="napari-simwarp", show=True)
    viewer.window._qt_window.resize(1500, 950)
    widgets = build_demo_viewer(viewer)
    docks = viewer.window._dock_widgets
    sim, match, reg = (widgets[n] for n in ("Similarity map", "Template matching", "Register"))

    def show_only(*names):
        for layer in viewer.layers:
            layer.visible = layer.name in names

    def raise_dock(name):
        docks[name].show()
        docks[name].raise_()
        QApplication.processEvents()

    # 1. Similarity map: local NCC of the deformed pair, live.
    wait(lambda: sim.results_shown >= 1 and not sim.busy)
    show_only("similarity map")
    raise_dock("Similarity map")
    wait(lambda: True)
    viewer.screenshot(str(out / "similarity_map.png"), canvas_only=False, flash=False)

    # 2. Template matching: the rectangle cut from the fixed image.
    raise_dock("Template matching")
    match._k.value, match._threshold.value = 5, 0.4
    match.run()
    wait(lambda: match.result is not None and not match.busy)
    show_only("fixed", "ZNCC map", "matches", "match boxes", "template box")
    viewer.layers["ZNCC map"].opacity = 0.5
    viewer.screenshot(str(out / "template_matching.png"), canvas_only=False, flash=False)

    # 3. Register: deformable registration of the pair, live fields.
    raise_dock("Register")
    reg._iterations.value = args.iterations
    reg.run()
    # the arrows come one second into a run (or with its end, for a shorter one)
    wait(
        lambda: (
            reg.snapshots_shown >= 1 and ("similarity gradient" in viewer.layers or not reg.busy)
        )
    )
    show_only("fixed", "moving registered", "displacement", "similarity gradient")
    viewer.screenshot(str(out / "register_live.png"), canvas_only=False, flash=False)
    wait(lambda: reg.result is not None and not reg.busy)
    show_only("fixed", "moving registered", "displacement")
    viewer.camera.zoom *= 2.0
    viewer.screenshot(str(out / "register.png"), canvas_only=False, flash=False)
    viewer.camera.zoom /= 2.0

    # 4. Drift correction of the time-lapse.
    reg._mode.value = "time-lapse (drift)"
    reg._moving.value = viewer.layers["time-lapse"]
    reg.run()
    wait(lambda: reg.result is not None and not reg.busy)
    show_only("time-lapse registered", "displacement")
    viewer.camera.center = (128, 128)
    viewer.camera.zoom *= 1.6
    viewer.dims.set_current_step(0, 7)
    wait(lambda: True)
    viewer.screenshot(str(out / "drift.png"), canvas_only=False, flash=False)
    print("wrote", ", ".join(sorted(p.name for p in out.glob("*.png"))))
    viewer.close()


if __name__ == "__main__":
    main()
