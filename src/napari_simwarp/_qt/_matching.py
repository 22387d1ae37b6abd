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

from ..maps import MAPS_PER_PIXEL
from ..widgets_logic.device import resolve_device
from ..widgets_logic.matching import (
    BOXES_LAYER,
    MAP_LAYER,
    POINTS_LAYER,
    match_planes,
    read_template,
    template_box,
)
from ..widgets_logic.planes import MODES, default_mode, plane_at
from ._common import (
    WorkerWidget,
    after_kernel_build,
    keep_on_top,
    level_choice,
    plane_geometry,
    put_layer,
    remove_layer,
    show_colorbar,
    start_worker,
)

if TYPE_CHECKING:
    import napari

SOURCES = ("rectangle in a Shapes layer", "image layer")


class TemplateMatchingWidget(WorkerWidget):
    """Find a template in an image by ZNCC.

    The image is the plane the viewer is on ("2D per plane": a time-lapse's frame, a
    volume's plane) or the volume ("3D volume"); a multiscale layer at the level chosen.
    The template is the rectangle selected in a Shapes layer (else its last shape), cut
    from that plane, or an image layer (its plane or volume). Only that plane is read, in
    the worker: a lazy (dask, zarr) or multiscale layer is never read whole, and a plane
    too large for the memory budget is refused before the run. Results: the
    ``"ZNCC map"`` image (value at a pixel: the template centered there), the
    ``"matches"`` points (the top k local maxima above the threshold, with their
    ``score`` as a feature) and, in 2-D, the ``"match boxes"`` rectangles.
    """

    task = "template matching"

    def __init__(self, napari_viewer: napari.viewer.Viewer):
        super().__init__()
        self._viewer = napari_viewer
        self._image = create_widget(name="image", annotation=napari.layers.Image, label="image")
        self._mode = ComboBox(
            name="mode", choices=list(MODES), value="2D per plane", label="spatial axes"
        )
        self._level = SpinBox(name="level", value=0, min=0, max=0, label="level")
        self._level.visible = False
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
                self._mode,
                self._level,
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
                self._torch_meanwhile,
            ]
        )
        self._source.changed.connect(self._update_visibility)
        self._image.changed.connect(self._on_image)
        self._mode.changed.connect(self._adapt_to_layer)
        self._run.changed.connect(self.run)
        self.result = None
        self._plane = None  # the image plane of the last run (its geometry places results)
        self.watch_destroyed()
        self.compact()
        self._update_visibility()
        self._on_image()
        self._backend.refresh()

    def reset_choices(self, *_):
        """The layer lists changed (napari calls this as layers come and go): refresh the
        combos, and give an empty rectangle choice the Shapes layer there is, so the first
        press after drawing a rectangle finds it (issue 27: the combo stayed "-----")."""
        super().reset_choices()
        if self._shapes.value is None:
            drawn = [
                layer
                for layer in self._shapes.choices
                if isinstance(layer, napari.layers.Shapes) and layer.name != BOXES_LAYER
            ]
            if drawn:
                self._shapes.value = drawn[-1]  # the newest

    def _update_visibility(self, *_):
        from_shapes = self._source.value == SOURCES[0]
        self._shapes.visible = from_shapes
        self._template.visible = not from_shapes

    def _on_image(self, *_):
        """The mode that suits the image layer (3D only for a volume shown in 3D)."""
        layer = self._image.value
        if layer is not None:
            with self._mode.changed.blocked():
                self._mode.value = default_mode(layer.ndim, self._viewer.dims.ndisplay)
        self._adapt_to_layer()

    def _adapt_to_layer(self, *_):
        """A level choice for multiscale layers (the first whose plane fits 2048²)."""
        layer = self._image.value
        if layer is not None:
            level_choice(layer, self._level, MODES[self._mode.value])

    def _plane_of(self, layer, name: str):
        """The plane of ``layer`` the viewer is on (nothing read)."""
        level = None
        if getattr(layer, "multiscale", False):
            level = min(int(self._level.value), len(layer.data) - 1)
        return plane_at(
            layer.data,
            layer.world_to_data(self._viewer.dims.point),
            rgb=bool(getattr(layer, "rgb", False)),
            mode=self._mode.value,
            level=level,
            name=f"the {name} layer {layer.name!r}",
        )

    def plan(self):
        """``(image plane, template plane or None, box or None)``: what a run reads,
        decided here without reading anything."""
        image = self._image.value
        if image is None:
            raise ValueError("choose an image layer")
        plane = self._plane_of(image, "image")
        if self._source.value == SOURCES[1]:
            if self._template.value is None:
                raise ValueError("choose a template layer (or a rectangle in a Shapes layer)")
            return plane, self._plane_of(self._template.value, "template"), None
        shapes = self._shapes.value
        if shapes is None or len(shapes.data) == 0:
            raise ValueError("draw a rectangle in a Shapes layer (or choose a template layer)")
        selected = sorted(shapes.selected_data)
        vertices = np.asarray(shapes.data[selected[-1] if selected else -1])
        # Shape data coordinates → world → the image's data coordinates; a 2-D rectangle
        # over a stack lies on the plane the viewer is on.
        point = np.asarray(self._viewer.dims.point, np.float64)
        pixels = []
        for v in vertices:
            world = np.array(point)
            w = np.asarray(shapes.data_to_world(v), np.float64)
            world[len(world) - len(w) :] = w
            pixels.append(image.world_to_data(world))
        return plane, None, template_box(np.array(pixels, np.float64), plane)

    def template(self) -> np.ndarray:
        """The template's pixels (a copy), read now, from the rectangle or the template layer."""
        return read_template(*self.plan())[1]

    def run(self, *_):
        if self._closed or self._worker is not None:
            return
        try:  # the inputs checked before any wait for the kernel build
            plane, template, box = self.plan()
            plane.source.refuse_beyond_budget(
                MAPS_PER_PIXEL["zncc"],
                resolve_device(self._device.value),
                what="template matching",
                advice="pick a coarser level, '2D per plane', or a smaller layer",
            )
        except (ValueError, TypeError, MemoryError) as exc:
            self._on_error(exc)  # the whole message in the status line, and a toast
            return
        if not after_kernel_build(self, self.run, self._device.value):
            return  # ZNCC uses the local std kernels: they build first (a visible step)
        shape = [b.stop - b.start for b in box] if box is not None else template.shape
        self._status.value = f"matching a {'×'.join(map(str, shape))} template…"
        self._plane = plane
        worker = create_worker(
            match_planes,
            plane,
            template,
            box,
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
        start_worker(worker)

    def _show(self, result):
        if self._closed:
            return
        self.result = result
        geometry = plane_geometry(self._image.value, self._plane.source)
        new_map = MAP_LAYER not in self._viewer.layers
        zncc_map = put_layer(
            self._viewer,
            "image",
            MAP_LAYER,
            result.zncc,
            colormap="bwr",
            contrast_limits=(-1.0, 1.0),
            opacity=0.6,
            blending="translucent",
            **geometry,
        )
        if new_map:  # once: the ZNCC scale beside the map (the user may hide it)
            show_colorbar(zncc_map)
        features = {"score": result.scores.astype(np.float32)}
        ndim = result.zncc.ndim
        points = put_layer(
            self._viewer,
            "points",
            POINTS_LAYER,
            result.centers.astype(np.float32).reshape(-1, ndim),
            features=features,
            size=max(4, min(result.template_shape) // 4),
            face_color="yellow",
            text={"string": "{score:.2f}", "color": "yellow", "anchor": "upper_left", "size": 9},
            **geometry,
        )
        shown = [zncc_map, points]
        if ndim == 2:
            boxes = put_layer(
                self._viewer,
                "shapes",
                BOXES_LAYER,
                list(result.boxes()),
                shape_type="rectangle",
                edge_color="yellow",
                face_color="transparent",
                edge_width=2,
                **geometry,
            )
            shown.append(boxes)
        else:  # no boxes in 3D: an earlier 2D run's boxes would no longer match the points
            remove_layer(self._viewer, BOXES_LAYER)
        keep_on_top(self._viewer, shown, self._seen_layers)
        n = len(result.scores)
        best = (
            f", best {result.scores[0]:.3f} at {tuple(int(c) for c in result.centers[0])}"
            if n
            else ""
        )
        where = f" in plane {self._plane.index}" if self._plane.index else ""
        self._status.value = f"{n} match(es){best}{where} in {result.seconds:.2f} s"
