"""The napari widgets (all Qt code of napari-simwarp lives here, reached through qtpy).

Each widget is a magicgui ``Container`` taking the ``napari_viewer``, thin over a model in
:mod:`napari_simwarp.widgets_logic`.
"""

from ._matching import TemplateMatchingWidget
from ._register import RegisterWidget
from ._similarity import SimilarityMapWidget

__all__ = ["RegisterWidget", "SimilarityMapWidget", "TemplateMatchingWidget"]
