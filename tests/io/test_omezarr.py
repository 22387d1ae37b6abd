"""io/omezarr.py: OME-Zarr stores that ngff-zarr reads and validates; a killed write
resumes without recomputing finished blocks; nothing is written over an input."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

da = pytest.importorskip("dask.array")  # the [large] extra
pytest.importorskip("ngff_zarr")

from ngff_zarr import from_ngff_zarr, validate  # noqa: E402

from napari_simwarp.io import ImageFileError  # noqa: E402
from napari_simwarp.io.omezarr import check_store, read_ome_zarr, write_ome_zarr  # noqa: E402


def test_pyramid_metadata_and_values(tmp_path, rng):
    x = (rng.random((2, 300, 520)) * 1000).astype(np.uint16)
    store = write_ome_zarr(
        tmp_path / "a.zarr", da.from_array(x, chunks=(1, 128, 128)), axes="tyx",
        pixel_size=(0.5, 0.25), unit="micrometer", levels=3,
    )  # fmt: skip
    attrs = json.loads((store / ".zattrs").read_text())
    validate(attrs, version="0.4")
    images = from_ngff_zarr(str(store)).images
    assert [i.data.shape for i in images] == [(2, 300, 520), (2, 150, 260), (2, 75, 130)]
    assert np.array_equal(images[0].data.compute(), x)
    assert images[1].scale == {"t": 1.0, "y": 1.0, "x": 0.5}
    # level 1 is the 2x2 box mean of level 0 (rounded to the dtype)
    box = x.reshape(2, 150, 2, 260, 2).astype(float).mean(axis=(2, 4))
    assert np.array_equal(images[1].data.compute(), np.rint(box).astype(np.uint16))
    _, axes, pixel_size, origin = read_ome_zarr(store)
    assert axes == "tyx" and pixel_size == [0.5, 0.25] and origin == [0.0, 0.0]


def test_origin_is_written_and_read_back_per_level(tmp_path, rng):
    """The origin (pixel 0's center) survives the write; a coarser level's pixel 0 is the
    mean of level 0's first 2×2 pixels, so its center is half a level-0 pixel further in."""
    x = rng.random((64, 96)).astype(np.float32)
    store = write_ome_zarr(
        tmp_path / "o.zarr", x, axes="yx", pixel_size=(0.5, 2.0), origin=(-10.0, 7.5), levels=2
    )
    validate(json.loads((store / ".zattrs").read_text()), version="0.4")
    level0, level1 = read_ome_zarr(store, 0), read_ome_zarr(store, 1)
    assert level0.origin == [-10.0, 7.5] and level0.pixel_size == [0.5, 2.0]
    assert level1.origin == [-10.0 + 0.25, 7.5 + 1.0] and level1.pixel_size == [1.0, 4.0]
    # without an origin, none is written (and the reader gives zeros)
    plain = write_ome_zarr(tmp_path / "p.zarr", x, axes="yx", levels=1)
    assert "translation" not in (plain / ".zattrs").read_text()
    assert read_ome_zarr(plain).origin == [0.0, 0.0]


@pytest.mark.parametrize(
    "origin, message",
    [((1.0,), "origin must be 2 finite numbers"), ((0.0, np.nan), "origin must be 2 finite"),
     ("ab", "origin must be 2 numbers")],
)  # fmt: skip
def test_a_bad_origin_is_refused_before_writing(tmp_path, origin, message):
    with pytest.raises((TypeError, ValueError), match=message):
        write_ome_zarr(tmp_path / "b.zarr", np.zeros((8, 8)), axes="yx", origin=origin)
    assert not (tmp_path / "b.zarr").exists()


@pytest.mark.parametrize("dtype", [np.uint16, np.int16, np.uint8, np.float32])
def test_volume_pyramid_is_the_float64_box_mean(tmp_path, rng, dtype):
    """Levels of a 3-D volume are the 2×2×2 box means of the level above, as NumPy computes
    them in float64, rounded to the dtype: also for 16-bit values at the top of their
    range (sums of 8 such values)."""
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    if info is not None:
        x = rng.integers(info.max - 40, info.max, (8, 12, 20), endpoint=True).astype(dtype)
        x[0, :2, :2] = info.min
    else:
        x = (rng.random((8, 12, 20)) * 3e4).astype(dtype)
    store = write_ome_zarr(tmp_path / "v.zarr", da.from_array(x, chunks=(4, 6, 10)),
                           axes="zyx", levels=3)  # fmt: skip
    images = from_ngff_zarr(str(store)).images
    level = x
    for image in images[1:]:
        box = level.reshape(level.shape[0] // 2, 2, level.shape[1] // 2, 2, -1, 2)
        mean = box.astype(np.float64).mean(axis=(1, 3, 5))
        level = np.rint(mean).astype(dtype) if info is not None else mean.astype(dtype)
        np.testing.assert_array_equal(image.data.compute(), level)


def test_refusals_before_any_work(tmp_path):
    x = np.zeros((4, 4))
    (tmp_path / "in.npy").write_bytes(b"")
    with pytest.raises(ImageFileError, match="is an input"):
        check_store(tmp_path / "in.npy", key="k", inputs={"INPUT": tmp_path / "in.npy"})
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "keep.txt").write_text("mine")
    with pytest.raises(ImageFileError, match="not a Zarr store"):
        write_ome_zarr(tmp_path / "folder", x, axes="yx", overwrite=True)
    assert (tmp_path / "folder" / "keep.txt").read_text() == "mine"
    write_ome_zarr(tmp_path / "b.zarr", x, axes="yx")
    with pytest.raises(ImageFileError, match="exists"):
        write_ome_zarr(tmp_path / "b.zarr", x + 1, axes="yx")
    assert from_ngff_zarr(str(tmp_path / "b.zarr")).images[0].data.compute().max() == 0


def test_unwritable_store_is_refused():
    # /proc takes no files, whoever runs the test (root included)
    with pytest.raises(ImageFileError, match="cannot be written"):
        write_ome_zarr("/proc/simwarp-test.zarr", np.zeros((4, 4)), axes="yx")


_KILLED = """
import os, sys
import dask, numpy as np, dask.array as da
from napari_simwarp.io.omezarr import write_ome_zarr
count = int(sys.argv[2])
calls = []

def frame(t):
    calls.append(t)
    with open(sys.argv[3], "a") as f:
        f.write(f"{t}\\n")
    if len(calls) == count:
        os._exit(9)  # killed in the middle of the write
    return np.full((1, 32, 32), t, np.uint16)

x = da.concatenate([da.from_delayed(dask.delayed(frame)(t), (1, 32, 32), np.uint16)
                    for t in range(12)])
dask.config.set(scheduler="synchronous")
write_ome_zarr(sys.argv[1], x, axes="tyx", levels=1, memory_budget=3 * 32 * 32 * 4 * 2 * 4)
"""


def test_a_killed_write_resumes(tmp_path):
    store, log = tmp_path / "k.zarr", tmp_path / "computed.txt"
    script = textwrap.dedent(_KILLED)
    killed = subprocess.run([sys.executable, "-c", script, str(store), "9", str(log)])
    assert killed.returncode == 9
    first = [int(t) for t in log.read_text().split()]
    log.write_text("")
    done = subprocess.run([sys.executable, "-c", script, str(store), "99", str(log)])
    assert done.returncode == 0
    again = [int(t) for t in log.read_text().split()]
    # blocks journaled before the kill (groups of 4) are not computed again
    assert set(range(8)) <= set(first) and not set(range(8)) & set(again)
    assert set(again) == set(range(8, 12))
    data = from_ngff_zarr(str(store)).images[0].data.compute()
    assert np.array_equal(data[:, 0, 0], np.arange(12))
