"""The suite where the [large] extra is absent (the GPU check's machines, a base install):
every test module that needs dask, zarr or ngff-zarr is skipped, none fails to import
(issue 23: eight modules failed at collection there)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.base_install import BLOCKER

ROOT = Path(__file__).resolve().parents[1]
#: the [large] extra's packages, and the readers napari-ome-zarr brings with them
LARGE = ("dask", "zarr", "ngff_zarr", "distributed", "napari_ome_zarr", "ome_zarr")


def test_every_module_is_collected_or_skipped_without_the_large_extra():
    path = os.pathsep.join([str(BLOCKER), str(ROOT / "src")])
    env = {**os.environ, "PYTHONPATH": path, "SIMWARP_BLOCK_MODULES": ",".join(LARGE)}
    probe = subprocess.run(
        [sys.executable, "-c", "import dask"], env=env, capture_output=True, text=True
    )
    assert "No module named 'dask'" in probe.stderr  # the blocker works
    # napari needs dask itself: its pytest plugin and the widget tests go with the extra.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "no:napari", "-p", "no:napari-plugin-engine", "-p", "no:xdist",
         "tests", "--ignore=tests/_qt"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    last = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0 and "error" not in last, done.stdout[-3000:] + done.stderr
    assert " collected" in last
