"""napari_simwarp.maps in a base install (no dask, simulated by tests/_blocker): the
tiled whole-array maps say which extra to install (they failed with a raw
ModuleNotFoundError for dask, NumPy input too); maps.plane needs none."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.base_install import BLOCKER

ROOT = Path(__file__).resolve().parents[1]


def test_tiled_maps_name_the_large_extra_and_plane_runs_without_it():
    code = textwrap.dedent(
        """
        import numpy as np
        from scipy import ndimage as ndi
        from napari_simwarp import maps
        from napari_simwarp._extras import MissingExtraError

        rng = np.random.default_rng(0)
        stack = rng.random((2, 24, 24))
        try:
            maps.local_std(stack, window=5, axes="tyx")
        except MissingExtraError as exc:
            print("refused:", exc)
        # plane: one frame's map, no dask; against SciPy (population std, reflect border)
        got = maps.plane("local_std", stack, index=(1,), axes="tyx", window=5)
        mean = ndi.uniform_filter(stack[1], 5, mode="reflect")
        sq = ndi.uniform_filter(stack[1] ** 2, 5, mode="reflect")
        print("plane error:", float(np.abs(got - np.sqrt(np.maximum(sq - mean**2, 0))).max()))
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(BLOCKER), str(ROOT / "src")]),
        "SIMWARP_BACKEND": "torch",
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and len(lines) == 2, done.stdout + done.stderr
    assert lines[0].startswith("refused: maps.local_std"), lines[0]
    assert "pip install 'napari-simwarp[large]'" in lines[0], lines[0]
    assert float(lines[1].split(": ")[1]) < 1e-5, lines[1]
