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
