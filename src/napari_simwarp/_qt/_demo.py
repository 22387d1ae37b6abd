"""The viewer demo: napari with the sample data and the three widgets docked and set up.

Uses only the widgets' public controls (magicgui children by name).
"""

from __future__ import annotations

import numpy as np

from .._demo import TEMPLATE_CORNER, TEMPLATE_SIZE


def run_gui_demo(device: str = "auto"):
    """Open napari with the sample data and the three widgets docked (blocks until closed).

    Needs the ``napari`` extra and a display.
    """
    import napari

    viewer = napari.Viewer(title="napari-simwarp demo")
    build_demo_viewer(viewer, device)
    napari.run()
    return viewer


def build_demo_viewer(viewer, device: str = "auto") -> dict:
    """Add the sample pair and time-lapse to ``viewer`` and dock the widgets, set up.

    Returns the widgets by name ("Similarity map", "Template matching", "Register").
    """
    from .. import _sample_data
    from . import RegisterWidget, SimilarityMapWidget, TemplateMatchingWidget

    layers = {}
    for factory in (_sample_data.deformed_pair, _sample_data.drifting_timelapse):
        for array, kwargs, _kind in factory():
            layers[kwargs["name"]] = viewer.add_image(array, **kwargs)
    layers["time-lapse"].visible = False
    size = TEMPLATE_SIZE
    box = np.array([[0, 0], [0, size], [size, size], [size, 0]], float) + TEMPLATE_CORNER - 0.5
    shapes = viewer.add_shapes(
        [box],
        shape_type="rectangle",
        name="template box",
        edge_color="cyan",
        face_color="transparent",
        edge_width=2,
    )

    sim = SimilarityMapWidget(viewer)
    match = TemplateMatchingWidget(viewer)
    reg = RegisterWidget(viewer)
    widgets = {"Similarity map": sim, "Template matching": match, "Register": reg}
    docks = []
    for name, widget in widgets.items():
        # Tabbed: stacked, the three did not fit a 1000-px-high screen (the Register
        # button was below its edge; new user's trial).
        docks.append(
            viewer.window.add_dock_widget(widget, name=name, area="right", tabify=bool(docks))
        )
        widget.reset_choices()
        widget.device.value = device if device in widget.device.choices else "auto"
    docks[-1].raise_()  # the Register tab in front: the demo's main job
    sim.live.value = False  # set the layers first, then start the live map
    sim.image.value, sim.second.value = layers["fixed"], layers["moving"]
    sim.metric.value = "local NCC"
    sim.live.value = True
    sim.compute()
    match.image.value, match.shapes.value = layers["fixed"], shapes
    reg.fixed.value, reg.moving.value = layers["fixed"], layers["moving"]
    reg.model.value = "deformable"
    # The view fitted to the canvas as it is now, beside the docks: the layers were added
    # to the wider canvas before them, and the picture ran off its bottom.
    viewer.reset_view()
    return widgets
