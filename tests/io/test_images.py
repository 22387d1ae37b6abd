"""io/images.py: what read_image refuses before any work (truncated TIFFs, arrays whose
last axis looks like color samples) and what it still reads."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

from napari_simwarp.io import ImageFileError, read_image


def _picture(shape=(48, 40)) -> np.ndarray:
    y, x = np.mgrid[: shape[0], : shape[1]]
    return ((np.sin(x / 4.0) + np.cos(y / 5.0) + 2) * 1000).astype(np.uint16)


@pytest.mark.parametrize("compression", [None, "zlib"])
def test_a_whole_tiff_is_read_and_a_truncated_one_refused(tmp_path, compression):
    # compressed: no contiguous extent, the pages' strips are checked instead
    picture = _picture()
    path = tmp_path / "a.tif"
    tifffile.imwrite(path, picture, compression=compression, rowsperstrip=8)
    np.testing.assert_array_equal(read_image(path, what="fixed"), picture)
    whole = path.read_bytes()
    cut = tmp_path / "cut.tif"
    # the header and the tags lie at the start (tifffile writes the IFD first): cut the
    # pixels' end off
    cut.write_bytes(whole[: len(whole) - 64])
    with pytest.raises(ImageFileError, match=r"^fixed: '.*cut\.tif' is truncated"):
        read_image(cut, what="fixed")


def test_a_npy_whose_last_axis_looks_like_color_is_refused(tmp_path):
    path = tmp_path / "rgb.npy"
    np.save(path, np.stack([_picture()] * 3, -1))
    with pytest.raises(ImageFileError, match=r"only 3 pixels along x.*rgb2gray"):
        read_image(path, what="moving")
    np.save(path, np.stack([_picture()] * 3, -1)[None])  # (1, Y, X, 3): squeezed first
    with pytest.raises(ImageFileError, match=r"only 3 pixels along x"):
        read_image(path, what="moving")


@pytest.mark.parametrize("shape", [(3, 48, 40), (48, 40, 5), (6, 6, 3), (48, 40)])
def test_volumes_and_images_that_are_no_color_are_read(tmp_path, shape):
    # planes first, a last axis of 5, or every axis small: nothing says color
    array = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    np.save(tmp_path / "v.npy", array)
    np.testing.assert_array_equal(read_image(tmp_path / "v.npy"), array)


def test_an_rgb_tiff_is_still_converted_to_luminance(tmp_path):
    rgb = np.stack([_picture() // 300] * 3, -1).astype(np.uint8)
    rgb[..., 1] //= 2
    tifffile.imwrite(tmp_path / "c.tif", rgb, photometric="rgb")
    notes = []
    grey = read_image(tmp_path / "c.tif", notes=notes)
    expected = np.rint(rgb.astype(np.float64) @ [0.2125, 0.7154, 0.0721]).astype(np.uint8)
    np.testing.assert_array_equal(grey, expected)
    assert len(notes) == 1 and "luminance" in notes[0]


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
def test_a_truncated_npy_is_refused_and_a_whole_one_read(tmp_path, version):
    from napari_simwarp.io.images import load_npy

    array = np.arange(6 * 40 * 48, dtype=np.float32).reshape(6, 40, 48)
    path = tmp_path / "a.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array(f, array, version=version)
    np.testing.assert_array_equal(read_image(path), array)
    np.testing.assert_array_equal(load_npy(path, mmap_mode="r"), array)
    whole = path.read_bytes()
    path.write_bytes(whole[:-100])
    with pytest.raises(ImageFileError, match=r"^fixed: .*a\.npy.* truncated: its header says"):
        read_image(path, what="fixed")
    with pytest.raises(ValueError, match=rf"^truncated: .* but the file has {len(whole) - 100}"):
        load_npy(path, mmap_mode="r")  # register-stack's reader: np.load blamed "mmap length"


@pytest.mark.parametrize("name", ["big.npy", "big.tif"])
def test_an_image_larger_than_the_memory_budget_is_refused_before_it_is_read(
    tmp_path, monkeypatch, name
):
    # 64 × 64 float32: 16 KiB as floats, against a budget of 10 KiB
    array = np.ones((64, 64), np.float32)
    path = tmp_path / name
    np.save(path, array) if name.endswith(".npy") else tifffile.imwrite(path, array)
    monkeypatch.setenv("SIMWARP_MEMORY_BUDGET", "10KiB")
    with pytest.raises(ImageFileError, match=r"^reading moving: .* needs about 16\.0 KiB"):
        read_image(path, what="moving")
    monkeypatch.setenv("SIMWARP_MEMORY_BUDGET", "16KiB")  # exactly enough
    np.testing.assert_array_equal(read_image(path, what="moving"), array)


@pytest.mark.parametrize("dtype", ["uint8", "int16", "uint16"])
def test_cast_note_counts_the_clipped_values_as_rounding_then_clipping_does(monkeypatch, dtype):
    # Against the whole image rounded in float64 at once (the definition), with chunks of
    # a few values so that several are counted, NaN and infinities among the values.
    from napari_simwarp.io import images

    monkeypatch.setattr(images, "CAST_CHUNK", 7)
    rng = np.random.default_rng(3)
    values = (rng.standard_normal((13, 11)) * 40000).astype(np.float32)
    values[2, 3], values[4, 5], values[6, 7] = np.nan, np.inf, -np.inf
    info = np.iinfo(dtype)
    rounded = np.rint(values.astype(np.float64))
    expected = int(np.count_nonzero((rounded < info.min) | (rounded > info.max)))
    assert expected > 0
    note = images.cast_note(values, dtype)
    assert note is not None and note.startswith(f"{expected} values")


def test_cast_note_reads_an_image_without_copying_it_whole():
    # The note is made after a registration kept within its memory budget: no float64
    # copy of the output (the first version peaked at 4x the image's size).
    import tracemalloc

    from napari_simwarp.io import images

    values = np.linspace(-10, 300, 4 << 20, dtype=np.float32).reshape(2048, 2048)  # 16 MiB
    tracemalloc.start()
    try:
        note = images.cast_note(values, "uint8")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert note is not None and "clipped" in note
    assert peak < values.nbytes / 2  # a chunk of 4 MiB of float64 and its masks


def test_cast_note_of_an_all_nan_image_is_none():
    from napari_simwarp.io import images

    assert images.cast_note(np.full((4, 4), np.nan, np.float32), "uint8") is None
