"""_qt/_common.py: result layers by name."""

import dask.array as da
import numpy as np

from napari_simwarp._qt._common import put_layer


def test_a_lazy_result_is_put_in_a_layer_without_being_computed(viewer):
    computed = []
    lazy = da.zeros((6, 32, 32), chunks=(1, 32, 32)).map_blocks(
        lambda b: computed.append(1) or b, dtype=float
    )
    before = len(computed)  # what napari reads to show one plane is not put_layer's
    layer = put_layer(viewer, "image", "result", lazy)
    shown = len(computed) - before
    assert layer.data is lazy and shown <= 2, shown  # at most the plane on screen
    put_layer(viewer, "image", "result", lazy + 1)  # reused: the same layer, new data
    assert viewer.layers["result"] is layer and len(computed) - before <= 4
    assert np.shape(layer.data) == (6, 32, 32)
