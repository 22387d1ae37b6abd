"""napari_simwarp.maps: tiled maps equal the whole-array operators at every chunking, lazy
for dask input, frames never mixed as a volume, one plane on demand."""

import numpy as np
import pytest
import torch

da = pytest.importorskip("dask.array")  # the [large] extra

from napari_simwarp import maps, ops  # noqa: E402


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


@pytest.mark.parametrize("chunks_a, chunks_b", [((5, 7, 30), (5, 7, 30)), ((12, 8, 9), (3, 30, 4))])
def test_a_volume_at_any_chunking_equals_the_whole_volume(rng, chunks_a, chunks_b):
    """Tiles thinner than the window (7 and 3 voxels against a 5-wide one) join a
    neighbor; the two inputs of local NCC may be chunked differently (each tile reads its
    box of each)."""
    a = rng.random((12, 30, 33)).astype(np.float32)
    b = (a + 0.5 * rng.random(a.shape)).astype(np.float32)
    la, lb = da.from_array(a, chunks=chunks_a), da.from_array(b, chunks=chunks_b)
    std = maps.local_std(la, window=5, axes="zyx")
    expected = ops.local_std(torch.from_numpy(a)[None, None], window=5)[0, 0].numpy()
    np.testing.assert_allclose(std.compute(), expected, atol=1e-6, rtol=0)
    ncc = maps.local_ncc(la, lb, window=5, axes="zyx")
    expected = ops.local_ncc(torch.from_numpy(a)[None, None], torch.from_numpy(b)[None, None],
                             window=5)[0, 0].numpy()  # fmt: skip
    np.testing.assert_allclose(ncc.compute(), expected, atol=1e-6, rtol=0)


_PEAK = """
import json, sys
import numpy as np, dask, dask.array as da
from napari_simwarp import maps

def status(key):  # kB figures of /proc/self/status
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

maps.local_std(np.ones((16, 64, 64), np.float32), window=9, axes="zyx")  # warm up
with open("/proc/self/clear_refs", "w") as f:  # the peak (VmHWM) restarts from here
    f.write("5")
base = status("VmRSS:")
# a 128 x 512 x 512 volume made 16 planes at a time (128 MiB as float32), chunked as a
# store often is: 64 x 512 x 512
slab = dask.delayed(lambda z: np.full((16, 512, 512), z, np.uint16), pure=True)
vol = da.concatenate([da.from_delayed(slab(z), (16, 512, 512), np.uint16) for z in range(8)])
vol = vol.rechunk((64, 512, 512)).astype(np.float32)
total = float(maps.local_std(vol, window=9, axes="zyx").sum().compute(scheduler="threads"))
print(json.dumps({"extra": status("VmHWM:") - base, "total": total}))
"""


def test_a_volume_map_holds_a_few_tiles_not_the_volume():
    """The tiled map of a lazily made 128 MiB volume in 64 MiB chunks: the process grows
    by a few tiles (each split to fit ``TILE_WORK_BYTES``) and the chunks they read. A
    task per chunk took 1.2 to 1.4 GiB here (a tile's working set is 6 to 7 times its
    box), 10 times the volume. The map is checked against its known value: each 16-plane
    slab is constant, so the std is nonzero only where a window spans two slabs."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "262144"}
    out = subprocess.run([sys.executable, "-c", _PEAK], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["extra"] < 4 * 128 * 2**20, got["extra"] / 2**20
    # plane z's windows span planes z-4..z+4 (reflected at the ends), slab k holding k
    planes = np.arange(128)
    window = np.abs(planes[:, None] + np.arange(-4, 5))
    window = np.where(window > 127, 254 - window, window) // 16
    assert np.isclose(got["total"], (window.std(axis=1) * 512 * 512).sum(), rtol=1e-4)


def test_tiles_are_split_until_the_tasks_at_once_fit_the_budget(pair):
    """One 40 × 52 frame per chunk: a local_ncc tile of the whole frame (with its halo)
    takes 48 × 60 × 4 × 24 bytes (270 KiB), refused at a 200 KiB budget; now split (two
    threads: 100 KiB each) into tiles that fit, with the whole-array values."""
    import dask

    a, b = pair
    la, lb = da.from_array(a, chunks=(1, 40, 52)), da.from_array(b, chunks=(1, 40, 52))
    with dask.config.set(scheduler="threads", num_workers=2):
        got = maps.local_ncc(la, lb, window=9, axes="tyx", memory_budget=200 * 2**10)
    tile = [(max(c) + 8) for c in got.chunks[1:]]
    assert tile[0] * tile[1] * 4 * maps.MAPS_PER_PIXEL["local_ncc"] <= 100 * 2**10
    expected = ops.local_ncc(_frames(a), _frames(b))[:, 0].numpy()
    np.testing.assert_allclose(got.compute(), expected, atol=1e-6, rtol=0)
