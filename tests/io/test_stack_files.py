"""Stacks in TIFF and .npy files, with no optional package: read, checked, written."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

from napari_simwarp.io import ImageFileError
from napari_simwarp.io.stack_files import (
    check_stack_output,
    open_tiff_in_memory,
    write_stack,
)


def _cast_reference(stack, dtype):
    info = np.iinfo(dtype)
    return np.clip(np.floor(stack.astype(np.float64) + 0.5), info.min, info.max).astype(dtype)


@pytest.mark.parametrize("name", ["out.npy", "out.tif", "out.tiff"])
@pytest.mark.parametrize("shape", [(3, 8, 9), (2, 3, 8, 9)])
def test_write_stack_round_trips_and_casts(tmp_path, name, shape):
    rng = np.random.default_rng(0)
    # fractions .25 and .75 only: no ties, where rounding conventions differ
    stack = (rng.integers(-100, 70000, shape) + rng.choice([0.25, 0.75], shape)).astype(np.float32)
    calls = []
    path = write_stack(
        tmp_path / name, stack, dtype=np.uint16, progress=lambda d, t: calls.append((d, t))
    )
    back = np.load(path) if name.endswith(".npy") else tifffile.imread(path)
    assert back.shape == shape and back.dtype == np.uint16
    np.testing.assert_array_equal(back, _cast_reference(stack, np.uint16))
    assert calls == [(t + 1, shape[0]) for t in range(shape[0])]
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no partial file left
    write_stack(tmp_path / name, stack)  # float32 as given
    back = np.load(path) if name.endswith(".npy") else tifffile.imread(path)
    np.testing.assert_array_equal(back, stack)


def test_write_stack_reads_a_dask_stack_frame_by_frame(tmp_path):
    da = pytest.importorskip("dask.array")
    stack = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
    lazy = da.from_array(stack, chunks=(1, 5, 6))
    np.testing.assert_array_equal(np.load(write_stack(tmp_path / "o.npy", lazy)), stack)


def test_a_failed_write_leaves_no_file(tmp_path):
    def stop(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_stack(tmp_path / "o.tif", np.zeros((3, 4, 4), np.float32), progress=stop)
    assert list(tmp_path.iterdir()) == []


def test_open_tiff_maps_a_plain_tiff_and_reads_a_compressed_one(tmp_path):
    stack = np.random.default_rng(1).integers(0, 4000, (5, 16, 12)).astype(np.uint16)
    tifffile.imwrite(tmp_path / "plain.tif", stack)
    tifffile.imwrite(tmp_path / "packed.tif", stack, compression="zlib")
    plain = open_tiff_in_memory(tmp_path / "plain.tif", where="input")
    assert isinstance(plain, np.memmap)
    np.testing.assert_array_equal(plain, stack)
    packed = open_tiff_in_memory(tmp_path / "packed.tif", where="input")
    np.testing.assert_array_equal(packed, stack)
    with pytest.raises(MemoryError, match=r"compressed or tiled.*napari-simwarp\[large\]"):
        open_tiff_in_memory(tmp_path / "packed.tif", where="input", memory_budget=1000)


def test_check_stack_output(tmp_path):
    (tmp_path / "in.tif").write_bytes(b"")
    inputs = {"input": tmp_path / "in.tif"}
    assert check_stack_output(tmp_path / "o.npy", what="-o", inputs=inputs) == tmp_path / "o.npy"
    with pytest.raises(ImageFileError, match="is not a stack file; use one of .tif, .tiff, .npy"):
        check_stack_output(tmp_path / "o.png", what="-o", inputs=inputs)
    with pytest.raises(ImageFileError, match="input file"):
        check_stack_output(tmp_path / "in.tif", what="-o", inputs=inputs, overwrite=True)


@pytest.mark.parametrize("suffix", [".tif", ".npy"])
def test_a_name_that_fits_is_written_under_a_temporary_name_that_fits_too(tmp_path, suffix):
    # 250 bytes: within the 255-byte limit; a temporary name built from it was not.
    path = tmp_path / ("a" * (250 - len(suffix)) + suffix)
    stack = np.arange(2 * 3 * 4, dtype=np.uint16).reshape(2, 3, 4)
    check_stack_output(path, what="-o", inputs={}, overwrite=False)
    write_stack(path, stack)
    got = tifffile.imread(path) if suffix == ".tif" else np.load(path)
    np.testing.assert_array_equal(got, stack)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_check_tiff_stack_refuses_color_channels_and_truncation(tmp_path):
    from napari_simwarp.io.stack_files import check_tiff_stack

    frames = (np.arange(4 * 32 * 32).reshape(4, 32, 32) % 251).astype(np.uint8)
    tifffile.imwrite(tmp_path / "grey.tif", frames, photometric="minisblack")
    assert check_tiff_stack(tmp_path / "grey.tif", where="input").endswith("YX")
    # 3 or 4 frames given to tifffile without a photometric: stored as planar RGB (axes
    # SYX, what tifffile 2025 does by default), read as frames, as before (a short stack,
    # more likely than planar color)
    tifffile.imwrite(
        tmp_path / "planar.tif", frames[:3], photometric="rgb", planarconfig="separate"
    )
    assert check_tiff_stack(tmp_path / "planar.tif", where="input") == "SYX"
    tifffile.imwrite(tmp_path / "rgb.tif", np.stack([frames] * 3, -1), photometric="rgb")
    with pytest.raises(ImageFileError, match=r"^input has 3 color samples .*'QYXS'"):
        check_tiff_stack(tmp_path / "rgb.tif", where="input")
    tifffile.imwrite(
        tmp_path / "tc.tif", np.stack([frames] * 2, 1), imagej=True, metadata={"axes": "TCYX"}
    )
    with pytest.raises(ImageFileError, match=r"^input has 2 channels per pixel"):
        check_tiff_stack(tmp_path / "tc.tif", where="input")
    whole = (tmp_path / "grey.tif").read_bytes()
    (tmp_path / "cut.tif").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ImageFileError, match=r"^input is truncated"):
        check_tiff_stack(tmp_path / "cut.tif", where="input")
    (tmp_path / "text.tif").write_text("not a TIFF")
    with pytest.raises(ImageFileError, match=r"^input could not be opened \(TiffFileError"):
        check_tiff_stack(tmp_path / "text.tif", where="input")


@pytest.mark.parametrize(
    "shape, refused",
    [((4, 32, 32), None), ((4, 8, 32, 32), None), ((4, 32, 32, 3), "only 3 pixels along x"),
     ((32, 32, 4), "only 4 pixels along x"), ((32, 32), "expected a \\(T, Y, X\\)"),
     ((2, 2, 8, 8, 8), "expected a \\(T, Y, X\\)")],
)  # fmt: skip
def test_check_stack_shape(shape, refused):
    from napari_simwarp.io.stack_files import check_stack_shape

    if refused is None:
        check_stack_shape(shape, where="input")
    else:
        with pytest.raises(ImageFileError, match=refused):
            check_stack_shape(shape, where="input")
    check_stack_shape((4, 32, 32, 3), where="input", labelled=True)  # tifffile said X
