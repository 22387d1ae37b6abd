"""Where the GUI thread's pauses go during a Register run docked from the Plugins menu.

Run under a display (``xvfb-run -a python benchmarks/gui_pauses.py affine|deformable
[pair|drift]``): a shown viewer, the sample data, the Register widget from
``add_plugin_dock_widget``; one first run and two warm runs. A 10 ms QTimer measures the
GUI thread's gaps; a thread samples the GUI thread's Python stack every 3 ms, and each gap
over 80 ms is printed with its most frequent (deepest napari-simwarp frame, deepest frame)
pairs: what in our code (or napari's) held the GUI thread. A diagnostic, not a benchmark:
nothing is written to docs/benchmarks.md.
"""

import collections
import sys
import threading
import time
import traceback

import napari
from qtpy.QtCore import QTimer
from qtpy.QtWidgets import QApplication

SRC = __import__("pathlib").Path(__file__).resolve().parents[1] / "src"

model = sys.argv[1] if len(sys.argv) > 1 else "affine"
mode = sys.argv[2] if len(sys.argv) > 2 else "pair"
v = napari.Viewer(show=True)
if mode == "pair":
    v.open_sample("napari-simwarp", "deformed_pair")
else:
    v.open_sample("napari-simwarp", "drifting_timelapse")
_, w = v.window.add_plugin_dock_widget("napari-simwarp", "Register")
if mode == "pair":
    w._fixed.value, w._moving.value = v.layers["fixed"], v.layers["moving"]
    w._model.value = model
else:
    w._mode.value = "time-lapse (drift)"
    w._moving.value = v.layers["time-lapse"]
app = QApplication.instance()
main_id = threading.main_thread().ident
samples = []
stop = threading.Event()


def sampler():
    while not stop.is_set():
        f = sys._current_frames().get(main_id)
        if f is not None:
            stack = traceback.extract_stack(f)
            samples.append(
                (
                    time.perf_counter(),
                    [
                        (
                            fr.filename.split("site-packages/")[-1].replace(str(SRC), ""),
                            fr.lineno,
                            fr.name,
                        )
                        for fr in stack
                    ],
                )
            )
        time.sleep(0.003)


def run_once(label):
    ticks = [time.perf_counter()]
    gaps = []

    def tick():
        now = time.perf_counter()
        gaps.append((ticks[-1], now))
        ticks.append(now)

    t = QTimer()
    t.setInterval(10)
    t.timeout.connect(tick)
    t.start()
    w._run = None
    start = time.perf_counter()
    w.run()
    while w.busy or w.result is None:
        app.processEvents()
        time.sleep(0.002)
    total = time.perf_counter() - start
    t.stop()
    big = sorted([g for g in gaps if g[1] - g[0] > 0.08], key=lambda g: g[0])
    print(
        f"== {label}: {total:.2f} s, gaps>80ms: {len(big)}, "
        f"longest {max(b - a for a, b in gaps) * 1000:.0f} ms"
    )
    for a, b in big:
        inside = [s for ts, s in samples if a <= ts <= b]
        # attribute: deepest napari_simwarp frame and deepest frame
        ours = collections.Counter()
        for s in inside:
            o = [f"{fn}:{ln} {name}" for fn, ln, name in s if "napari_simwarp" in fn]
            deep = s[-1]
            ours[(o[-1] if o else "-", f"{deep[0]}:{deep[1]} {deep[2]}")] += 1
        print(f"  gap {(a - start) * 1000:.0f}ms +{(b - a) * 1000:.0f}ms samples {len(inside)}")
        for (o, d), n in ours.most_common(4):
            print(f"     {n:3d} ours={o} | deepest={d}")


th = threading.Thread(target=sampler, daemon=True)
th.start()
run_once("first")
for i in range(2):
    run_once(f"warm {i}")
stop.set()
v.close()
