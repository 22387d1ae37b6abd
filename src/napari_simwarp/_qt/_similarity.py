"""The "Similarity map" widget: a live, debounced map of one or two image layers.

The live map is of the plane the viewer is on ("2D per plane": a time-lapse's frame, a
volume's plane) or of the volume it is on ("3D volume"): a lazy or multiscale layer is read
one plane at a time, at the level the user picks. The map of every plane is an explicit
action ("Map whole stack"): a lazy layer computed plane by plane as the viewer shows it,
or an OME-Zarr store written block by block (then shown from the store).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import napari.layers
import numpy as np
from magicgui.widgets import (
    CheckBox,
    ComboBox,
    FloatSpinBox,
    LineEdit,
    PushButton,
    SpinBox,
    create_widget,
)
from napari.qt.threading import create_worker
from qtpy.QtCore import QTimer

from ..widgets_logic.planes import MODES, default_mode, plane_at
from ..widgets_logic.similarity import (
    METRICS,
    RESULT_LAYER,
    SimilarityModel,
    SimilarityParams,
    needs_second,
)
from ..widgets_logic.stack_maps import STACK_LAYER, stack_map, write_stack_map
from ._common import (
    WorkerWidget,
    added_unselected,
    after_kernel_build,
    keep_on_top,
    level_choice,
    notify_error,
    on_its_plane,
    put_layer,
    remove_layer,
    show_colorbar,
    start_worker,
    wait_for,
)

if TYPE_CHECKING:
    import napari

#: the wait before a change is computed: none beyond the current turn of the event loop
#: (events of one change coalesce). It was 150 ms, two thirds of a refresh at 1024² from
#: the Plugins menu (issue 27); a slider dragged while a map computes is coalesced
#: instead: one computation at a time, the latest change computed next.
DEBOUNCE_MS = 0


#: how long a map computes before the status says so (ms)
BUSY_NOTE_MS = 250

#: a new map's opacity: the image stays visible through it
MAP_OPACITY = 0.7


class SimilarityMapWidget(WorkerWidget):
    """Local std, local NCC, SSIM or ZNCC against a template, recomputed live.

    Changes of a parameter or of a layer's data restart a debounce timer; when it fires,
    the map is computed in a worker thread (at most one at a time: later requests wait
    and are coalesced, and results of superseded requests are dropped). The result goes
    to the ``"similarity map"`` layer, reused, with a colormap and contrast limits that
    suit the metric.
    """

    task = "similarity map"

    def __init__(self, napari_viewer: napari.viewer.Viewer):
        super().__init__()
        self._viewer = napari_viewer
        self._model = SimilarityModel()
        self._image = create_widget(name="image", annotation=napari.layers.Image, label="image")
        self._second = create_widget(
            name="second",
            annotation=napari.layers.Image,
            label="moving / template",
            options={"nullable": True},
        )
        self._metric = ComboBox(
            name="metric", choices=list(METRICS), value="local std", label="metric"
        )
        self._window = SpinBox(name="window", value=15, min=1, max=255, step=2, label="window (px)")
        self._sigma = FloatSpinBox(
            name="sigma", value=1.5, min=0.1, max=50.0, step=0.1, label="sigma (px)"
        )
        self._kernel = ComboBox(
            name="kernel", choices=["box", "gaussian"], value="box", label="NCC kernel"
        )
        self._mode = ComboBox(
            name="mode", choices=list(MODES), value="2D per plane", label="spatial axes"
        )
        self._level = SpinBox(name="level", value=0, min=0, max=0, label="level")
        self._level.visible = False
        self._live = CheckBox(name="live", label="", value=True, text="live update")
        self._compute = PushButton(text="Compute")
        self._stack_store = LineEdit(name="stack_store", value="", label="whole stack to")
        self._stack_store.native.setPlaceholderText("a lazy layer, or an OME-Zarr path (.zarr)")
        self._stack_button = PushButton(text="Map whole stack")
        self.extend(
            [
                self._image,
                self._second,
                self._mode,
                self._level,
                self._metric,
                self._window,
                self._sigma,
                self._kernel,
                self._device,
                self._live,
                self._compute,
                self._stack_store,
                self._stack_button,
                self._status,
                self._backend,
                self._torch_meanwhile,
            ]
        )

        self._timer = QTimer()
        self._timer.setSingleShot(True)
        self._timer.setInterval(DEBOUNCE_MS)
        self._timer.timeout.connect(self.compute)
        # "computing…" only for a computation still running after BUSY_NOTE_MS: each
        # change of the status text repaints the whole window, 40-60 ms under software
        # OpenGL (Xvfb, VNC), more than a 1024² local std map takes (issue 27); until then
        # the status names the map on screen (its metric, window and plane)
        self._busy_note = QTimer()
        self._busy_note.setSingleShot(True)
        self._busy_note.setInterval(BUSY_NOTE_MS)
        self._busy_note.timeout.connect(self._note_busy)
        self._busy_text = ""
        self._pending = False
        self._watched: list = []
        self._planes: tuple | None = None  # the planes of the map shown or computing
        self._limits_key = None  # what the map layer's contrast limits were set for
        self.results_shown = 0  # how many maps reached the layer (tests, benchmarks)

        for w in (self._metric, self._window, self._sigma, self._kernel, self._mode, self._level):
            w.changed.connect(self._on_param)
        self._device.changed.connect(self._on_device)
        self._image.changed.connect(self._on_layers)
        self._second.changed.connect(self._on_layers)
        self._compute.changed.connect(self.compute)
        self._stack_button.changed.connect(self.compute_stack)
        self._stack_worker = None
        dims = napari_viewer.dims.events
        dims.current_step.connect(self._on_step)
        dims.ndisplay.connect(self._on_ndisplay)
        self.watch_destroyed(_refresh_stopper(self._timer, dims, self._on_step, self._on_ndisplay))
        self.compact()
        self._update_visibility()
        self._on_layers()
        self._backend.refresh()

    # -- events --------------------------------------------------------------------------
    def _on_param(self, *_):
        self._update_visibility()
        self._schedule()

    def _on_device(self, *_):
        self._model.device = self._device.value
        self._model.clear_cache()
        self._schedule()

    def _on_layers(self, *_):
        for layer in self._watched:
            layer.events.data.disconnect(self._schedule)
        # Never watch our own result layer: each result written into it would schedule
        # the next computation, for ever.
        self._watched = [
            lay
            for lay in (self._image.value, self._second.value)
            if lay is not None and lay.name not in (RESULT_LAYER, STACK_LAYER)
        ]
        for layer in self._watched:
            layer.events.data.connect(self._schedule)
        self._adapt_to_layer()
        self._schedule()

    def _adapt_to_layer(self):
        """The mode and level choices that suit the chosen image layer (the user may change
        them): 3D only for a layer of 3 or more axes shown in 3D; a level for multiscale
        layers, the first whose plane holds at most 2048² pixels."""
        layer = self._image.value
        if layer is None:
            return
        with self._mode.changed.blocked():
            self._mode.value = default_mode(layer.ndim, self._viewer.dims.ndisplay)
        level_choice(layer, self._level, MODES[self._mode.value])

    def _on_ndisplay(self, *_):
        if not self._closed:
            self._adapt_to_layer()
            self._schedule()

    def _on_step(self, *_):
        """The viewer moved to another plane: recompute when the map's plane changed."""
        if self._closed or self._planes is None:
            return
        try:
            planes = self._current_planes(self.params())
        except (ValueError, TypeError):
            return  # compute() reports it
        if planes != self._planes:
            self._timer.start()

    def _update_visibility(self):
        metric = self._metric.value
        self._window.enabled = metric != "ZNCC (template)"
        self._sigma.enabled = metric == "SSIM" or (
            metric == "local NCC" and self._kernel.value == "gaussian"
        )
        self._kernel.enabled = metric == "local NCC"

    def _schedule(self, *_):
        """Restart the debounce timer (live mode only)."""
        if self._live.value and not self._closed:
            self._timer.start()

    # -- computing -----------------------------------------------------------------------
    def _current_planes(self, params) -> tuple:
        """The :class:`Plane` s the viewer is on, of the image and (when the metric needs
        it) of the second layer; nothing is read here."""
        point = self._viewer.dims.point
        planes = []
        layers = [("image", self._image.value)]
        if needs_second(params.metric):
            layers.append(("second", self._second.value))
        for name, layer in layers:
            if layer is None:
                raise ValueError(f"choose a {name} layer")
            planes.append(
                plane_at(
                    layer.data,
                    layer.world_to_data(point),
                    rgb=bool(getattr(layer, "rgb", False)),
                    mode=self._mode.value,
                    level=int(self._level.value) if getattr(layer, "multiscale", False) else None,
                    name=f"the {name} layer {layer.name!r}",
                )
            )
        return tuple(planes)

    def params(self) -> SimilarityParams:
        return SimilarityParams(
            metric=self._metric.value,
            window=int(self._window.value),
            sigma=float(self._sigma.value),
            kernel=self._kernel.value,
        )

    def compute(self, *_):
        """Start a computation now (or as soon as the running one ends)."""
        if self._closed:
            return
        self._timer.stop()
        image = self._image.value
        if image is None:
            self._status.value = "choose an image layer"
            return
        params = self.params()
        if not self._inputs_usable(image, params):
            return
        if self._worker is not None:
            self._model.new_request()  # whatever runs now is stale
            self._pending = True
            return
        if not after_kernel_build(self, self.compute, self._device.value):
            return  # the kernels build first (a visible step), then this runs again
        try:
            planes = self._current_planes(params)
        except (ValueError, TypeError) as exc:
            self._on_error(exc)
            return
        a, b = planes[0], (planes[1] if len(planes) > 1 else None)
        self._planes = planes
        request = self._model.new_request()
        self._busy_text = f"computing {params.metric}…"
        self._busy_note.start()
        worker = create_worker(self._model.compute, request, a, b, params, _ignore_errors=True)
        worker.returned.connect(self._show)
        worker.errored.connect(self._on_error)
        worker.finished.connect(self._on_finished)
        self._worker = worker
        start_worker(worker)

    def _inputs_usable(self, image, params) -> bool:
        """Whether the chosen layers can be mapped (else the status says why)."""
        second = self._second.value
        names = (image.name, getattr(second, "name", None))
        for result in (RESULT_LAYER, STACK_LAYER):
            if result in names:
                # The map would overwrite its own input (input layers are never modified).
                notify_error(
                    "similarity map",
                    ValueError(f"choose an input other than the {result!r} result layer"),
                )
                self._status.value = "the result layer cannot be an input"
                return False
        if needs_second(params.metric) and second is None:
            self._status.value = f"{params.metric} needs a second layer"
            return False
        return True

    def compute_stack(self, *_):
        """Map every plane of the layer (an explicit action, off the GUI thread): a lazy
        layer, or an OME-Zarr store when a path is given, shown from the store."""
        if self._closed:
            return
        image = self._image.value
        if image is None:
            self._status.value = "choose an image layer"
            return
        if self._stack_worker is not None:
            self._status.value = "a whole-stack map is already being made"
            return
        params = self.params()
        if not self._inputs_usable(image, params):
            return
        if not after_kernel_build(self, self.compute_stack, self._device.value):
            return
        try:
            planes = self._current_planes(params)
        except (ValueError, TypeError) as exc:
            self._on_error(exc)
            return
        store = self._stack_store.value.strip() or None
        src = planes[0].source
        scale = np.asarray(image.scale) * np.asarray(src.factors)
        second = planes[1] if len(planes) > 1 else None
        job = dict(
            image=src,
            second=None if second is None else second.source,
            template_index=None if second is None else second.index,
            index=planes[0].index,
            params=params,
            device=self._model_device(),
            store=store,
            pixel_size=tuple(scale[len(scale) - src.d :]),
            origin=tuple(np.asarray(image.translate)[len(scale) - src.d :]),
        )
        self._status.value = f"whole-stack {params.metric}" + (
            f": writing {store}…" if store else ": building the lazy layer…"
        )
        worker = create_worker(_stack_job, job, _ignore_errors=True)
        worker.returned.connect(
            lambda out: self._show_stack(out, scale, np.asarray(image.translate))
        )
        worker.errored.connect(self._on_error)
        worker.finished.connect(self._on_stack_finished)
        self._stack_worker = worker
        start_worker(worker)

    def _model_device(self) -> str:
        from .._devices import resolve_device

        return str(resolve_device(self._model.device))

    def _show_stack(self, out, scale, translate):
        if self._closed:
            return
        result, store = out
        data = result.data
        if store is not None:  # shown from the store: every level, lazily
            from ngff_zarr import from_ngff_zarr

            levels = [im.data for im in from_ngff_zarr(str(store)).images]
            data = levels if len(levels) > 1 else levels[0]
        remove_layer(self._viewer, STACK_LAYER)
        with added_unselected(self._viewer):  # napari selects the layer it adds
            self._viewer.add_image(
                data,
                name=STACK_LAYER,
                multiscale=isinstance(data, list),
                colormap=result.colormap,
                contrast_limits=result.contrast_limits,
                scale=scale,
                translate=translate,
            )
        where = f", written to {store}" if store else " (lazy: planes are computed when shown)"
        self._status.value = (
            f"whole-stack {result.params.metric}, window {result.params.window}, shape "
            f"{tuple(result.data.shape)}, axes {result.axes!r}{where}"
        )

    def _on_stack_finished(self):
        self._stack_worker = None

    def _show(self, result):
        if self._closed or not self._model.is_current(result.request_id):
            return  # stale: a newer request supersedes it
        new = result.name not in self._viewer.layers
        # the map on its own plane: shown on that frame only, never on another
        data, geometry = on_its_plane(self._image.value, self._planes[0], result.data)
        # Contrast limits are set for a new kind of map (metric, window, inputs), then
        # kept from plane to plane: frames compare on one colour scale, and each set
        # redraws napari's colour bar (15-20 ms of the GUI thread per map, issue 27).
        scale_key = (result.params, self._image.value, self._second.value)
        limits = {}
        if new or scale_key != self._limits_key:
            limits = {"contrast_limits": result.contrast_limits}
            self._limits_key = scale_key
        layer = put_layer(
            self._viewer,
            "image",
            result.name,
            data,
            colormap=result.colormap,
            **limits,
            **geometry,
        )
        if new:  # once (the user may change them): the values' scale beside the map, and
            # the image seen through it
            show_colorbar(layer)
            layer.opacity = MAP_OPACITY
        keep_on_top(self._viewer, [layer], self._seen_layers)
        self.results_shown += 1
        where = f" at {result.index}" if result.index else ""
        self._status.value = (
            f"{result.params.metric}, window {result.params.window}{where}: "
            f"{result.seconds * 1000:.0f} ms on {result.device}"
        ) + self._axes_note()

    def _axes_note(self) -> str:
        """A warning when the viewer shows other axes than the map's spatial ones (the map
        is always over the layer's last 2 or 3 axes; a transposed view is not followed)."""
        dims = self._viewer.dims
        d = self._planes[0].source.d if self._planes else 2
        shown = tuple(dims.displayed)[-min(d, dims.ndisplay) :]
        trailing = tuple(range(dims.ndim - len(shown), dims.ndim))
        if tuple(sorted(shown)) == trailing:
            return ""
        return f"; note: the map is over the layer's last {d} axes, the viewer shows axes {shown}"

    def _note_busy(self):
        if self._worker is not None and not self._closed:
            self._status.value = self._busy_text

    def _on_finished(self):
        self._busy_note.stop()
        super()._on_finished()
        if self._pending and not self._closed:
            self._pending = False
            self.compute()

    @property
    def busy(self) -> bool:
        return (
            self._worker is not None
            or self._stack_worker is not None
            or self._timer.isActive()
            or self._pending
        )


def _stack_job(job: dict):
    """The whole-stack map of ``job`` (a worker's function): ``(StackMap, store or None)``;
    with a store the map is written there, block by block."""
    result = stack_map(
        job["image"],
        job["second"],
        job["params"],
        index=job["index"],
        device=job["device"],
        template_index=job["template_index"],
    )
    store = job["store"]
    if store is not None:
        store = write_stack_map(result, store, pixel_size=job["pixel_size"], origin=job["origin"])
    return result, store


def _refresh_stopper(timer, dims, *callbacks):
    """Drop pending refreshes, stop the debounce ``timer`` (captured while it exists) and
    leave the viewer's dims events (the viewer may outlive the widget)."""

    def stop(widget) -> None:
        widget._pending = False
        if widget._stack_worker is not None:  # a whole-stack write ends with its block
            widget._stack_worker.quit()
            wait_for(widget._stack_worker)
        for callback, emitter in zip(callbacks, (dims.current_step, dims.ndisplay)):
            with contextlib.suppress(Exception):
                emitter.disconnect(callback)
        with contextlib.suppress(RuntimeError):  # already deleted with the widget
            timer.stop()
            widget._busy_note.stop()

    return stop
