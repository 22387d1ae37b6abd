"""The planes a map reads: spatial axes, the plane at a viewer position, lazy reads."""

from __future__ import annotations

import numpy as np
import pytest

da = pytest.importorskip("dask.array")  # the [large] extra

from napari_simwarp.widgets_logic.planes import Plane, default_mode, source  # noqa: E402
from napari_simwarp.widgets_logic.similarity import SimilarityModel, SimilarityParams  # noqa: E402


def test_default_mode_is_3d_only_for_volumes_shown_in_3d():
    assert default_mode(2, 3) == "2D per plane"
    assert default_mode(3, 2) == "2D per plane"
    assert default_mode(3, 3) == "3D volume"
    assert default_mode(4, 3) == "3D volume"


def test_plane_index_and_read_of_a_dask_stack_read_one_chunk():
    rng = np.random.default_rng(0)
    stack = rng.random((5, 4, 16, 18), dtype=np.float32)  # (t, z, y, x)
    lazy = da.from_array(stack, chunks=(1, 1, 16, 18))
    src2 = source(lazy, rgb=False, mode="2D per plane")
    assert src2.lead_shape == (5, 4) and src2.spatial_shape == (16, 18)
    assert src2.index_at((2.4, 2.6, 3.0, 7.0)) == (2, 3)
    assert src2.index_at((-1.0, 9.0, 0.0, 0.0)) == (0, 3)  # clipped into range
    plane = Plane(src2, (2, 3)).read()
    np.testing.assert_array_equal(plane, stack[2, 3])
    src3 = source(lazy, rgb=False, mode="3D volume")
    np.testing.assert_array_equal(Plane(src3, (4,)).read(), stack[4])


def test_rgb_and_multiscale_sources():
    rgb = np.zeros((3, 8, 9, 3), np.float32)
    rgb[1, ..., 1] = 1.0
    src = source(rgb, rgb=True, mode="2D per plane")
    assert src.shape == (3, 8, 9)
    np.testing.assert_allclose(src.read((1,)), 0.7154)  # luminance of pure green
    full = np.arange(2 * 16 * 20, dtype=np.float32).reshape(2, 16, 20)
    levels = [full, full[:, ::2, ::2]]
    with pytest.raises(ValueError, match="multiscale"):
        source(levels, rgb=False, mode="2D per plane")
    src = source(levels, rgb=False, mode="2D per plane", level=1)
    assert src.factors == (1.0, 2.0, 2.0) and src.spatial_shape == (8, 10)
    np.testing.assert_array_equal(src.read((1,)), full[1, ::2, ::2])


def test_bad_sources_are_named():
    with pytest.raises(ValueError, match="at least 3"):
        source(np.zeros((8, 8)), rgb=False, mode="3D volume", name="the image layer")
    with pytest.raises(ValueError, match="mode must be"):
        source(np.zeros((8, 8)), rgb=False, mode="4D")
    with pytest.raises(ValueError, match="not multiscale"):
        source(np.zeros((8, 8)), rgb=False, mode="2D per plane", level=2)


def test_model_maps_a_plane_and_refuses_a_window_larger_than_it():
    from scipy import ndimage

    rng = np.random.default_rng(1)
    stack = rng.random((3, 20, 24), dtype=np.float32)
    model = SimilarityModel("cpu")
    plane = Plane(source(stack, rgb=False, mode="2D per plane"), (1,))
    res = model.compute(1, plane, None, SimilarityParams("local std", window=5))
    f = stack[1].astype(np.float64)
    m = ndimage.uniform_filter(f, 5)
    ref = np.sqrt(np.maximum(ndimage.uniform_filter(f * f, 5) - m * m, 0))
    np.testing.assert_allclose(res.data, ref, rtol=1e-4, atol=1e-6)
    assert res.index == (1,)
    with pytest.raises(ValueError, match="at most 19"):
        model.compute(2, plane, None, SimilarityParams("local std", window=21))
