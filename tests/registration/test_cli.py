"""The ``register`` subcommand on files."""

import argparse

import numpy as np
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
