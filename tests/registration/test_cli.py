"""The ``register`` subcommand on files."""

import argparse

import numpy as np
import pytest
import tifffile

from napari_simwarp import _cli
from napari_simwarp.registration import cli, load_transform
from tests.registration.cases import affine_pair, centered_affine, corner_error


def _parse(argv):
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["register", *argv])


def test_cli_register_files(tmp_path, rng):
    shape = (96, 96)
    m = centered_affine(np.eye(2), [2.5, -1.25], shape)
    fixed, moving = affine_pair(rng, shape, m)
    tifffile.imwrite(tmp_path / "fixed.tif", (fixed * 1000).astype(np.uint16))
    np.save(tmp_path / "moving.npy", moving)
    args = _parse(
        [
            str(tmp_path / "fixed.tif"),
            str(tmp_path / "moving.npy"),
            "-o",
            str(tmp_path / "out" / "warped.tif"),
            "--model",
            "translation",
            "--quiet",
        ]
    )
    assert args.func(args) == 0
    warped = tifffile.imread(tmp_path / "out" / "warped.tif")
    assert warped.shape == shape and warped.dtype == moving.dtype  # the moving file's dtype
    t = load_transform(tmp_path / "out" / "warped.tif.transform.npz")
    assert corner_error(t.matrix, m, shape) < 0.1


def test_cli_missing_file_is_a_clear_error(tmp_path, capsys):
    code = _cli.main(
        [
            "register",
            str(tmp_path / "nope.tif"),
            str(tmp_path / "b.npy"),
            "-o",
            str(tmp_path / "o.tif"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "napari-simwarp register: error:" in err and "does not exist" in err


def test_cli_register_in_physical_units(tmp_path, rng):
    # the moving file at half the fixed file's resolution, its first pixel half a fixed
    # pixel further in: aligned in space, so the physical answer is the identity
    from scipy import ndimage as ndi

    from tests.registration.cases import textured

    fixed = textured(rng, (96, 96)).astype(np.float32)
    moving = ndi.zoom(ndi.gaussian_filter(fixed, 1.0), 0.5, order=1, grid_mode=True, mode="nearest")
    np.save(tmp_path / "fixed.npy", fixed)
    np.save(tmp_path / "moving.npy", moving)
    out = tmp_path / "warped.npy"
    code = _cli.main(
        [
            "register", str(tmp_path / "fixed.npy"), str(tmp_path / "moving.npy"), "-o", str(out),
            "--fixed-spacing", "0.2", "--moving-spacing", "0.4,0.4",
            "--moving-origin", "0.1,0.1", "--quiet",
        ]
    )  # fmt: skip
    assert code == 0
    t = load_transform(tmp_path / "warped.npy.transform.npz")
    assert t.fixed_grid.spacing == (0.2, 0.2) and t.moving_grid.origin == (0.1, 0.1)
    np.testing.assert_allclose(t.physical_matrix, np.eye(3), atol=0.02)
    assert np.load(out).shape == fixed.shape


def test_cli_spacing_of_the_wrong_length_is_a_clear_error(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.random.rand(32, 32))
    argv = ["register", str(tmp_path / "a.npy"), str(tmp_path / "a.npy"), "-o"]
    code = _cli.main([*argv, str(tmp_path / "o.npy"), "--fixed-spacing", "1,2,3"])
    assert code == 2
    err = capsys.readouterr().err
    assert "error: --fixed-spacing must have one value per axis (2, array order)" in err
    assert not (tmp_path / "o.npy").exists()
    with pytest.raises(SystemExit) as stop:  # argparse's own exit for a malformed option
        _cli.main([*argv, str(tmp_path / "o.npy"), "--moving-spacing", "0.2;0.2"])
    assert stop.value.code == 2
    assert "expected a number or comma-separated numbers" in capsys.readouterr().err


def test_cli_landmarks_from_a_bigwarp_file(tmp_path):
    # A 70° rotation and a large shift, beyond the pyramid: the BigWarp landmarks (its
    # "target" columns are FIXED's points, "moving" MOVING's, x,y order, physical units)
    # place it. The file is written by hand, as BigWarp writes it.
    from scipy import ndimage as ndi

    from tests.registration.cases import textured

    shape = (96, 96)
    t = np.deg2rad(70)
    m = centered_affine(
        np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]]), [9, -12], shape
    )
    fixed = textured(np.random.default_rng(5), shape).astype(np.float32)
    moving = ndi.affine_transform(fixed, np.linalg.inv(m), order=3, mode="nearest")
    np.save(tmp_path / "fixed.npy", fixed)
    np.save(tmp_path / "moving.npy", moving)
    spacing = 0.5  # both images: the file holds physical coordinates
    rows = []
    for i, p in enumerate([[15.0, 20.0], [25.0, 80.0], [80.0, 30.0], [70.0, 75.0]]):
        q = m[:2, :2] @ p + m[:2, 2]
        moving_xy = [q[1] * spacing, q[0] * spacing]
        target_xy = [p[1] * spacing, p[0] * spacing]
        rows.append(",".join(f'"{v}"' for v in [f"Pt-{i}", "true", *moving_xy, *target_xy]))
    (tmp_path / "landmarks.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "warped.npy"
    argv = ["register", str(tmp_path / "fixed.npy"), str(tmp_path / "moving.npy"), "-o", str(out)]
    code = _cli.main(
        [
            *argv, "--model", "rigid", "--fixed-spacing", "0.5", "--moving-spacing", "0.5",
            "--landmarks", str(tmp_path / "landmarks.csv"), "--landmark-weight", "0.01",
            "--quiet",
        ]
    )  # fmt: skip
    assert code == 0
    t = load_transform(tmp_path / "warped.npy.transform.npz")
    assert corner_error(t.matrix, m, shape) < 0.2


def test_cli_bad_landmarks_file_is_a_clear_error(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.random.rand(32, 32))
    (tmp_path / "l.csv").write_text('"Pt-0","true","1.0"\n')
    argv = ["register", str(tmp_path / "a.npy"), str(tmp_path / "a.npy"), "-o"]
    code = _cli.main([*argv, str(tmp_path / "o.npy"), "--landmarks", str(tmp_path / "l.csv")])
    assert code == 2
    err = capsys.readouterr().err
    assert "--landmarks:" in err and "BigWarp landmark CSV" in err
    code = _cli.main([*argv, str(tmp_path / "o.npy"), "--landmark-weight", "1"])
    assert code == 2
    assert "error: --landmark-weight > 0 needs landmarks" in capsys.readouterr().err
    assert not (tmp_path / "o.npy").exists()


# -- register-stack: the pixel size ---------------------------------------------------------


def _tilted_stack(rng):
    """``(stack (2, Z, Y, X), spacing, truth)``: frame 1 is frame 0 rotated by 3° about x
    in physical space (z step 3× the xy pixel size); ``truth`` is frame 1's pixel matrix."""
    from scipy import ndimage as ndi

    spacing = (3.0, 1.0, 1.0)
    shape = (16, 48, 48)
    first = ndi.gaussian_filter(rng.standard_normal(shape), sigma=3.0 / np.array(spacing))
    a = np.deg2rad(3.0)
    rot = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    center = (np.array(shape) - 1) / 2 * np.array(spacing)
    physical = np.eye(4)
    physical[:3, :3], physical[:3, 3] = rot, center - rot @ center
    g = np.diag([*spacing, 1.0])
    pixels = np.linalg.inv(g) @ physical @ g  # frame_1(x) = frame_0(pixels · x)
    second = ndi.affine_transform(first, pixels, order=3, mode="nearest")
    return np.stack([first, second]).astype(np.float32), spacing, np.linalg.inv(pixels)


def _needs_the_large_extra():
    """OME-Zarr outputs (and inputs) need zarr, dask and ngff-zarr: skipped in a base
    install (tests/registration/test_cli_base_install.py covers it)."""
    for name in ("zarr", "dask.array", "ngff_zarr"):
        pytest.importorskip(name)


def _stack_argv(src, out, *extra):
    return ["register-stack", str(src), "-o", str(out), "--model", "rigid", "--metric", "ncc",
            "--quiet", *extra]  # fmt: skip


def test_cli_register_stack_spacing_flag(tmp_path, rng, capsys):
    _needs_the_large_extra()
    stack, spacing, truth = _tilted_stack(rng)
    tifffile.imwrite(tmp_path / "s.tif", stack)
    out = tmp_path / "o.zarr"
    code = _cli.main(_stack_argv(tmp_path / "s.tif", out, "--spacing", "3,1,1"))
    assert code == 0, capsys.readouterr().err
    t = load_transform(tmp_path / "o.zarr.transforms" / "frame_00001.transform.npz")
    assert t.fixed_grid.spacing == spacing and t.moving_grid.spacing == spacing
    assert corner_error(t.matrix, truth, stack.shape[1:]) < 0.15
    from napari_simwarp.io.omezarr import read_ome_zarr

    assert read_ome_zarr(out)[2] == list(spacing)  # the output carries the pixel size
    code = _cli.main(_stack_argv(tmp_path / "s.tif", tmp_path / "p.zarr", "--spacing", "3,1"))
    assert code == 2
    assert "spacing must have one value per axis (3, array order)" in capsys.readouterr().err
    assert not (tmp_path / "p.zarr").exists()


def test_cli_register_stack_reads_the_ome_zarr_pixel_size(tmp_path, rng, capsys):
    _needs_the_large_extra()
    from napari_simwarp.io.omezarr import read_ome_zarr, write_ome_zarr

    stack, spacing, truth = _tilted_stack(rng)
    origin = (4.0, -3.0, 12.5)
    src = write_ome_zarr(
        tmp_path / "s.zarr", stack, axes="tzyx", pixel_size=spacing, origin=origin, levels=1
    )
    code = _cli.main(_stack_argv(src, tmp_path / "o.zarr")[:-1])  # not --quiet: the note
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "pixel size (3.0, 1.0, 1.0) and origin (4.0, -3.0, 12.5)" in captured.out
    assert "OME-Zarr metadata" in captured.out
    t = load_transform(tmp_path / "o.zarr.transforms" / "frame_00001.transform.npz")
    assert t.fixed_grid.spacing == spacing and t.fixed_grid.origin == origin
    assert corner_error(t.matrix, truth, stack.shape[1:]) < 0.15
    # the aligned stack lies where the input did
    written = read_ome_zarr(tmp_path / "o.zarr")
    assert written.pixel_size == list(spacing) and written.origin == list(origin)
    # --spacing overrides the metadata (here: voxel space, which cannot follow the tilt)
    code = _cli.main(_stack_argv(src, tmp_path / "v.zarr", "--spacing", "1"))
    assert code == 0 and "OME-Zarr metadata" not in capsys.readouterr().out
    t = load_transform(tmp_path / "v.zarr.transforms" / "frame_00001.transform.npz")
    assert t.fixed_grid.spacing == (1.0, 1.0, 1.0)
    assert corner_error(t.matrix, truth, stack.shape[1:]) > 0.5


def test_cli_register_stack_reads_a_npy_stack_frame_by_frame(tmp_path, capsys):
    _needs_the_large_extra()
    from napari_simwarp import data
    from napari_simwarp.io.omezarr import read_ome_zarr

    stack, shifts = data.drifting_timelapse(frames=4, size=64)
    np.save(tmp_path / "s.npy", stack)
    out = tmp_path / "o.zarr"
    code = _cli.main(["register-stack", str(tmp_path / "s.npy"), "-o", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    found = [
        load_transform(tmp_path / "o.zarr.transforms" / f"frame_{t:05d}.transform.npz").matrix
        for t in range(4)
    ]
    np.testing.assert_allclose([m[:2, 2] for m in found], shifts, atol=0.2)
    assert read_ome_zarr(out)[0].shape == stack.shape
    np.save(tmp_path / "flat.npy", stack[0])
    code = _cli.main(["register-stack", str(tmp_path / "flat.npy"), "-o", str(tmp_path / "f.zarr")])
    assert code == 2 and "expected a (T, Y, X) or (T, Z, Y, X) stack" in capsys.readouterr().err


def test_cli_register_stack_metric_defaults_as_the_api():
    """``register-stack`` without ``--metric`` leaves it to register_stack (None: "ncc" but
    for the diffeomorphic model, "lncc"), and its help says so."""
    parser = argparse.ArgumentParser()
    stack = cli.add_stack_parser(parser.add_subparsers(dest="command"))
    argv = ["register-stack", "s.tif", "-o", "o.zarr", "--model", "rigid"]
    assert parser.parse_args(argv).metric is None
    assert parser.parse_args([*argv, "--metric", "lncc"]).metric == "lncc"
    help_text = " ".join(stack.format_help().split())
    assert "default: ncc for linear models, lncc for dense ones" in help_text
