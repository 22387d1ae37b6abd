"""The command line as a base install runs it (no zarr, dask, ngff-zarr or distributed):
in a subprocess whose imports of those fail (tests/_blocker/sitecustomize.py)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

BLOCKER = pathlib.Path(__file__).parent / "_blocker"


def run_cli(argv, cwd, timeout=600) -> subprocess.CompletedProcess:
    """``napari-simwarp ARGV`` in ``cwd`` with the optional packages blocked (pure-torch
    ops: no kernel build); the process also prints, last, whether any blocked package
    got imported (it cannot: this checks the blocker)."""
    path = os.pathsep.join([str(BLOCKER), os.environ.get("PYTHONPATH", "")])
    code = (
        "import sys\n"
        "from napari_simwarp._cli import main\n"
        "try:\n"
        "    code = main(sys.argv[1:])\n"
        "finally:\n"
        "    print('loaded:', sorted(m for m in sys.modules if m.split('.')[0] in "
        "('zarr', 'dask', 'ngff_zarr', 'distributed')))\n"
        "raise SystemExit(code)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, argv)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": path, "SIMWARP_BACKEND": "torch"},
    )
