"""``register`` and ``register-stack`` on input a user gets wrong: one line on stderr that
names the argument and what was expected, exit status 2, no traceback, no output left
behind, the input's bytes unchanged."""

from __future__ import annotations

import hashlib
import pathlib

import numpy as np
import pytest
import tifffile

from napari_simwarp import _cli


def _digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _refused(argv, inputs, out_dir, capsys, *, command, names) -> str:
    """Run the command and check it refuses: exit 2, one error line naming each of
    ``names``, nothing written in ``out_dir``, every file of ``inputs`` unchanged."""
    before = {p: _digest(p) for p in inputs}
    code = _cli.main([command, *map(str, argv)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"napari-simwarp {command}: error: "), err
    for name in names:
        assert name in lines[0], lines[0]
    assert "Traceback" not in err
    assert not any(out_dir.iterdir()), list(out_dir.iterdir())
    assert {p: _digest(p) for p in inputs} == before
    return lines[0]


@pytest.fixture
def out_dir(tmp_path) -> pathlib.Path:
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


def _picture(size=64) -> np.ndarray:
    y, x = np.mgrid[:size, :size]
    return (np.sin(x / 5.0) * np.cos(y / 7.0) + 0.002 * x * y).astype(np.float32)


def test_register_stack_refuses_an_rgb_tiff(tmp_path, out_dir, capsys):
    # a (Y, X, 3) RGB TIFF was read as 64 frames 3 pixels wide and "registered"
    rgb = (np.stack([_picture()] * 3, -1) * 40 + 100).astype(np.uint8)
    path = tmp_path / "rgb.tif"
    tifffile.imwrite(path, rgb, photometric="rgb")
    line = _refused(
        [path, "-o", out_dir / "a.tif"],
        [path],
        out_dir,
        capsys,
        command="register-stack",
        names=["input:", "rgb.tif", "3 color samples", "grey"],
    )
    assert "'YXS'" in line  # the axes tifffile found


def test_register_stack_refuses_a_tiff_with_channels(tmp_path, out_dir, capsys):
    stack = (np.stack([[_picture()] * 2] * 4) * 40 + 100).astype(np.uint16)  # (T, C, Y, X)
    path = tmp_path / "channels.tif"
    tifffile.imwrite(path, stack, imagej=True, metadata={"axes": "TCYX"})
    _refused(
        [path, "-o", out_dir / "a.tif"],
        [path],
        out_dir,
        capsys,
        command="register-stack",
        names=["input:", "2 channels"],
    )


@pytest.mark.parametrize("shape", [(4, 64, 64, 3), (64, 64, 4)])
def test_register_stack_refuses_a_npy_whose_last_axis_looks_like_color(
    tmp_path, out_dir, capsys, shape
):
    path = tmp_path / "rgb.npy"
    np.save(path, np.zeros(shape, np.uint8) + np.arange(shape[-1], dtype=np.uint8))
    _refused(
        [path, "-o", out_dir / "a.npy"],
        [path],
        out_dir,
        capsys,
        command="register-stack",
        names=["input:", "rgb.npy", f"only {shape[-1]} pixels along x", "color"],
    )


def test_register_refuses_a_npy_whose_last_axis_looks_like_color(tmp_path, out_dir, capsys):
    # (Y, X, 3) was registered as a 3-D volume 3 pixels deep along x, exit 0
    rgb = np.stack([_picture()] * 3, -1)
    np.save(tmp_path / "a.npy", rgb)
    np.save(tmp_path / "b.npy", rgb)
    inputs = [tmp_path / "a.npy", tmp_path / "b.npy"]
    _refused(
        [*inputs, "-o", out_dir / "r.npy"],
        inputs,
        out_dir,
        capsys,
        command="register",
        names=["fixed:", "a.npy", "only 3 pixels along x", "rgb2gray"],
    )


def test_a_thin_but_real_volume_is_still_read(tmp_path, out_dir, capsys):
    # a (Z, Y, X) volume with few planes is not taken for color: only the last axis is
    vol = np.stack([_picture()] * 3)  # (3, 64, 64)
    np.save(tmp_path / "v.npy", vol)
    code = _cli.main(
        ["register", str(tmp_path / "v.npy"), str(tmp_path / "v.npy"), "-o",
         str(out_dir / "r.npy"), "--model", "translation", "--quiet"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    np.testing.assert_allclose(np.load(out_dir / "r.npy"), vol, atol=1e-4)


def _truncated_tiff(path: pathlib.Path, data: np.ndarray) -> None:
    tifffile.imwrite(path, data)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) * 2 // 3])


def test_register_stack_refuses_a_truncated_tiff_up_front(tmp_path, out_dir, capsys):
    # it failed mid-run with "corrupted strip cannot be reshaped", naming no file, after
    # a log line of tifffile's own on stderr
    path = tmp_path / "cut.tif"
    _truncated_tiff(path, (np.stack([_picture()] * 5) * 40 + 100).astype(np.uint16))
    _refused(
        [path, "-o", out_dir / "a.tif"],
        [path],
        out_dir,
        capsys,
        command="register-stack",
        names=["input:", "cut.tif", "truncated", f"has {path.stat().st_size} bytes"],
    )


def test_register_names_a_truncated_tiff(tmp_path, out_dir, capsys):
    path = tmp_path / "cut.tif"
    _truncated_tiff(path, (_picture() * 40 + 100).astype(np.uint16))
    np.save(tmp_path / "m.npy", _picture())
    _refused(
        [path, tmp_path / "m.npy", "-o", out_dir / "r.tif"],
        [path, tmp_path / "m.npy"],
        out_dir,
        capsys,
        command="register",
        names=["fixed:", "cut.tif", "truncated"],
    )


def test_register_with_no_iteration_writes_the_starting_transform(tmp_path, capsys):
    # --iterations 0 wrote its outputs, then died on an IndexError (no loss to print)
    picture = _picture()
    np.save(tmp_path / "f.npy", picture)
    np.save(tmp_path / "m.npy", np.roll(picture, 2, axis=1))
    out = tmp_path / "r.npy"
    code = _cli.main(
        ["register", str(tmp_path / "f.npy"), str(tmp_path / "m.npy"), "-o", str(out),
         "--model", "translation", "--iterations", "0"]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "no iteration run (--iterations 0)" in captured.out
    from napari_simwarp.registration import load_transform

    # the starting transform: the linear models' coarse search, no refinement (the true
    # shift is 2 pixels along x)
    matrix = load_transform(f"{out}.transform.npz").matrix
    np.testing.assert_array_equal(matrix[:2, :2], np.eye(2))
    assert abs(matrix[1, 2] - 2.0) < 0.5 and abs(matrix[0, 2]) < 0.5, matrix
    assert np.load(out).shape == picture.shape


def test_register_stack_batch_size_that_is_no_number_names_the_option(tmp_path, out_dir, capsys):
    np.save(tmp_path / "s.npy", np.stack([_picture()] * 3))
    with pytest.raises(SystemExit) as exit_:  # argparse's exit: usage errors
        _cli.main(
            ["register-stack", str(tmp_path / "s.npy"), "-o", str(out_dir / "a.npy"),
             "--batch-size", "many"]
        )  # fmt: skip
    code, err = exit_.value.code, capsys.readouterr().err
    assert code == 2 and "--batch-size" in err and "'many'" in err, err
    assert not any(out_dir.iterdir())


def test_register_stack_output_over_its_input_reads_plainly(tmp_path, capsys):
    # it said "is the input input file"
    path = tmp_path / "s.npy"
    np.save(path, np.stack([_picture()] * 3))
    before = _digest(path)
    code = _cli.main(["register-stack", str(path), "-o", str(path), "--overwrite"])
    err = capsys.readouterr().err
    assert code == 2 and "-o: " in err and "is the input file; input files are never" in err
    assert "input input" not in err
    assert [p.name for p in tmp_path.iterdir()] == ["s.npy"] and _digest(path) == before


def test_register_stack_scheduler_it_cannot_reach_names_the_option(tmp_path, out_dir, capsys):
    pytest.importorskip("distributed")
    import dask

    np.save(tmp_path / "s.npy", np.stack([_picture()] * 3))
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        _refused(
            [tmp_path / "s.npy", "-o", out_dir / "a.npy", "--scheduler", "tcp://127.0.0.1:9"],
            [tmp_path / "s.npy"],
            out_dir,
            capsys,
            command="register-stack",
            names=["--scheduler", "tcp://127.0.0.1:9"],
        )


def test_register_refuses_an_image_over_the_memory_budget_before_reading_it(
    tmp_path, out_dir, capsys, monkeypatch
):
    # a .npy was read whole whatever its size (a 24 GiB file on a 24 GiB machine)
    np.save(tmp_path / "f.npy", _picture())  # 64 × 64 float32: 16 KiB
    monkeypatch.setenv("SIMWARP_MEMORY_BUDGET", "8KiB")
    inputs = [tmp_path / "f.npy"]
    _refused(
        [*inputs, *inputs, "-o", out_dir / "r.npy"],
        inputs,
        out_dir,
        capsys,
        command="register",
        names=["fixed: ", "f.npy", "needs about 16.0 KiB", "SIMWARP_MEMORY_BUDGET"],
    )


def test_register_stack_names_a_truncated_npy(tmp_path, out_dir, capsys):
    path = tmp_path / "s.npy"
    np.save(path, np.stack([_picture()] * 4))
    path.write_bytes(path.read_bytes()[:-1000])
    _refused(
        [path, "-o", out_dir / "a.npy"],
        [path],
        out_dir,
        capsys,
        command="register-stack",
        names=["input: ", "s.npy", "truncated: its header says shape (4, 64, 64)"],
    )


@pytest.mark.parametrize("landmarks", ["nope.csv", "folder"])
def test_register_landmarks_that_are_no_file_name_the_option(tmp_path, out_dir, capsys, landmarks):
    # a missing CSV was "transform file 'nope.csv' does not exist", no option named
    (tmp_path / "folder").mkdir()
    np.save(tmp_path / "f.npy", _picture())
    inputs = [tmp_path / "f.npy"]
    _refused(
        [*inputs, *inputs, "-o", out_dir / "r.npy", "--landmarks", tmp_path / landmarks],
        inputs,
        out_dir,
        capsys,
        command="register",
        names=["error: --landmarks: ", landmarks, "expected a BigWarp landmark CSV"],
    )


@pytest.mark.parametrize(
    "scale, dtype, note",
    [
        (1.0, "uint8", "take at most 2 grey levels"),  # an image in [0, 1] as uint8
        (1000.0, "uint8", "lie outside uint8's range [0, 255] and are clipped"),
        (200.0, "uint8", None),  # fits: nothing to say
        (1.0, "float32", None),
    ],
)
def test_register_says_what_an_integer_dtype_loses(tmp_path, capsys, scale, dtype, note):
    picture = _picture()
    picture = (picture - picture.min()) / np.ptp(picture) * scale  # [0, scale]
    np.save(tmp_path / "f.npy", picture.astype(np.float32))
    out = tmp_path / "r.tif"
    code = _cli.main(
        ["register", str(tmp_path / "f.npy"), str(tmp_path / "f.npy"), "-o", str(out),
         "--model", "translation", "--dtype", dtype, "--quiet"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    written = tifffile.imread(out)
    assert written.dtype == np.dtype(dtype)
    if note is None:
        assert "note:" not in err, err
        return
    assert f"napari-simwarp register: note: --dtype {dtype}: " in err and note in err, err
    # the figures said are the file's: its distinct levels, or its clipped share
    if "levels" in note:
        assert len(np.unique(written)) <= 2
    else:
        # fixed onto itself: the warped image is the input, up to interpolation noise
        share = float(err.split("values (")[1].split("%")[0])
        assert share == pytest.approx(100 * np.mean(np.rint(picture) > 255), abs=0.5)
        assert np.all(written[picture > 260] == 255)  # clipped, not wrapped around
