"""``register-stack`` in a base install (no zarr, dask, ngff-zarr or distributed): TIFF
and .npy stacks in and out work; anything that needs the large extra is refused before
any work, with exit status 2 and the line that installs it (tests/_blocker)."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile
from scipy import ndimage as ndi

from napari_simwarp import data
from napari_simwarp.registration import load_transform
from tests.base_install import run_cli


@pytest.fixture(scope="module")
def timelapse():
    """``(stack (5, 64, 64) float32, shifts (5, 2))``: frame t is the scene moved by -shift_t."""
    return data.drifting_timelapse(frames=5, size=64)


def _loaded(result) -> str:
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "source,out", [("s.tif", "aligned.tif"), ("s.npy", "aligned.npy"), ("s.tif", "aligned.npy")]
)
def test_tiff_and_npy_stacks_register_without_the_large_extra(tmp_path, timelapse, source, out):
    stack, shifts = timelapse
    tifffile.imwrite(tmp_path / "s.tif", stack)
    np.save(tmp_path / "s.npy", stack)
    result = run_cli(["register-stack", source, "-o", out], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert _loaded(result) == "loaded: []"  # the blocker held: none was imported
    assert "Traceback" not in result.stderr
    found = np.array(
        [
            load_transform(tmp_path / f"{out}.transforms" / f"frame_{t:05d}.transform.npz").matrix
            for t in range(len(stack))
        ]
    )
    np.testing.assert_allclose(found[:, :2, 2], shifts, atol=0.2)
    aligned = tifffile.imread(tmp_path / out) if out.endswith(".tif") else np.load(tmp_path / out)
    assert aligned.shape == stack.shape and aligned.dtype == stack.dtype
    # each aligned frame is its input frame moved by the transform found, as SciPy moves it
    for t in range(len(stack)):
        expected = ndi.affine_transform(stack[t], found[t][:2, :2], found[t][:2, 2], order=1)
        np.testing.assert_allclose(aligned[t][8:-8, 8:-8], expected[8:-8, 8:-8], atol=1e-3)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {"s.tif", "s.npy", out, f"{out}.transforms"}
    )


@pytest.mark.parametrize(
    "argv,purpose",
    [
        (["stack.tif", "-o", "aligned.zarr"], "writing an OME-Zarr store (-o aligned.zarr)"),
        (["stack.tif", "-o", "aligned"], "writing an OME-Zarr store (-o aligned)"),
        (["in.zarr", "-o", "aligned.tif"], "reading a Zarr or OME-Zarr input (in.zarr)"),
        (["stack.tif", "-o", "a.tif", "--scheduler", "tcp://127.0.0.1:1"], "--scheduler"),
    ],
)
def test_what_needs_the_large_extra_is_refused_before_any_work(tmp_path, argv, purpose):
    # The stack is not a TIFF at all: refused on the packages, it was never read.
    (tmp_path / "stack.tif").write_bytes(b"not a TIFF")
    (tmp_path / "in.zarr").mkdir()
    (tmp_path / "in.zarr" / ".zarray").write_text("{}")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = run_cli(["register-stack", *argv], cwd=tmp_path, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("napari-simwarp register-stack: error: ") and purpose in lines[0]
    assert "which are not installed" in lines[0]
    assert lines[0].endswith("pip install 'napari-simwarp[large]'")
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_help_says_which_inputs_and_outputs_need_the_large_extra():
    from napari_simwarp._cli import build_parser

    parser = build_parser()
    stack = parser._subparsers._group_actions[0].choices["register-stack"]
    text = " ".join(stack.format_help().split())
    assert ".npy" in text.split("positional arguments:")[1].split("options:")[0]  # input
    assert "a .tif/.tiff or .npy stack in and a .tif/.tiff or .npy file out need none" in text
    assert "OME-Zarr output (.zarr) and --scheduler need zarr, dask and ngff-zarr" in text
    assert "pip install 'napari-simwarp[large]'" in text
    summary = " ".join(parser.format_help().split())
    assert "(TIFF, NPY, Zarr, OME-Zarr) into an OME-Zarr store, a TIFF or a .npy file" in summary


def test_a_stack_too_large_for_memory_names_the_large_extra(tmp_path, timelapse):
    # Without zarr and dask the aligned stack is held in memory: a run that cannot fit is
    # refused before any frame is aligned, and the message says what reads frame by frame.
    stack, _ = timelapse
    np.save(tmp_path / "s.npy", stack)
    result = run_cli(
        ["register-stack", "s.npy", "-o", "a.npy", "--memory-budget", "64KiB"], cwd=tmp_path
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "memory budget is 64.0 KiB" in lines[0]
    assert "pip install 'napari-simwarp[large]' lets the command read TIFF and .npy" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.npy"]


def test_a_rerun_writes_the_file_from_the_held_transforms_without_the_large_extra(
    tmp_path, timelapse
):
    # After an interrupt the transforms folder is whole and the file absent: the rerun
    # warps the stack from those transforms (no dask: in memory, frame by frame).
    stack, _ = timelapse
    tifffile.imwrite(tmp_path / "s.tif", stack)
    first = run_cli(["register-stack", "s.tif", "-o", "a.tif"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    expected = tifffile.imread(tmp_path / "a.tif")
    (tmp_path / "a.tif").unlink()
    rerun = run_cli(["register-stack", "s.tif", "-o", "a.tif"], cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming" in rerun.stdout and _loaded(rerun) == "loaded: []"
    np.testing.assert_array_equal(tifffile.imread(tmp_path / "a.tif"), expected)
    # --overwrite registers again instead of reusing them
    again = run_cli(["register-stack", "s.tif", "-o", "a.tif", "--overwrite"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "resuming" not in again.stdout
