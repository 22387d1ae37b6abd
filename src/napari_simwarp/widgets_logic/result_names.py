"""The names of the layers the widgets write their results to, and how to tell them.

A widget choosing its inputs by itself (the Register widget fills an unchosen pair with
the first two image layers) must never take another widget's result for an input: docked
over one image, the Register widget took the Similarity map's new "similarity map" layer
as its moving image (issue 27, seen in a screenshot). No Qt.
"""

from __future__ import annotations

from .matching import MAP_LAYER
from .registration import WARPED_LAYER
from .similarity import RESULT_LAYER
from .stack_maps import STACK_LAYER

#: result image layers by their exact names
RESULT_IMAGES = (RESULT_LAYER, STACK_LAYER, MAP_LAYER)

#: the registered image's name ends so ("{moving} registered")
_WARPED_SUFFIX = WARPED_LAYER.replace("{moving}", "")


def is_result(name: str) -> bool:
    """Whether an image layer called ``name`` is one a napari-simwarp widget writes."""
    return name in RESULT_IMAGES or name.endswith(_WARPED_SUFFIX)
