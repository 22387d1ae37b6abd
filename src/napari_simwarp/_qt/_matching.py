"""The "Template matching" widget: ZNCC of a template over an image, best matches as points."""

from __future__ import annotations

from typing import TYPE_CHECKING

import napari.layers
import numpy as np
from magicgui.widgets import (
    ComboBox,
    FloatSpinBox,
    PushButton,
    SpinBox,
    create_widget,
)
from napari.qt.threading import create_worker

from ..widgets_logic.matching import (
    BOXES_LAYER,
    MAP_LAYER,
    POINTS_LAYER,
    match,
    rectangle_slices,
)
from ._common import (
    WorkerWidget,
    layer_image,
    on_destroyed,
    put_layer,
    remove_layer,
)

if TYPE_CHECKING:
    import napari

SOURCES = ("rectangle in a Shapes layer", "image layer")


class TemplateMatchingWidget(WorkerWidget):
    """Find a template in an image by ZNCC.

    The template is the rectangle selected in a Shapes layer (else its last shape), cut
    from the image, or a whole image layer. Results: the ``"ZNCC map"`` image (value at a
    pixel: the template centered there), the ``"matches"`` points (the top k local maxima
    above the threshold, with their ``score`` as a feature) and, in 2-D, the
    ``"match boxes"`` rectangles.
    """

    task = "template matching"

    def __init__(self, napari_viewer: napari.viewer.Viewer):
        super().__init__()
        self._viewer = napari_viewer
        self._image = create_widget(name="image", annotation=napari.layers.Image, label="image")
        self._source = ComboBox(
            name="source", choices=list(SOURCES), value=SOURCES[0], label="template from"
        )
        self._shapes = create_widget(
            name="shapes",
            annotation=napari.layers.Shapes,
            label="rectangle",
            options={"nullable": True},
        )
        self._template = create_widget(
            name="template",
            annotation=napari.layers.Image,
            label="template",
            options={"nullable": True},
        )
        self._k = SpinBox(name="k", value=5, min=1, max=1000, label="top k")
        self._threshold = FloatSpinBox(
            name="threshold", value=0.5, min=-1.0, max=1.0, step=0.05, label="threshold"
        )
        self._distance = SpinBox(
            name="distance", value=0, min=0, max=10000, label="min distance (0: auto)"
        )
        self._run = PushButton(text="Find matches")
        self.extend(
            [
                self._image,
                self._source,
                self._shapes,
                self._template,
                self._k,
                self._threshold,
                self._distance,
                self._device,
                self._run,
                self._status,
                self._backend,
            ]
        )
        self._source.changed.connect(self._update_visibility)
        self._run.changed.connect(self.run)
        self.result = None
        self.native.destroyed.connect(on_destroyed(self))
        self._update_visibility()
        self._backend.refresh()

    def _update_visibility(self, *_):
        from_shapes = self._source.value == SOURCES[0]
        self._shapes.visible = from_shapes
        self._template.visible = not from_shapes

    def template(self) -> np.ndarray:
        """The template's pixels (a copy), from the rectangle or the template layer."""
        image = self._image.value
        data = np.asarray(layer_image(image, "image"))
        if self._source.value == SOURCES[1]:
            return np.array(layer_image(self._template.value, "template"), dtype=np.float32)
        shapes = self._shapes.value
        if shapes is None or len(shapes.data) == 0:
            raise ValueError("draw a rectangle in a Shapes layer (or choose a template layer)")
        selected = sorted(shapes.selected_data)
        vertices = np.asarray(shapes.data[selected[-1] if selected else -1])
        # Shape data coordinates → image data coordinates (through world coordinates).
        world = [shapes.data_to_world(v) for v in vertices]
        pixel = np.array([image.world_to_data(w) for w in world], np.float64)
        box = rectangle_slices(pixel, data.shape)
        return np.array(data[box], dtype=np.float32)

    def run(self, *_):
        if self._closed or self._worker is not None:
            return
        try:
            image = np.asarray(layer_image(self._image.value, "image"))
            template = self.template()
        except ValueError as exc:
            self._on_error(exc)  # the whole message in the status line, and a toast
            return
        self._status.value = f"matching a {'×'.join(map(str, template.shape))} template…"
        worker = create_worker(
            match,
            image,
            template,
            k=int(self._k.value),
            threshold=float(self._threshold.value),
            min_distance=int(self._distance.value) or None,
            device=self._device.value,
            _ignore_errors=True,
            _progress={"desc": "Template matching"},
        )
        worker.returned.connect(self._show)
        worker.errored.connect(self._on_error)
        worker.finished.connect(self._on_finished)
        self._worker = worker
        worker.start()

    def _show(self, result):
        if self._closed:
            return
        self.result = result
        image = self._image.value
        put_layer(
            self._viewer,
            "image",
            MAP_LAYER,
            result.zncc,
            like=image,
            colormap="bwr",
            contrast_limits=(-1.0, 1.0),
            opacity=0.6,
            blending="translucent",
        )
        features = {"score": result.scores.astype(np.float32)}
        ndim = result.zncc.ndim
        put_layer(
            self._viewer,
            "points",
            POINTS_LAYER,
            result.centers.astype(np.float32).reshape(-1, ndim),
            like=image,
            features=features,
            size=max(4, min(result.template_shape) // 4),
            face_color="yellow",
            text={"string": "{score:.2f}", "color": "yellow", "anchor": "upper_left", "size": 9},
        )
        if ndim == 2:
            put_layer(
                self._viewer,
                "shapes",
                BOXES_LAYER,
                list(result.boxes()),
                like=image,
                shape_type="rectangle",
                edge_color="yellow",
                face_color="transparent",
                edge_width=2,
            )
        else:  # no boxes in 3D: an earlier 2D run's boxes would no longer match the points
            remove_layer(self._viewer, BOXES_LAYER)
        n = len(result.scores)
        best = (
            f", best {result.scores[0]:.3f} at {tuple(int(c) for c in result.centers[0])}"
            if n
            else ""
        )
        self._status.value = f"{n} match(es){best} in {result.seconds:.2f} s"
