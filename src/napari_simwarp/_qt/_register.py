"""The "Register" widget: align a moving layer to a fixed one (or a time-lapse to itself)."""

from __future__ import annotations

import contextlib
import gc
import time
import weakref
from dataclasses import replace
from typing import TYPE_CHECKING

import napari.layers
import numpy as np
from magicgui.widgets import (
    CheckBox,
    ComboBox,
    FloatSpinBox,
    ProgressBar,
    PushButton,
    SpinBox,
    create_widget,
)
from napari.qt.threading import create_worker
from qtpy.QtCore import QTimer

from ..registration.grid import Grid
from ..registration.quality import MEASURES
from ..widgets_logic._arrays import luminance_note
from ..widgets_logic.curves import empty_curve
from ..widgets_logic.geometry import (
    apply_transforms,
    for_moving_grid,
    layer_affine,
    layer_grid,
)
from ..widgets_logic.planes import mode_for, plane_at
from ..widgets_logic.registration import (
    DISPLACEMENT_LAYER,
    GRADIENT_LAYER,
    REFERENCES,
    WARPED_LAYER,
    RegistrationRun,
    RunSettings,
    landmarks_from_layers,
)
from ..widgets_logic.result_names import is_result
from ._common import (
    WorkerWidget,
    after_kernel_build,
    layer_by_name,
    layer_image,
    level_choice,
    notify_error,
    notify_info,
    notify_warning,
    plane_geometry,
    put_layer,
    redraw_in_place,
    remove_layer,
    run_in_background,
    same_kind,
    start_worker,
)
from ._plot import LossPlot

if TYPE_CHECKING:
    import napari

MODES = {"pair (2D / 3D)": "pair", "time-lapse (drift)": "stack"}
#: least time between two displays of snapshots (snapshots in between are merged: the
#: screen cannot show more, and a display that fell behind starved the GUI thread). Four
#: a second: each display repaints the window 3-5 times (canvas, layer list, plot), and
#: at ten a second a deformable run's worker took 1.3-1.6x the API's time against
#: 1.1-1.4x at four (issue 27, bench_plugin's register_from_menu, same load)
DISPLAY_MS = 250
#: a run's live display starts this many ms into it: a shorter run shows its result only
#: (see RunSettings.live_after)
LIVE_AFTER_MS = 500
#: display steps run in one turn of the event loop until this many ms have passed
STEP_MS = 40
#: least time between two updates of the Vectors layers (napari redraws their thumbnail,
#: one Python loop per arrow, at each data change: ~85 ms for 1000 arrows)
VECTORS_MS = 1000
#: the live display's share of the GUI thread, at most: displays are spaced so that what
#: one costs the GUI thread (its steps and the canvas repaint they cause, measured as the
#: lateness of a ticking timer) is at most this share of the time between two (issue 27:
#: with software OpenGL a repaint took 0.3-0.9 s, and displays every 100 ms kept the GUI
#: thread, and the GIL, busy while the worker waited)
DISPLAY_SHARE = 0.25
#: the tick of that timer, and the longest time between two displays
LAG_TICK_MS = 50
MAX_DISPLAY_MS = 2000
#: the Vectors result layers' style, set once per run (the displacement's length follows
#: its arrows, see :meth:`RegisterWidget._show`)
VECTOR_STYLES = {
    DISPLACEMENT_LAYER: {"edge_color": "yellow", "edge_width": 1.5},
    GRADIENT_LAYER: {"edge_color": "cyan", "edge_width": 1.0, "length": 1.0},
}


class RegisterWidget(WorkerWidget):
    """Register a moving layer to a fixed layer, or every frame of a time-lapse.

    The run happens in a ``thread_worker`` with a progress bar in the widget; every snapshot
    updates the ``"<moving> registered"`` image, the loss curve and the ``"displacement"``
    and ``"similarity gradient"`` Vectors layers (subsampled). Cancel stops the run within
    one iteration and keeps the best result so far. Afterwards the transform can be saved
    (``.npz``, read back by :func:`napari_simwarp.load_transform`), applied to
    other layers (labels with nearest neighbor) and, for linear models, shown through the
    moving layer's ``affine`` without resampling.
    """

    task = "registration"

    def __init__(self, napari_viewer: napari.viewer.Viewer):
        from ..registration import METRICS, MODELS

        super().__init__()
        self._viewer = napari_viewer
        self._mode = ComboBox(
            name="mode", choices=list(MODES), value="pair (2D / 3D)", label="mode"
        )
        self._fixed = create_widget(
            name="fixed", annotation=napari.layers.Image, label="fixed", options={"nullable": True}
        )
        self._moving = create_widget(name="moving", annotation=napari.layers.Image, label="moving")
        self._reference = ComboBox(
            name="reference", choices=list(REFERENCES), value="first", label="reference"
        )
        self._model = ComboBox(name="model", choices=list(MODELS), value="affine", label="model")
        self._metric = ComboBox(
            name="metric", choices=["auto", *METRICS], value="auto", label="metric"
        )
        # Whole numbers in Qt's own spin box (magicgui's SpinBox is superqt's, which shows
        # no special value text): 0 reads "auto" / "default" in the box itself.
        self._levels = FloatSpinBox(
            name="levels", value=0, min=0, max=8, step=1, label="pyramid levels"
        )
        self._level = SpinBox(name="level", value=0, min=0, max=0, label="level (multiscale)")
        self._level.visible = False
        self._iterations = FloatSpinBox(
            name="iterations", value=0, min=0, max=10000, step=1, label="iterations / level"
        )
        self._gradient = CheckBox(value=True, text="show similarity gradient")
        # Landmarks: point i of one layer matches point i of the other (world coordinates).
        self._fixed_points = create_widget(
            name="fixed_points",
            annotation=napari.layers.Points,
            label="fixed points",
            options={"nullable": True},
        )
        self._moving_points = create_widget(
            name="moving_points",
            annotation=napari.layers.Points,
            label="moving points",
            options={"nullable": True},
        )
        self._landmark_weight = FloatSpinBox(
            name="landmark_weight",
            value=0.0,
            min=0.0,
            max=1e6,
            step=0.01,
            label="landmark weight",
        )
        # 0 shown as what it means, in the box (the labels said it: a dock 660 px wide)
        for box, text in (
            (self._levels, "auto"),
            (self._iterations, "default"),
            (self._landmark_weight, "0 (start only)"),
        ):
            box.native.setSpecialValueText(text)
        for box in (self._levels, self._iterations):
            box.native.setDecimals(0)
        for chooser in (self._fixed_points, self._moving_points):
            chooser.value = None  # no landmarks unless asked for
        # The run's progress in the widget, not napari's progress bar: napari's first bar of
        # a session took 150-400 ms of the GUI thread to make (its activity dialog, at the
        # run's start) and each of its moves ran a nested turn of the event loop (issue 27).
        self._bar = ProgressBar(value=0, min=0, max=1, label="progress")
        self._run_btn = PushButton(text="Register")
        self._cancel_btn = PushButton(text="Cancel", enabled=False)
        self._save_btn = PushButton(text="Save transform…", enabled=False)
        # Only layers a transform can resample: images and labels (not points, vectors...).
        self._apply_to = ComboBox(
            name="apply_to", choices=self._resamplable, label="apply to", nullable=True
        )
        self._apply_btn = PushButton(text="Apply transform to layer", enabled=False)
        self._affine_btn = PushButton(text="Show as moving's affine", enabled=False)
        self._affine_btn.tooltip = (
            "Align the moving layer on screen through its affine (no resampling)"
        )
        self.extend(
            [
                self._mode,
                self._fixed,
                self._moving,
                self._level,
                self._reference,
                self._model,
                self._metric,
                self._levels,
                self._iterations,
                self._fixed_points,
                self._moving_points,
                self._landmark_weight,
                self._device,
                self._gradient,
                self._run_btn,
                self._cancel_btn,
                self._status,
                self._bar,
                self._backend,
                self._torch_meanwhile,
            ]
        )
        self._plot = LossPlot()
        self._show_empty_plot()
        self.native.layout().addWidget(self._plot)
        self.extend([self._save_btn, self._apply_to, self._apply_btn, self._affine_btn])

        self._mode.changed.connect(self._update_visibility)
        self._mode.changed.connect(self._show_empty_plot)
        self._metric.changed.connect(self._show_empty_plot)
        self._fixed.changed.connect(self._on_layers)
        self._moving.changed.connect(self._on_layers)
        self._geometry: dict = {}  # scale and translate of the results (the fixed grid's)
        self._run_btn.changed.connect(self.run)
        self._cancel_btn.changed.connect(self.cancel)
        self._save_btn.changed.connect(self._ask_save)
        self._apply_btn.changed.connect(lambda *_: self.apply_to_layer(self._apply_to.value))
        self._affine_btn.changed.connect(self.show_affine)
        self._run = None
        self._moving_layer = self._fixed_layer = None
        self.snapshots_shown = 0  # displays (several snapshots may merge into one)
        self.snapshots_received = 0  # snapshots from the worker
        self._styled: set[str] = set()
        self._buffers: dict[str, np.ndarray] = {}
        self._reveal: set[str] = set()
        self._frozen = None  # the window not repainted while result layers are added
        self._moving_hidden = False
        self._waiting = None  # the newest snapshot not yet displayed (merged)
        self._last_vectors = -np.inf
        self._display_timer = QTimer()
        self._display_timer.setSingleShot(True)
        self._display_ms = DISPLAY_MS  # paced by _on_lag_tick, given at each start
        self._display_timer.setInterval(DISPLAY_MS)
        self._display_timer.timeout.connect(self._display_waiting)
        # How late a ticking timer fires: what the GUI thread spends on each turn of the
        # event loop (displays, repaints), which spaces the displays (DISPLAY_SHARE).
        self._lag_timer = QTimer()
        self._lag_timer.setInterval(LAG_TICK_MS)
        self._lag_timer.timeout.connect(self._on_lag_tick)
        self._lag_last, self._lag_peak = 0.0, 0.0
        # display steps to run, by what they update: a newer display's step for a layer
        # replaces one still waiting (its data is older), so the queue stays short
        self._steps: dict = {}
        self._step_timer = QTimer()
        self._step_timer.setSingleShot(True)
        self._step_timer.setInterval(0)
        self._step_timer.timeout.connect(self._next_step)
        # Drift correction shows live the frame the viewer is on: follow the slider.
        napari_viewer.dims.events.current_step.connect(self._on_step)
        self.watch_destroyed(_stop_run)
        self.compact()
        self._update_visibility()
        self._on_layers()
        self._backend.refresh()
        # What a first run would do on the GUI thread or in its worker, done now in the
        # background (_warm_up_in_background): a first click waits for none of it (issue 27).
        _warm_up_in_background()
        # A full collection now, as the widget opens: CPython runs one when enough objects
        # have outlived two collections since the last, and the first run's new layers (Qt
        # controls, vispy visuals, events) tipped it mid-run: 0.3-0.4 s with the GUI thread
        # (every thread: it holds the GIL) stopped, for the ~500k objects of a napari + torch
        # process. Collected now, it is not due again for a while.
        gc.collect()

    def _report(self, exc, what: str) -> None:
        """An error after the run: the whole message in the status line, and a toast."""
        self._status.value = f"{what} failed: {str(exc).strip() or type(exc).__name__}"
        notify_error(what, exc)

    def _resamplable(self, *_) -> list:
        return [
            (layer.name, layer)
            for layer in self._viewer.layers
            if isinstance(layer, (napari.layers.Image, napari.layers.Labels))
        ]

    # -- settings -----------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return MODES[self._mode.value]

    def reset_choices(self, *args):
        """napari calls this when the layers change (and once when the widget is docked):
        the layer choosers' lists follow, and a pair left unchosen becomes the first two
        image layers, fixed then moving (magicgui alone put the first one in *moving* and
        left *fixed* empty)."""
        super().reset_choices(*args)
        # never another widget's result (a "similarity map" added later became *moving*)
        images = [
            layer
            for layer in self._moving.choices
            if layer is not None and not is_result(layer.name)
        ]
        if self.mode == "pair" and self._fixed.value is None and len(images) >= 2:
            self._fixed.value = images[0]
            if self._moving.value is images[0]:
                self._moving.value = images[1]

    def _show_empty_plot(self, *_):
        """Before a first run (or a mode or metric change since): the axes the next run
        will draw, titled, with no points."""
        if getattr(self, "_run", None) is None or not self._plot.curve.x:
            self._plot.set_curve(empty_curve(self.mode, self._metric.value))

    def _update_visibility(self, *_):
        stack = self.mode == "stack"
        self._fixed.visible = not stack
        self._reference.visible = stack
        self._gradient.visible = not stack
        for control in (self._fixed_points, self._moving_points, self._landmark_weight):
            control.visible = not stack
        if stack:  # drift correction: translation (phase correlation + Gauss-Newton)
            self._model.value = "translation"
        self._on_layers()

    def settings(self) -> RunSettings:
        return RunSettings(
            mode=self.mode,
            model=self._model.value,
            metric=self._metric.value,
            levels=int(self._levels.value) or "auto",
            iterations=int(self._iterations.value) or None,
            device=self._device.value,
            reference=self._reference.value,
            show_gradient=bool(self._gradient.value),
            landmark_weight=float(self._landmark_weight.value),
            min_interval=0.2,
            vectors_interval=VECTORS_MS / 1000,
            yield_interval=DISPLAY_MS / 1000,
            live_after=LIVE_AFTER_MS / 1000,
        )

    def landmarks(self):
        """``(fixed_points, moving_points)`` in world coordinates from the two Points
        layers, or None when neither is chosen (one without the other is an error)."""
        return landmarks_from_layers(self._fixed_points.value, self._moving_points.value)

    # -- running ------------------------------------------------------------------------
    def run(self, *_):
        if self._closed or self.busy:
            return
        if not after_kernel_build(self, self.run, self._device.value):
            return  # the kernels build first (a visible step), then the run starts
        moving = self._moving.value
        try:
            fixed_data = fixed_grid = moving_grid = landmarks = None
            if self.mode == "pair" and moving is not None and moving is self._fixed.value:
                raise ValueError(
                    f"fixed and moving are the same layer ({moving.name!r}): choose two "
                    "layers, or the time-lapse mode to align the frames of one"
                )
            if self.mode == "pair":
                fixed_plane, moving_plane = self._pair_planes(self._fixed.value, moving)
                fixed_data = _in_memory(fixed_plane)
                moving_data = _in_memory(moving_plane)
                # Layers aligned on screen must stay aligned: register in their world space
                # (a multiscale level's pixels are its factors wide).
                fixed_grid = _plane_grid(self._fixed.value, fixed_plane, "fixed")
                moving_grid = _plane_grid(moving, moving_plane, "moving")
                landmarks = self.landmarks()
                self._geometry = plane_geometry(self._fixed.value, fixed_plane.source)
            else:  # the frames' grid: the stack layer's, time left out
                moving_data = layer_image(moving, "moving")
                moving_grid = layer_grid(moving, "moving", skip=1)
                self._geometry = {"scale": moving.scale, "translate": moving.translate}
            run = RegistrationRun(
                fixed_data,
                moving_data,
                self.settings(),
                fixed_grid=fixed_grid,
                moving_grid=moving_grid,
                landmarks=landmarks,
            )
        except (ValueError, TypeError, MemoryError) as exc:
            self._on_error(exc)  # the status line says why, not a stale message
            return
        self._run, self._moving_layer = run, moving
        self._rgb_note = luminance_note(
            [("fixed", self._fixed.value if self.mode == "pair" else None), ("moving", moving)]
        )
        if self._rgb_note:
            notify_info(self._rgb_note)
        self._on_step()  # the frame on screen is the one the live display warps
        self._fixed_layer = self._fixed.value if self.mode == "pair" else moving
        if not (self.mode == "pair" and run.settings.show_gradient):
            # This run draws no gradient field: drop an earlier run's, which would look current.
            remove_layer(self._viewer, GRADIENT_LAYER)
        self.snapshots_shown = self.snapshots_received = 0
        self._styled = set()  # result layers whose properties this run has set
        self._buffers = {}  # result layer name -> the array this run gave it, refilled
        self._reveal = set()  # placeholders added hidden, shown with their first data
        self._moving_hidden = False  # hidden at the first registered image shown
        self._waiting, self._last_vectors = None, -np.inf
        self._plot.set_curve(empty_curve(self.mode, self._metric.value))
        # the progress bar, advanced by the steps each snapshot covers (snapshots are
        # merged in the worker, so one yield may stand for several steps); a drift run's
        # steps are frames (of every pass), the last of them the final snapshot; a pair
        # run's final snapshot is a step of its own
        if self.mode == "stack":
            passes = f" ({run.passes} passes)" if run.passes > 1 else ""
            self._bar.native.setFormat(f"%v/%m frames{passes}")
            self._bar.max = run.expected_steps()
        else:
            self._bar.native.setFormat("%p%")
            self._bar.max = run.expected_steps() + 1
        self._set_bar(0)
        worker = create_worker(_snapshots, run, _ignore_errors=True)
        worker.yielded.connect(self._receive)
        worker.errored.connect(self._on_error)
        worker.finished.connect(self._on_finished)
        self._set_running(True)
        self._display_ms = DISPLAY_MS
        self._status.value = f"registering ({run.settings.model}, {run.run_levels} levels)…"

        def start():
            self._thaw_window()
            self._worker = worker
            start_worker(worker, stop=run.abort)
            # the displays' pacing from now on (not the layers' additions before)
            self._lag_last, self._lag_peak = time.perf_counter(), 0.0
            self._lag_timer.start()

        # The result layers a session does not have yet are added first, one per turn of
        # the event loop, and the worker started after them: napari's add_image and
        # add_vectors (its Qt controls, vispy visual, layer-list events) are its costliest
        # GUI-thread steps, and under a running worker they waited on the GIL too (issue
        # 27, a shown viewer under load 8: started together, the first add took 0.9-1.0 s
        # instead of 0.3-0.4 s and the run's worker 3.1-3.3 s instead of 1.3-1.9 s).
        # The window is not repainted until they are all added (they start hidden: a
        # repaint between two showed nothing new, and each cost 30-90 ms with software
        # OpenGL, more than an addition).
        placeholders = self._placeholders(run)
        if placeholders:
            self._freeze_window()
        self._queue([*placeholders, ("start", start)])

    def _freeze_window(self) -> None:
        """Stop repainting this widget's window (the viewer's, when docked) until
        :meth:`_thaw_window`."""
        window = self.native.window()
        if window is not None and window.updatesEnabled():
            window.setUpdatesEnabled(False)
            # weakly: a reference kept here kept a closed viewer's window (and this
            # widget) from being destroyed when napari let go of it
            self._frozen = weakref.ref(window)

    def _thaw_window(self) -> None:
        """Repaint the window :meth:`_freeze_window` froze (one repaint for all that
        changed meanwhile)."""
        ref, self._frozen = self._frozen, None
        window = None if ref is None else ref()
        if window is not None:
            with contextlib.suppress(RuntimeError):  # the window was closed meanwhile
                window.setUpdatesEnabled(True)

    def _pair_planes(self, fixed, moving):
        """The fixed and moving :class:`~..widgets_logic.planes.Plane` s of a pair run:
        the layers' last 2 or 3 axes (a layer of more axes: the volume the viewer is on),
        a multiscale layer at the chosen level. Nothing is read."""
        if fixed is None:
            raise ValueError("choose a fixed layer (or the time-lapse mode for a stack)")
        if moving is None:
            raise ValueError("choose a moving layer")
        if fixed.ndim != moving.ndim:
            raise ValueError(
                f"fixed and moving must have the same dimensionality, got {fixed.ndim}-D "
                f"{fixed.name!r} and {moving.ndim}-D {moving.name!r}"
            )
        mode = mode_for(max(2, min(fixed.ndim, 3)))
        planes = []
        for layer, role in ((fixed, "fixed"), (moving, "moving")):
            level = None
            if getattr(layer, "multiscale", False):
                level = min(int(self._level.value), len(layer.data) - 1)
            planes.append(
                plane_at(
                    layer.data,
                    layer.world_to_data(self._viewer.dims.point),
                    rgb=bool(getattr(layer, "rgb", False)),
                    mode=mode,
                    level=level,
                    name=f"the {role} layer {layer.name!r}",
                )
            )
        return planes

    def _on_layers(self, *_):
        """A level choice when the fixed or moving layer is multiscale."""
        layers = [lay for lay in (self._fixed.value, self._moving.value) if lay is not None]
        multiscale = [lay for lay in layers if getattr(lay, "multiscale", False)]
        self._level.visible = bool(multiscale) and self.mode == "pair"
        if multiscale:
            level_choice(multiscale[0], self._level, min(3, multiscale[0].ndim))

    def _on_step(self, *_):
        """The viewer moved: in time-lapse mode, the live display warps that frame next."""
        run, layer = self._run, self._moving_layer
        if self._closed or run is None or run.settings.mode != "stack" or layer is None:
            return
        with contextlib.suppress(ValueError, IndexError):  # a layer out of the dims
            run.focus = int(np.round(layer.world_to_data(self._viewer.dims.point)[0]))

    def cancel(self, *_):
        """Stop the run within one iteration; the best result so far is kept."""
        if self._run is not None:
            self._run.stop()
            self._status.value = "cancelling…"

    def _set_running(self, running: bool):
        self._run_btn.enabled = not running
        self._cancel_btn.enabled = running
        done = not running and self._run is not None and self._run.result is not None
        self._save_btn.enabled = done
        self._apply_btn.enabled = done
        linear = (
            done and hasattr(self._run.transforms[0], "matrix") and len(self._run.transforms) == 1
        )
        self._affine_btn.enabled = linear

    def _put(self, kind: str, name: str, data, final: bool = False, **props) -> list:
        """The display steps that show ``data`` in the result layer ``name``.

        Its properties (geometry, colours, widths) are set on the run's first snapshot
        only; later snapshots assign only the data (re-setting scale, edge width...
        redrew the layer each time). A Vectors layer is made with one arrow and its style,
        and given its arrows in a second step: napari draws its thumbnail (a Python loop
        per arrow) at each of the construction's refreshes.

        During the run, data of the shape the layer holds is copied into the array this
        run gave the layer and only the canvas is refreshed (:func:`redraw_in_place`: no
        thumbnail, no extent, no layer-list events); the ``final`` snapshot's data is
        assigned (the layer then holds the result's own array, thumbnail updated).
        """
        layer = layer_by_name(self._viewer, name)
        if name in self._styled and same_kind(layer, kind, data):

            def assign():
                own = self._buffers.pop(name, None)
                live = not final and isinstance(data, np.ndarray)  # not a lazy stack
                if live and own is not None and layer.data is own and redraw_in_place(layer, data):
                    self._buffers[name] = own
                    return
                layer.data = data.copy() if live else data
                if live and isinstance(layer.data, np.ndarray):
                    self._buffers[name] = layer.data  # a copy: the next snapshots fill it
                self._show_placeholder(layer)

            return [(f"data {name}", assign)]
        self._styled.add(name)
        if kind == "vectors" and len(self._run.shape) == 3:
            # Arrows over a volume hide it: opt in. Not the (t, y, x) arrows of a 2-D
            # time-lapse (also 3 coordinates): they sit on the plane shown.
            props.setdefault("visible", False)
        new = not same_kind(layer, kind, data)
        # One arrow first (not none: napari keeps the colour given for the arrows to come
        # only when there is one to colour).
        first = data[:1] if kind == "vectors" and new and len(data) > 1 else data

        def add():
            added = put_layer(self._viewer, kind, name, first, **props)
            layers = self._viewer.layers
            above = list(layers)[layers.index(added) + 1 :]
            # Results stay on top: moved only above a layer that is not a result (a move
            # re-emits the layer list's events, 10-15 ms; results swapping places at each
            # run cost three per run).
            if any(layer.name not in self._result_names() for layer in above):
                layers.move(layers.index(added), len(layers))

        def fill():
            layer = layer_by_name(self._viewer, name)
            layer.data = data
            self._show_placeholder(layer)

        steps = [(f"add {name}", add)]
        return [*steps, (f"data {name}", fill)] if first is not data else steps

    def _warped_style(self) -> dict:
        """The registered image's properties: the result geometry, a colour that contrasts
        with the fixed layer's, the moving layer's contrast limits (none computed on data)."""
        moving, fixed = self._moving_layer, self._fixed_layer
        limits = tuple(moving.contrast_limits) if moving is not None else None
        if self.mode == "stack" and moving is not None:
            # A drift-corrected movie replaces the movie on screen: in its own colours (a
            # grey movie came back magenta, issue 27) and blending.
            return {
                **self._geometry,
                "colormap": moving.colormap.name,
                "blending": moving.blending,
                **({"contrast_limits": limits} if limits else {}),
            }
        return {
            **self._geometry,
            "colormap": _contrasting(fixed),
            "blending": "additive",
            **({"contrast_limits": limits} if limits else {}),
        }

    def _placeholders(self, run) -> list:
        """The steps adding the result layers ``run`` will show and the viewer has not
        got (of that kind) yet, styled, from blank data of the right shape: a zero image
        that takes no memory (a broadcast view), a Vectors layer of one still arrow. The
        snapshots then only assign data."""
        name = self._warped_name()
        shape = tuple(run.shape) if run.settings.mode == "pair" else tuple(run.moving.shape)
        d = len(shape)  # the arrows' dimension: a stack's have time first
        layers = [("image", name, np.broadcast_to(np.float32(0), shape), self._warped_style())]
        vectors = [DISPLACEMENT_LAYER, *([GRADIENT_LAYER] if run.shows_gradient else [])]
        for vector_name in vectors:
            still = np.zeros((1, 2, d), np.float32)
            style = {**VECTOR_STYLES[vector_name], **self._vector_geometry(still)}
            layers.append(("vectors", vector_name, still, style))
        steps = []
        volume = len(run.shape) == 3
        for kind, layer_name, data, style in layers:
            if not same_kind(layer_by_name(self._viewer, layer_name), kind, data):
                # Hidden until its first data: a layer's first draw (its visual's shaders
                # compiled, its texture made) then comes with the first snapshot, while the
                # worker computes, not before the worker starts (the additions are, see
                # run). A blank layer had nothing to show anyway.
                if not (kind == "vectors" and volume):  # arrows over a volume: opt in
                    self._reveal.add(layer_name)
                steps += self._put(kind, layer_name, data, **style, visible=False)
        return steps

    def _show_placeholder(self, layer) -> None:
        """Show ``layer`` if it is a placeholder this run added hidden (once: a user who
        hides it afterwards keeps it hidden)."""
        if layer is not None and layer.name in self._reveal:
            self._reveal.discard(layer.name)
            if not layer.visible:  # a set, even to the same value, refreshes the layer
                layer.visible = True

    def _warped_name(self) -> str:
        """The registered image layer's name (after the run's moving layer)."""
        moving = self._moving_layer
        return WARPED_LAYER.format(moving=moving.name if moving is not None else "moving")

    def _result_names(self) -> set[str]:
        """The names of the layers this widget's runs fill."""
        return {self._warped_name(), DISPLACEMENT_LAYER, GRADIENT_LAYER}

    def _vector_geometry(self, vectors) -> dict:
        """The result geometry for Vectors data ``(n, 2, D)`` (its last D axes)."""
        d = vectors.shape[-1]
        return {key: np.asarray(value)[-d:] for key, value in self._geometry.items()}

    def _receive(self, snap):
        """A snapshot from the worker: kept (merged with any not yet shown) and shown by
        the display timer, at most every :data:`DISPLAY_MS`; the final one at once."""
        if self._closed or self._run is None:
            return
        self.snapshots_received += 1
        self._waiting = snap.merged_into(self._waiting)
        if snap.final:
            if self._reveal:
                # This run's placeholders get their first data now: their first draws and
                # thumbnails make the display's batches outlast one turn of the event loop,
                # and a repaint between two (40-80 ms each with software OpenGL) showed a
                # result half drawn. One repaint, at the result (_report_result).
                self._freeze_window()
            self._display_waiting()
        elif not self._display_timer.isActive():
            self._display_timer.start(self._display_ms)

    def _display_waiting(self):
        """Queue the display of the waiting snapshot (its steps replace those of an earlier
        display not yet drawn)."""
        if self._closed or self._waiting is None:
            return
        snap, self._waiting = self._waiting, None
        self._display_timer.stop()
        self._queue(self._show(snap))

    def _queue(self, steps) -> None:
        """Run ``steps`` (``(key, callable)``) after those queued, in batches (see
        :meth:`_next_step`); a step under a key already queued takes its place. The GUI
        thread is held for one batch at a time, never for a whole display."""
        for key, step in steps:
            self._steps[key] = step
        if self._steps and not self._step_timer.isActive():
            self._step_timer.start()

    def _next_step(self):
        """Run queued steps until :data:`STEP_MS` have passed (then the event loop turns:
        the canvas repaints once per batch, not once per step)."""
        if self._closed or not self._steps:
            return
        deadline = time.perf_counter() + STEP_MS / 1000
        try:
            while self._steps and not self._closed:
                self._steps.pop(next(iter(self._steps)))()
                if time.perf_counter() >= deadline:
                    break
        finally:
            if self._steps and not self._closed:
                self._step_timer.start()

    def _show(self, snap) -> list:
        """The display steps of one snapshot: the loss curve and status, the registered
        image, each Vectors layer."""
        if self._closed or self._run is None:
            return []
        now = time.perf_counter()
        has_vectors = snap.displacement is not None or snap.gradient is not None
        if has_vectors and not snap.final and now - self._last_vectors < VECTORS_MS / 1000:
            # Not yet: the arrows wait (newer snapshots merge into them) for a later display.
            self._waiting = replace(snap, warped=None).merged_into(self._waiting)
            snap = replace(snap, displacement=None, gradient=None)
            self._display_timer.start(self._display_ms)
        elif has_vectors:
            self._last_vectors = now
        self.snapshots_shown += 1

        def curve():
            self._plot.set_curve(snap.curve)
            self._status.value = snap.describe()
            self._set_bar(snap.step)

        steps = [("curve", curve)]
        moving, fixed = self._moving_layer, self._fixed_layer
        name = self._warped_name()
        if snap.warped is not None:
            if not self._moving_hidden and moving is not None and moving is not fixed:
                self._moving_hidden = True

                def hide_moving():
                    if moving.visible:  # a set, even to the same value, refreshes the layer
                        moving.visible = False  # the registered layer replaces it on screen

                steps.append(("hide moving", hide_moving))
            steps += self._put("image", name, snap.warped, final=snap.final, **self._warped_style())
        if snap.displacement is not None:
            # Display length: the longest arrow spans about one grid cell (data unscaled);
            # re-set only when it changes by more than half (a property set redraws).
            norms = (
                np.linalg.norm(snap.displacement[:, 1], axis=1)
                if len(snap.displacement)
                else np.zeros(1)
            )
            top = float(norms.max()) if norms.size else 0.0
            length = min(max(0.9 * self._run.spacing / top, 1.0), 20.0) if top > 0 else 1.0

            def relength():
                layer = layer_by_name(self._viewer, DISPLACEMENT_LAYER)
                if layer is not None and not 2 / 3 <= layer.length / length <= 1.5:
                    layer.length = length

            # Before the arrows are assigned: a length set redraws the layer and its
            # thumbnail (a Python loop per arrow), cheap on a placeholder's one arrow.
            steps.append(("arrow length", relength))
            steps += self._put(
                "vectors",
                DISPLACEMENT_LAYER,
                snap.displacement,
                final=snap.final,
                **self._vector_geometry(snap.displacement),
                **VECTOR_STYLES[DISPLACEMENT_LAYER],
                length=length,
            )
        if snap.gradient is not None:
            steps += self._put(
                "vectors",
                GRADIENT_LAYER,
                snap.gradient,
                final=snap.final,
                **self._vector_geometry(snap.gradient),
                **VECTOR_STYLES[GRADIENT_LAYER],
            )
        return steps

    def _on_finished(self):
        super()._on_finished()
        if not self._closed:
            self._queue([("result", self._report_result)])  # after the final display

    @property
    def busy(self) -> bool:
        """Whether a run is under way or its last display not yet drawn."""
        return self._worker is not None or bool(self._steps)

    def _set_bar(self, value: int) -> None:
        """Move the progress bar to ``value`` (at most its maximum), painted with the next
        repaint of the window: ``QProgressBar.setValue`` repaints at once, and each repaint
        of a widget composes the whole window (with the OpenGL canvas: 10-14 ms of GUI
        thread under software OpenGL, measured with cProfile), outside the display's
        batch."""
        bar = self._bar.native
        value = min(int(value), self._bar.max)
        if value != bar.value():
            bar.setUpdatesEnabled(False)
            try:
                bar.setValue(value)
            finally:
                bar.setUpdatesEnabled(True)  # schedules a paint (update), not a repaint

    def _on_lag_tick(self):
        """Space the live displays after the GUI thread's recent busy time: the timer's
        lateness, its peak decaying by a fifth per tick."""
        now = time.perf_counter()
        late = max(0.0, now - self._lag_last - LAG_TICK_MS / 1000)
        self._lag_last = now
        self._lag_peak = max(late, 0.8 * self._lag_peak)
        ms = int(min(max(DISPLAY_MS, 1000 * self._lag_peak / DISPLAY_SHARE), MAX_DISPLAY_MS))
        # given at the timer's next start: setInterval restarts an active timer, and
        # a tick every 50 ms kept the display from ever firing
        self._display_ms = ms

    def _report_result(self):
        self._thaw_window()
        self._lag_timer.stop()
        self._set_running(False)
        if self._run is not None and self._run.result is not None:
            res = self._run.result
            word = "stopped early" if res.stopped else "done"
            label = MEASURES[res.similarity_measure].label
            if self._run.settings.mode == "pair":
                status = (
                    f"{word} in {res.seconds:.1f} s on {res.device}; similarity "
                    f"({label}) {res.initial_similarity:.3f} → {res.similarity:.3f}"
                )
            else:
                status = (
                    f"{word}: {self._run.frame_total} frames aligned in {res.seconds:.1f} s "
                    f"on {res.device}; lowest frame similarity ({label}) {res.similarity:.3f}"
                )
            self._set_bar(self._bar.max)
            if getattr(self, "_rgb_note", ""):
                status += f"; {self._rgb_note}"
            if res.warnings:
                status += f"; ⚠ {len(res.warnings)} warning(s)"
                for message in res.warnings:
                    notify_warning(f"registration: {message}")
            self._status.value = status

    @property
    def result(self):
        return None if self._run is None else self._run.result

    # -- after the run --------------------------------------------------------------------
    def save_transform(self, path) -> list:
        """Save the transform(s): ``path`` for a pair, ``path_<t>.npz`` per frame and, for
        a drift run whose transforms are shifts (linear models: their translation), the
        shift table ``path_shifts.csv`` beside them (frame, shift per axis in pixels and
        in the layer's units: :mod:`~..widgets_logic.shift_table`)."""
        import pathlib

        from ..widgets_logic.shift_table import write_shift_table

        ts = self._run.transforms if self._run is not None else []
        if not ts:
            raise ValueError("run a registration first")
        path = pathlib.Path(path)
        if self._run.settings.mode == "pair":
            return [ts[0].save(path)]
        stem = path.with_suffix("")
        saved = [t.save(f"{stem}_{i:04d}.npz") for i, t in enumerate(ts)]
        if all(hasattr(t, "translation") for t in ts):
            d = len(self._run.shape)
            spacing = np.asarray(self._geometry.get("scale", np.ones(d + 1)))[-d:]
            table = write_shift_table(
                f"{stem}_shifts.csv", self._run.result.shifts, spacing, self._unit(d)
            )
            saved.append(table)
        return saved

    def _unit(self, d: int) -> str:
        """The physical unit of the moving layer's last ``d`` axes, for the shift table's
        columns ("world" when napari knows none but pixels, or they differ)."""
        units = getattr(self._moving_layer, "units", None)
        try:
            names = {str(u) for u in tuple(units)[-d:]}
        except TypeError:
            return "world"
        name = names.pop() if len(names) == 1 else "pixel"
        return "world" if name in ("pixel", "") else name.replace(" ", "_")

    def _ask_save(self, *_):
        from qtpy.QtWidgets import QFileDialog

        path, _ = QFileDialog.getSaveFileName(
            self.native, "Save transform", "transform.npz", "Transforms (*.npz)"
        )
        if path:
            try:
                saved = self.save_transform(path)
                tables = [p for p in saved if str(p).endswith(".csv")]
                table = f" and the shift table {tables[0].name}" if tables else ""
                count = len(saved) - len(tables)
                notify_info(f"saved {count} transform file(s){table} to {saved[0].parent}")
            except (OSError, ValueError) as exc:
                self._report(exc, "saving the transform")

    def apply_to_layer(self, layer):
        """Resample ``layer`` with the result into ``"<name> registered"`` (labels: nearest)."""
        try:
            if layer is None:
                raise ValueError("choose a layer to apply the transform to")
            ts = self._run.transforms if self._run is not None else []
            if not ts:
                raise ValueError("run a registration first")
            if getattr(layer, "rgb", False):
                raise ValueError(
                    f"{layer.name!r} is an RGB layer: split its channels first "
                    "(Layers › Split RGB) and apply the transform to each"
                )
            labels = isinstance(layer, napari.layers.Labels)
            fixed = self._fixed_layer if self._run.settings.mode == "pair" else None
            if fixed is not None:  # the layer may sit on another grid than the moving one
                skip = max(0, layer.ndim - ts[0].ndim)  # leading channel axes
                ts = [for_moving_grid(ts[0], layer_grid(layer, "apply-to", skip=skip))]
            shape = tuple(self._run.shape) if fixed is not None else None
            out = apply_transforms(ts, layer.data, labels=labels, output_shape=shape)
        except (ValueError, TypeError, RuntimeError) as exc:
            self._report(exc, "applying the transform")
            return None
        kind = "labels" if labels else "image"
        return put_layer(
            self._viewer,
            kind,
            WARPED_LAYER.format(moving=layer.name),
            out,
            like=fixed if fixed is not None else layer,
        )

    def show_affine(self, *_):
        """Show the moving layer aligned through its ``affine`` (no resampling)."""
        try:
            ts = self._run.transforms if self._run is not None else []
            if len(ts) != 1:
                raise ValueError("run a pair registration with a linear model first")
            layer = self._moving_layer
            if layer is None or layer not in self._viewer.layers:
                raise ValueError("the moving layer is gone")
            fixed_grid, moving_grid = ts[0].grids()
            layer.affine = layer_affine(
                ts[0],
                (fixed_grid.spacing, fixed_grid.origin),
                (moving_grid.spacing, moving_grid.origin),
            )
        except ValueError as exc:
            self._report(exc, "showing the affine")


def _in_memory(plane):
    """A pair's plane read now when it is in memory (a view: errors in its values are
    reported before the run), else the plane itself, read in the worker."""
    return plane if plane.source.lazy else plane.read()


def _plane_grid(layer, plane, role: str):
    """Where a plane's pixels are: the layer's scale and translate over its spatial axes,
    the scale times a multiscale level's factors."""
    d = plane.source.d
    grid = layer_grid(layer, role, skip=layer.ndim - d)
    factors = tuple(float(f) for f in plane.source.factors[-d:])
    if all(f == 1 for f in factors):
        return grid
    return Grid.make(d, np.multiply(grid.spacing, factors), grid.origin, name=role)


def _snapshots(run):
    """The run's snapshots, in the worker thread."""
    yield from run.snapshots()


#: what a first run imports (measured; tests/_qt/test_register.py runs each kind of run
#: after these and finds nothing more imported): imported as the widget opens, in a
#: thread. The engine's modules and its solvers (the first run imported them on the GUI
#: thread, part of a 335 ms pause at its start from the Plugins menu); pandas (napari's
#: first Vectors layer imports it on the GUI thread, 0.25 s at load 8); torch's symbolic
#: shapes, with sympy (the first ``Tensor.backward(gradient)`` imports them: 0.3 s of a
#: first deformable run's 0.9 s, one thread, no load); dask.array (the live drift display's
#: stack)
WARM_IMPORTS = (
    "napari_simwarp.registration.pair",
    "napari_simwarp.registration.stack",
    "napari_simwarp.registration.solvers",
    "napari_simwarp.io.transform_files",
    "pandas",
    "torch.fx.experimental.symbolic_shapes",
    "dask.array",
)


def _warm_up_in_background():
    """Import :data:`WARM_IMPORTS` in one daemon thread, one after the other (imports of
    one package from several threads at once can deadlock on their import locks). An
    import that fails leaves the run to do it and report its error. An import the GUI
    thread or a worker then needs waits only for what is left of it. (The engine's solvers
    make no ``torch.optim`` optimizer on the CPU or CUDA, whose first one imports
    ``torch._dynamo``, 1-2 s holding the GIL: tests/registration/test_first_run.py.)"""
    import importlib

    def warm():
        for module in WARM_IMPORTS:
            with contextlib.suppress(Exception):
                importlib.import_module(module)

    return run_in_background(warm, "napari-simwarp warm-up")


def _contrasting(fixed) -> str:
    """The registered layer's colormap: magenta over a gray or green fixed layer, green
    over a magenta or red one (two layers in one colour cannot be told apart)."""
    name = getattr(getattr(fixed, "colormap", None), "name", "gray")
    return "green" if name in ("magenta", "red", "bop orange") else "magenta"


def _stop_run(widget) -> None:
    """Abort the registration loop itself (its generator), not only the worker thread, and
    the display timer (snapshots still queued are then dropped by ``_closed``)."""
    widget._waiting = None
    widget._steps.clear()
    widget._thaw_window()  # a run stopped before its worker started leaves none frozen
    with contextlib.suppress(Exception):  # the viewer may outlive the widget
        widget._viewer.dims.events.current_step.disconnect(widget._on_step)
    with contextlib.suppress(RuntimeError):  # already deleted with the widget
        widget._display_timer.stop()
        widget._lag_timer.stop()
        widget._step_timer.stop()
    if widget._run is not None:
        widget._run.abort()  # no result wanted: end at the next progress report
