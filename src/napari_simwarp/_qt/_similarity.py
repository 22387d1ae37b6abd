"""The "Similarity map" widget: a live, debounced map of one or two image layers."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import napari.layers
from magicgui.widgets import (
    CheckBox,
    ComboBox,
    FloatSpinBox,
    PushButton,
    SpinBox,
    create_widget,
)
from napari.qt.threading import create_worker
from qtpy.QtCore import QTimer

from ..widgets_logic.similarity import (
    METRICS,
    RESULT_LAYER,
    SimilarityModel,
    SimilarityParams,
    needs_second,
)
from ._common import (
    WorkerWidget,
    layer_image,
    notify_error,
    on_destroyed,
    put_layer,
)

if TYPE_CHECKING:
    import napari

DEBOUNCE_MS = 150


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
        self._window = SpinBox(name="window", value=15, min=1, max=255, step=2, label="window")
        self._sigma = FloatSpinBox(
            name="sigma", value=1.5, min=0.1, max=50.0, step=0.1, label="sigma"
        )
        self._kernel = ComboBox(
            name="kernel", choices=["box", "gaussian"], value="box", label="NCC kernel"
        )
        self._live = CheckBox(name="live", label="", value=True, text="live update")
        self._compute = PushButton(text="Compute")
        self.extend(
            [
                self._image,
                self._second,
                self._metric,
                self._window,
                self._sigma,
                self._kernel,
                self._device,
                self._live,
                self._compute,
                self._status,
                self._backend,
            ]
        )

        self._timer = QTimer()
        self._timer.setSingleShot(True)
        self._timer.setInterval(DEBOUNCE_MS)
        self._timer.timeout.connect(self.compute)
        self._pending = False
        self._watched: list = []
        self.results_shown = 0  # how many maps reached the layer (tests, benchmarks)

        for w in (self._metric, self._window, self._sigma, self._kernel):
            w.changed.connect(self._on_param)
        self._device.changed.connect(self._on_device)
        self._image.changed.connect(self._on_layers)
        self._second.changed.connect(self._on_layers)
        self._compute.changed.connect(self.compute)
        self.native.destroyed.connect(on_destroyed(self, _refresh_stopper(self._timer)))
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
            if lay is not None and lay.name != RESULT_LAYER
        ]
        for layer in self._watched:
            layer.events.data.connect(self._schedule)
        self._schedule()

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
        second = self._second.value
        if RESULT_LAYER in (image.name, getattr(second, "name", None)):
            # The map would overwrite its own input (input layers are never modified).
            notify_error(
                "similarity map",
                ValueError(f"choose an input other than the {RESULT_LAYER!r} result layer"),
            )
            self._status.value = "the result layer cannot be an input"
            return
        if needs_second(params.metric) and second is None:
            self._status.value = f"{params.metric} needs a second layer"
            return
        if self._worker is not None:
            self._model.new_request()  # whatever runs now is stale
            self._pending = True
            return
        try:
            a = layer_image(image, "image")
            b = layer_image(second, "second") if needs_second(params.metric) else None
        except ValueError as exc:
            notify_error("similarity map", exc)
            return
        request = self._model.new_request()
        self._status.value = f"computing {params.metric}…"
        worker = create_worker(self._model.compute, request, a, b, params, _ignore_errors=True)
        worker.returned.connect(self._show)
        worker.errored.connect(self._on_error)
        worker.finished.connect(self._on_finished)
        self._worker = worker
        worker.start()

    def _show(self, result):
        if self._closed or not self._model.is_current(result.request_id):
            return  # stale: a newer request supersedes it
        put_layer(
            self._viewer,
            "image",
            result.name,
            result.data,
            like=self._image.value,
            colormap=result.colormap,
            contrast_limits=result.contrast_limits,
        )
        self.results_shown += 1
        self._status.value = (
            f"{result.params.metric}, window {result.params.window}: "
            f"{result.seconds * 1000:.0f} ms on {result.device}"
        )

    def _on_finished(self):
        super()._on_finished()
        if self._pending and not self._closed:
            self._pending = False
            self.compute()

    @property
    def busy(self) -> bool:
        return self._worker is not None or self._timer.isActive() or self._pending


def _refresh_stopper(timer):
    """Drop pending refreshes and stop the debounce ``timer`` (captured while it exists)."""

    def stop(widget) -> None:
        widget._pending = False
        with contextlib.suppress(RuntimeError):  # already deleted with the widget
            timer.stop()

    return stop
