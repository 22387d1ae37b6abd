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
