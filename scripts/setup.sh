#!/usr/bin/env bash
# Create .venv (if missing) and install napari-simwarp into it, editable, with the extras
# given as arguments (e.g. `bash scripts/setup.sh testing,bench`).
#
# torch is installed first, pinned by SIMWARP_TORCH (default torch==2.13.0, the CPU build
# these machines cache; an unpinned torch pulls several GB of CUDA wheels). On a GPU
# machine, set SIMWARP_TORCH=torch (or install torch yourself first) to get a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/python -m pip install -q "${SIMWARP_TORCH:-torch==2.13.0}"
fi
if [ -n "$extras" ]; then
    .venv/bin/python -m pip install -q -e ".[$extras]"
else
    .venv/bin/python -m pip install -q -e .
fi
