"""Widget tests with a real napari viewer (run them under ``xvfb-run -a`` with no display)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from napari_simwarp import data

# Without the napari extra (a script-only install) the widget tests are not collected.
if not all(importlib.util.find_spec(m) for m in ("napari", "pytestqt", "magicgui")):
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session", autouse=True)
def kernels_built():
    """Build (or load) the compiled kernels before any widget runs an operator.

    The first compiled call builds them (a minute on two cores); inside a widget's worker
    that would eat the tests' waits for a result, so it happens here, once per session.
    """
    from napari_simwarp.ops import _kernels

    if _kernels.requested_backend() != "torch":
        _kernels.ensure_loaded()


@pytest.fixture
def camera_crop():
    """A 128² crop of the camera picture (float32, [0, 1])."""
    return np.ascontiguousarray(data.camera()[64:192, 192:320])


@pytest.fixture
def small_pair():
    """A 96² crop of the deformed sample pair and its true displacement (2, 96, 96)."""
    fixed, moving, disp = data.deformed_pair()
    sl = (slice(208, 304), slice(208, 304))
    return (
        np.ascontiguousarray(fixed[sl]),
        np.ascontiguousarray(moving[sl]),
        np.ascontiguousarray(disp[(slice(None), *sl)]),
    )


@pytest.fixture
def errors(monkeypatch):
    """Collects the messages the widgets send as error notifications."""
    from napari_simwarp._qt import _common

    seen: list[str] = []
    monkeypatch.setattr(_common, "show_error", lambda msg: seen.append(msg))
    return seen


def dock(viewer, widget):
    viewer.window.add_dock_widget(widget)
    widget.reset_choices()
    return widget


def no_workers_running() -> bool:
    from superqt.utils._qthreading import WorkerBase

    return not any(
        w.isRunning() if hasattr(w, "isRunning") else True for w in list(WorkerBase._worker_set)
    )


@pytest.fixture
def viewer(make_napari_viewer, qtbot):
    """A real viewer; on teardown, waits until every worker thread has ended (before the
    viewer is closed), so no worker outlives its test."""
    v = make_napari_viewer()
    yield v
    qtbot.waitUntil(no_workers_running, timeout=60000)


@pytest.fixture(autouse=True)
def live_from_the_start(monkeypatch):
    """The Register widget's live display from a run's first snapshot, ten a second: the
    tests' runs are short (the widget leaves a run shorter than ``LIVE_AFTER_MS``
    undisplayed until its result, and displays at most every ``DISPLAY_MS``), and the
    live display is what many of them test."""
    from napari_simwarp._qt import _register

    monkeypatch.setattr(_register, "LIVE_AFTER_MS", 0)
    monkeypatch.setattr(_register, "DISPLAY_MS", 100)


def slow_reports(monkeypatch, seconds: float = 0.02) -> None:
    """Each progress report of a registration run takes ``seconds`` longer: a test's short
    run (which may also converge early) then lasts long enough for the several live
    displays the test counts, on a busy machine too, where the displays are spaced after
    the GUI thread's busy time."""
    import time

    from napari_simwarp.widgets_logic.registration import RegistrationRun

    real = RegistrationRun._snapshot
    monkeypatch.setattr(
        RegistrationRun, "_snapshot", lambda run, *a: time.sleep(seconds) or real(run, *a)
    )
