#!/usr/bin/env bash
# CI: the command line in a base install (`pip install napari-simwarp`, no extras) on a
# fresh virtual environment: a TIFF stack drift-corrected into a TIFF with no zarr, dask or
# ngff-zarr, and an OME-Zarr output refused before any work with the line that installs
# them. Pure-torch ops (SIMWARP_BACKEND=torch): no kernel build. About a minute or two.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
base="${SIMWARP_BASE_VENV:-/tmp/simwarp-base}"
rm -rf "$base"
python3 -m venv "$base"
"$base/bin/pip" install -q --no-compile "${SIMWARP_TORCH:-torch==2.13.0}"
"$base/bin/pip" install -q --no-compile .
for module in zarr dask ngff_zarr distributed napari; do
    if "$base/bin/python" -c "import $module" 2>/dev/null; then
        echo "ci_base_install: $module is installed in the base install" >&2
        exit 1
    fi
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
"$base/bin/python" - <<'PY'
import numpy as np
import tifffile
from napari_simwarp import data

stack, shifts = data.drifting_timelapse(frames=6, size=64)
tifffile.imwrite("stack.tif", (np.clip(stack, 0, 1) * 1000).astype(np.uint16))  # a camera's type
np.save("shifts.npy", shifts)
PY
export SIMWARP_BACKEND=torch
"$base/bin/napari-simwarp" register-stack stack.tif -o aligned.tif --quiet
"$base/bin/python" - <<'PY'
import pathlib

import numpy as np
import tifffile
from napari_simwarp.registration import load_transform

aligned = tifffile.imread("aligned.tif")
assert aligned.shape == (6, 64, 64) and aligned.dtype == np.uint16, aligned.shape
found = [load_transform(p).matrix[:2, 2] for p in sorted(pathlib.Path("aligned.tif.transforms").glob("*.npz"))]
np.testing.assert_allclose(found, np.load("shifts.npy"), atol=0.25)
print("ci_base_install: register-stack TIFF -> TIFF in a base install: ok")
PY
status=0
"$base/bin/napari-simwarp" register-stack stack.tif -o aligned.zarr 2>err.txt || status=$?
if [ "$status" != 2 ] || ! grep -q "pip install 'napari-simwarp\[large\]'" err.txt || [ -e aligned.zarr ]; then
    echo "ci_base_install: an OME-Zarr output was not refused up front (exit $status):" >&2
    cat err.txt >&2
    exit 1
fi
echo "ci_base_install: OME-Zarr output refused with the install line: ok"
