"""napari_simwarp.maps: tiled maps equal the whole-array operators at every chunking, lazy
for dask input, frames never mixed as a volume, one plane on demand."""

import dask.array as da
import numpy as np
import pytest
import torch

from napari_simwarp import maps, ops


def _frames(x):
    return torch.from_numpy(x)[:, None]


@pytest.fixture
def pair(rng):
    a = rng.random((3, 40, 52)).astype(np.float32)
    return a, (a + 0.4 * rng.random(a.shape)).astype(np.float32)


@pytest.mark.parametrize("chunks", [(1, 9, 13), (2, 20, 52), (3, 40, 52)])
def test_tiled_maps_equal_the_whole_array_operators(pair, chunks):
    a, b = pair
    la, lb = da.from_array(a, chunks=chunks), da.from_array(b, chunks=chunks)
    template = a[0, 10:19, 20:27]
    cases = [
        (maps.local_std(la, window=7, axes="tyx"), ops.local_std(_frames(a), window=7)),
        (maps.local_ncc(la, lb, window=9, axes="tyx"), ops.local_ncc(_frames(a), _frames(b))),
        (maps.ssim(la, lb, axes="tyx"), ops.ssim(_frames(a), _frames(b))),
        (
            maps.zncc(la, template, axes="tyx"),
            ops.match_template(_frames(a), torch.from_numpy(template)[None, None], pad_input=True),
        ),
    ]
    for got, expected in cases:
        assert isinstance(got, da.Array) and got.dtype == np.float32
        np.testing.assert_allclose(got.compute(), expected[:, 0].numpy(), atol=1e-6, rtol=0)


def test_numpy_in_numpy_out_and_a_volume(rng):
    vol = rng.random((12, 30, 33))
    got = maps.local_std(vol, window=5, axes="zyx", chunks=8)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64
    expected = ops.local_std(torch.from_numpy(vol)[None, None], window=5)[0, 0].numpy()
    np.testing.assert_allclose(got, expected, atol=1e-12)
    # the same array as frames is another map: frames are never mixed as a volume
    frames = maps.local_std(vol, window=5, axes="tyx")
    assert np.abs(frames - got).max() > 1e-3


def test_one_plane(rng, pair):
    vol = rng.random((12, 30, 33)).astype(np.float32)
    whole = ops.local_std(torch.from_numpy(vol)[None, None], window=5)[0, 0].numpy()
    for z in (0, 5, 11):
        plane = maps.plane(
            "local_std", da.from_array(vol, chunks=4), index=(z,), axes="zyx", window=5
        )
        np.testing.assert_allclose(plane, whole[z], atol=1e-6)
    a, b = pair
    expected = ops.ssim(_frames(a), _frames(b))[2, 0].numpy()
    np.testing.assert_allclose(
        maps.plane("ssim", a, b, index=(2,), axes="tyx"), expected, atol=1e-6
    )


def test_axes_must_be_said_for_3d_data(pair):
    with pytest.raises(ValueError, match="axes is required"):
        maps.local_std(pair[0], window=5)
    with pytest.raises(ValueError, match="must end with the 2 or 3 spatial axes"):
        maps.local_std(pair[0], window=5, axes="ytx")
    with pytest.raises(MemoryError, match="one tile"):
        maps.local_std(pair[0], window=5, axes="tyx", memory_budget="1KiB")
