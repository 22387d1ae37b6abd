"""io/omezarr.py in a base install (no zarr, dask or ngff-zarr, simulated by
tests/_blocker): writing or reading an OME-Zarr image says which extra to install, before
anything is written, instead of a raw ModuleNotFoundError for dask or ngff_zarr."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.base_install import BLOCKER

ROOT = Path(__file__).resolve().parents[2]


def test_write_and_read_name_the_large_extra_without_it(tmp_path):
    code = textwrap.dedent(
        """
        import numpy as np
        from napari_simwarp._extras import MissingExtraError
        from napari_simwarp.io.omezarr import read_ome_zarr, write_ome_zarr

        for call in (
            lambda: write_ome_zarr("out.zarr", np.zeros((2, 8, 8), np.float32), axes="tyx"),
            lambda: read_ome_zarr("in.zarr"),
        ):
            try:
                call()
            except MissingExtraError as exc:
                print("refused:", exc)
            else:
                print("not refused")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BLOCKER), str(ROOT / "src")])}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and len(lines) == 2, done.stdout + done.stderr
    for line, what in zip(lines, ("writing an OME-Zarr store (out.zarr)", "reading an OME-Zarr")):
        assert line.startswith(f"refused: {what}"), line
        assert "pip install 'napari-simwarp[large]'" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written
