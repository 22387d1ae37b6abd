"""widgets_logic/stack_maps.py: whole-stack maps are lazy, equal the operator on every
plane, and write to OME-Zarr; what cannot be mapped is named."""

import numpy as np
import pytest
import torch

da = pytest.importorskip("dask.array")  # the [large] extra
pytest.importorskip("ngff_zarr")

from ngff_zarr import from_ngff_zarr  # noqa: E402

from napari_simwarp import ops  # noqa: E402
from napari_simwarp.widgets_logic.planes import source  # noqa: E402
from napari_simwarp.widgets_logic.similarity import SimilarityParams  # noqa: E402
from napari_simwarp.widgets_logic.stack_maps import axes_of, stack_map, write_stack_map  # noqa: E402


def _frames(x):
    return torch.from_numpy(np.asarray(x, np.float32))[:, None]


def _counted(x, chunks):
    """``x`` as a dask array that records the frames of each block it reads."""
    read = []

    def record(block, block_info=None):
        read.append(tuple(block_info[0]["array-location"][0]))
        return block

    return da.from_array(x, chunks=chunks).map_blocks(record, dtype=x.dtype), read


def test_local_std_of_a_lazy_time_lapse_is_lazy_and_per_frame(rng):
    stack = (rng.random((5, 40, 52)) * 4000).astype(np.uint16)
    lazy, read = _counted(stack, (2, 20, 26))
    src = source(lazy, rgb=False, mode="2D per plane")
    got = stack_map(src, None, SimilarityParams("local std", window=7), index=(3,))
    # building it computed the map of frame 3 only (for the contrast limits)
    assert read and all(lo <= 3 < hi for lo, hi in read), read
    assert isinstance(got.data, da.Array) and got.axes == "tyx"
    expected = ops.local_std(_frames(stack), window=7)[:, 0].numpy()
    np.testing.assert_allclose(got.data.compute(), expected, rtol=1e-5, atol=1e-3)
    assert got.colormap == "magma" and got.contrast_limits[0] == 0.0


def test_two_layer_maps_rgb_and_a_template(rng):
    a = rng.random((3, 30, 34)).astype(np.float32)
    b = (a + 0.3 * rng.random(a.shape)).astype(np.float32)
    sa, sb = (source(x, rgb=False, mode="2D per plane") for x in (a, b))
    ncc = stack_map(sa, sb, SimilarityParams("local NCC", window=8))
    assert ncc.params.window == 9  # made odd, as the live map makes it
    np.testing.assert_allclose(
        ncc.data.compute(), ops.local_ncc(_frames(a), _frames(b), window=9)[:, 0], atol=1e-5
    )
    # SSIM's data range: the two layers' joint range over the whole stack
    span = float(max(a.max(), b.max()) - min(a.min(), b.min()))
    ssim = stack_map(sa, sb, SimilarityParams("SSIM", window=7, sigma=1.5))
    expected = ops.ssim(_frames(a), _frames(b), window=7, sigma=1.5, data_range=span,
                        reduction="none")  # fmt: skip
    np.testing.assert_allclose(ssim.data.compute(), expected[:, 0], atol=1e-5)
    # an RGB time-lapse is mapped as luminance; the template is the second layer's plane
    rgb = np.stack([a, b, a], axis=-1)
    gray = (0.2125 + 0.0721) * a + 0.7154 * b  # ITU-R 709 luminance, as napari weighs RGB
    template = np.ascontiguousarray(b[1, 5:16, 8:19])
    got = stack_map(
        source(da.from_array(rgb, chunks=(1, 15, 34, 3)), rgb=True, mode="2D per plane"),
        source(b[:, 5:16, 8:19], rgb=False, mode="2D per plane"),
        SimilarityParams("ZNCC (template)", window=3),
        template_index=(1,),
    )
    expected = ops.match_template(_frames(gray), torch.from_numpy(template)[None, None],
                                  pad_input=True)  # fmt: skip
    np.testing.assert_allclose(got.data.compute(), expected[:, 0], atol=1e-4)


def test_written_to_ome_zarr_with_the_layer_pixel_size(tmp_path, rng):
    vol = rng.random((2, 6, 64, 64)).astype(np.float32)  # (T, Z, Y, X)
    src = source(da.from_array(vol, chunks=(1, 3, 32, 32)), rgb=False, mode="3D volume")
    got = stack_map(src, None, SimilarityParams("local std", window=5))
    assert got.axes == "tzyx"
    store = write_stack_map(got, tmp_path / "map.zarr", pixel_size=(2.0, 0.5, 0.5))
    images = from_ngff_zarr(str(store)).images
    expected = torch.cat([ops.local_std(torch.from_numpy(v)[None, None], window=5) for v in vol])
    np.testing.assert_allclose(images[0].data.compute(), expected[:, 0], atol=1e-5)
    assert images[0].scale == {"t": 1.0, "z": 2.0, "y": 0.5, "x": 0.5}


def test_what_cannot_be_mapped_is_named(rng):
    five = source(np.zeros((2, 2, 2, 16, 16), np.float32), rgb=False, mode="2D per plane")
    with pytest.raises(ValueError, match="at most 2 axes besides the 2 spatial ones"):
        axes_of(five)
    a = source(rng.random((3, 20, 20)), rgb=False, mode="2D per plane")
    b = source(rng.random((2, 20, 20)), rgb=False, mode="2D per plane")
    with pytest.raises(ValueError, match="same shape"):
        stack_map(a, b, SimilarityParams("SSIM"))
    with pytest.raises(ValueError, match="needs a second"):
        stack_map(a, None, SimilarityParams("local NCC"))
    with pytest.raises(ValueError, match="window 21 is larger"):
        stack_map(a, None, SimilarityParams("local std", window=21))
