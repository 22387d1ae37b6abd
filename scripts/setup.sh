#!/usr/bin/env bash
# Create .venv (if missing) and install napari-simwarp into it, editable, with the extras
# given as arguments (e.g. `bash scripts/setup.sh testing,bench`).
#
# torch is installed first (unless .venv has one), pinned by SIMWARP_TORCH (default
# torch==2.13.0) from pip's usual index, or from SIMWARP_TORCH_INDEX where set. Which
# build that is depends on the index: on Linux x86-64, PyPI's torch is the CUDA build
# (several GB; it runs on the CPU too), a local wheel cache may serve the CPU build
# (2.13.0+cpu). To choose:
#   CPU build:  SIMWARP_TORCH_INDEX=https://download.pytorch.org/whl/cpu bash scripts/setup.sh
#   CUDA build for this machine's driver, and the CUDA kernels: bash scripts/setup_cuda.sh
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    if ! "$python" -c "import venv, ensurepip" 2>/dev/null; then
        # Debian and Ubuntu ship python3 without venv: install it where this user may
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            DEBIAN_FRONTEND=noninteractive apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-pip >/dev/null
        else
            echo "scripts/setup.sh: $python cannot create a virtual environment (no venv or" >&2
            echo "ensurepip module); on Debian or Ubuntu: sudo apt-get install python3-venv" >&2
            exit 1
        fi
    fi
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    index=()
    if [ -n "${SIMWARP_TORCH_INDEX:-}" ]; then
        index=(--index-url "$SIMWARP_TORCH_INDEX")
    fi
    .venv/bin/python -m pip install -q "${SIMWARP_TORCH:-torch==2.13.0}" ${index[@]+"${index[@]}"}
fi
if [ -n "$extras" ]; then
    .venv/bin/python -m pip install -q -e ".[$extras]"
else
    .venv/bin/python -m pip install -q -e .
fi
torch_build=$(.venv/bin/python -c "import torch; print(torch.__version__, torch.version.cuda or 'none')")
echo "scripts/setup.sh: .venv has torch ${torch_build% *} (CUDA: ${torch_build#* })"
