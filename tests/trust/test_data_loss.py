"""Class "data loss": no command ever writes over an input or, unasked, over a file.

Cross-cutting sweeps of the issue's classes live in tests/trust/ (one module per class);
the unit tests of each module stay beside it in the mirrored tree.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest
import tifffile

from napari_simwarp import _cli
from napari_simwarp.registration import AffineTransform


@pytest.fixture
def pair(tmp_path, rng):
    from scipy import ndimage as ndi

    base = ndi.gaussian_filter(rng.random((64, 64)), 2)
    fixed = (base * 1000).astype(np.uint16)
    moving = (ndi.shift(base, (1.5, -2.0), order=1, mode="nearest") * 1000).astype(np.uint16)
    tifffile.imwrite(tmp_path / "a.tif", fixed)
    tifffile.imwrite(tmp_path / "b.tif", moving)
    return tmp_path


def _run(cwd, *argv):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return _cli.main(["register", "a.tif", "b.tif", "--model", "translation", "--quiet", *argv])
    finally:
        os.chdir(old)


def _snapshot(folder: pathlib.Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize(
    "spelling", ["b.tif", "./b.tif", "sub/../b.tif", "link.tif", "hard.tif", "B_ABS"]
)
def test_output_may_never_be_an_input_whatever_its_spelling(pair, spelling, capsys):
    os.symlink(pair / "b.tif", pair / "link.tif")
    os.link(pair / "b.tif", pair / "hard.tif")
    (pair / "sub").mkdir()
    target = str(pair / "b.tif") if spelling == "B_ABS" else spelling
    before = _snapshot(pair)
    for extra in ([], ["--overwrite"]):  # not even when asked to overwrite
        assert _run(pair, "-o", target, *extra) == 2
        assert "input" in capsys.readouterr().err
    assert _snapshot(pair) == before


def test_existing_outputs_are_replaced_only_with_overwrite(pair, capsys):
    assert _run(pair, "-o", "out.tif") == 0
    assert {"out.tif", "out.tif.transform.npz"} <= set(_snapshot(pair))
    first = _snapshot(pair)
    assert _run(pair, "-o", "out.tif") == 2
    assert "--overwrite" in capsys.readouterr().err
    assert _snapshot(pair) == first
    (pair / "out.tif").unlink()  # the image gone, its transform still there: refused too
    assert _run(pair, "-o", "out.tif") == 2
    assert "transform file" in capsys.readouterr().err
    assert _run(pair, "-o", "out.tif", "--overwrite") == 0


@pytest.mark.parametrize("name", ["r.jpg", "r", "r.tif.gz", "r.bmp"])
def test_unsupported_output_types_are_refused_before_any_work(pair, name, capsys):
    before = _snapshot(pair)
    assert _run(pair, "-o", name) == 2
    assert "unsupported output type" in capsys.readouterr().err
    assert _snapshot(pair) == before


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs a folder no one can write")
def test_an_unwritable_place_is_refused_before_the_run(pair, capsys, monkeypatch):
    from napari_simwarp.registration import pair as pair_module

    def fail(*args, **kwargs):
        raise AssertionError("the registration must not start")

    monkeypatch.setattr(pair_module, "register_iter", fail)
    assert _run(pair, "-o", "/proc/out.tif") == 2
    assert "cannot be written" in capsys.readouterr().err


def test_writes_are_whole_or_absent(pair, monkeypatch):
    """A failure while writing leaves neither a half-written output nor a temporary file."""
    from napari_simwarp.io import images

    def broken(path, data, **kwargs):
        pathlib.Path(path).write_bytes(b"half")
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(tifffile, "imwrite", broken)
    before = set(_snapshot(pair))
    assert _run(pair, "-o", "out.tif") == 2
    assert set(_snapshot(pair)) == before  # no out.tif, no partial file
    assert images  # the module whose atomic write is under test


def test_transform_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "t.npz"
    AffineTransform(np.eye(3)).save(path)
    good = path.read_bytes()

    def broken(file, **arrays):  # half a file, then the disk is full
        if hasattr(file, "write"):
            file.write(b"half")
        else:
            pathlib.Path(file).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(OSError):
        AffineTransform(2 * np.eye(3) - np.diag([1, 1, 1.0])).save(path)
    assert path.read_bytes() == good and sorted(p.name for p in tmp_path.iterdir()) == ["t.npz"]


# -- outputs whole or absent (issue 28) -------------------------------------------------


def test_the_image_and_its_transform_appear_together_or_not_at_all(pair, monkeypatch, capsys):
    """The disk filled while writing the transform: out.tif was left without its
    transform, and a rerun was refused ("exists; pass --overwrite")."""

    def broken(self):
        def write(partial):
            pathlib.Path(partial).write_bytes(b"half")
            raise OSError(28, "No space left on device")

        return write

    monkeypatch.setattr(AffineTransform, "npz_writer", broken)
    before = set(_snapshot(pair))
    assert _run(pair, "-o", "out.tif") == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "out.tif.transform.npz" in err
    assert "partial" not in err
    assert set(_snapshot(pair)) == before  # no image, no transform, no temporary file
    monkeypatch.undo()
    assert _run(pair, "-o", "out.tif") == 0  # a rerun is not refused
    assert {"out.tif", "out.tif.transform.npz"} <= set(_snapshot(pair))


def test_long_output_names_that_fit_are_written_and_longer_ones_refused_first(pair, capsys):
    """A 236-character name: the outputs fit (240 and 254 bytes) but the temporary name
    did not, and the error named a file the user never gave."""
    name = "a" * 232 + ".tif"
    assert _run(pair, "-o", name) == 0, capsys.readouterr().err
    assert {name, name + ".transform.npz"} <= set(_snapshot(pair))
    assert not [p for p in pair.iterdir() if "partial" in p.name]
    longer = "b" * 240 + ".tif"  # the transform's name would be 254 + 14 bytes
    assert _run(pair, "-o", longer) == 2
    err = capsys.readouterr().err
    assert "the transform file" in err and "longer than the 255 bytes" in err
    assert not [p for p in pair.iterdir() if p.name.startswith("bbb")]


def test_a_full_disk_leaves_neither_output(pair, capsys):
    """The issue's run, on a 64 KiB tmpfs (skipped where one cannot be mounted): the
    image fits, the image and its deformable transform do not."""
    import subprocess

    tiny = pair / "tiny"
    tiny.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tiny)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        old = os.getcwd()
        os.chdir(pair)
        try:
            argv = ["register", "a.tif", "b.tif", "-o", "tiny/out.tif", "--dtype", "float64"]
            code = _cli.main([*argv, "--model", "deformable", "--quiet"])
        finally:
            os.chdir(old)
        err = capsys.readouterr().err
        assert code == 2 and "No space left on device" in err, err
        assert "tiny/out.tif" in err and "partial" not in err
        assert list(tiny.iterdir()) == []
    finally:
        subprocess.run(["umount", str(tiny)], check=False)


def test_save_into_a_missing_folder_names_the_users_path(tmp_path):
    target = tmp_path / "no" / "such" / "t.npz"
    with pytest.raises(FileNotFoundError) as info:
        AffineTransform(np.eye(3)).save(target)
    assert str(target) in str(info.value) and "partial" not in str(info.value)


# -- register-stack: interrupts and resumes (issue 28) -----------------------------------


def _stack(seed: int) -> np.ndarray:
    from scipy import ndimage as ndi

    rng = np.random.default_rng(seed)
    base = ndi.gaussian_filter(rng.random((40, 40)), 2)
    frames = [ndi.shift(base, (0.5 * t, -0.3 * t), order=1, mode="nearest") for t in range(6)]
    return (np.stack(frames) * 1000).astype(np.uint16)


def _stack_run(folder, *extra):
    argv = ["register-stack", str(folder / "stack.tif"), "-o", str(folder / "out.zarr")]
    return _cli.main([*argv, "--quiet", *extra])


def _interrupt_the_write(monkeypatch):
    """Two blocks of the output stored, then Ctrl-C (a partial store, transforms saved)."""
    from napari_simwarp.io import omezarr

    original = omezarr._write_level

    def write_level(path, level, source, dtype, group, report):
        def interrupt(n):
            raise KeyboardInterrupt

        return original(path, level, source, dtype, 2, interrupt)

    monkeypatch.setattr(omezarr, "_write_level", write_level)


def test_an_interrupted_stack_says_what_is_left_and_a_rerun_resumes(tmp_path, monkeypatch, capsys):
    from napari_simwarp.io.omezarr import read_ome_zarr

    tifffile.imwrite(tmp_path / "stack.tif", _stack(0))
    _interrupt_the_write(monkeypatch)
    assert _stack_run(tmp_path) == 130
    err = capsys.readouterr().err
    assert "no output was written" not in err
    assert "out.zarr' holds a partial store" in err and "rerun the same command to resume" in err
    # the partial store's missing levels read as zeros: refused, unless asked for
    with pytest.raises(ValueError, match="is a partial store"):
        read_ome_zarr(tmp_path / "out.zarr")
    assert read_ome_zarr(tmp_path / "out.zarr", partial=True).data.shape == (6, 40, 40)
    monkeypatch.undo()
    assert _stack_run(tmp_path) == 0, capsys.readouterr().err
    resumed = np.asarray(read_ome_zarr(tmp_path / "out.zarr").data)
    (tmp_path / "fresh").mkdir()
    tifffile.imwrite(tmp_path / "fresh" / "stack.tif", _stack(0))
    assert _stack_run(tmp_path / "fresh") == 0
    np.testing.assert_array_equal(
        resumed, np.asarray(read_ome_zarr(tmp_path / "fresh" / "out.zarr").data)
    )


def test_a_resume_from_a_replaced_input_is_refused(tmp_path, monkeypatch, capsys):
    """Other frames of the same shape under the same name: the rerun said "resuming" and
    wrote the old transforms with a mix of old and new blocks."""
    tifffile.imwrite(tmp_path / "stack.tif", _stack(0))
    _interrupt_the_write(monkeypatch)
    assert _stack_run(tmp_path) == 130
    monkeypatch.undo()
    capsys.readouterr()
    tifffile.imwrite(tmp_path / "stack.tif", _stack(1))  # same shape and size
    assert _stack_run(tmp_path) == 2
    err = capsys.readouterr().err
    assert "stack.tif' changed since the interrupted run" in err
    assert "the content of the sampled frames" in err and "--overwrite" in err
    assert _stack_run(tmp_path, "--overwrite") == 0, capsys.readouterr().err


def test_a_resume_checks_the_transforms_folder_too(tmp_path, monkeypatch, capsys):
    """Interrupted after the transforms, before any block: the rerun reuses them only for
    the same input."""
    from napari_simwarp.io import omezarr

    def write(*args, **kwargs):
        raise KeyboardInterrupt

    tifffile.imwrite(tmp_path / "stack.tif", _stack(0))
    monkeypatch.setattr(omezarr, "write_ome_zarr", write)
    assert _stack_run(tmp_path) == 130
    assert "out.zarr.transforms' holds the transforms" in capsys.readouterr().err
    monkeypatch.undo()
    tifffile.imwrite(tmp_path / "stack.tif", _stack(1))
    assert _stack_run(tmp_path) == 2
    assert "changed since the interrupted run" in capsys.readouterr().err
