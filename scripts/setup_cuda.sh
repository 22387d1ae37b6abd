#!/usr/bin/env bash
# GPU users' setup, the CUDA counterpart of scripts/setup.sh: one command that creates .venv
# (if missing) with the CUDA build of torch that this machine's NVIDIA driver runs,
# installs napari-simwarp into it (editable, with the extras given: `bash
# scripts/setup_cuda.sh all`), builds the compiled CPU and CUDA kernels and prints
# `napari-simwarp info` (the GPU, torch and its CUDA, which kernels run).
#
# The wheel: PyTorch's CUDA builds come from https://download.pytorch.org/whl/cuXYZ; the
# newest variant that the driver supports (nvidia-smi's "CUDA Version") is chosen.
#   SIMWARP_TORCH_VERSION    torch's version (default 2.13.0)
#   SIMWARP_CUDA_VARIANTS    the variants to choose from, newest first
#                            (default: cu130 cu129 cu128 cu126 cu124 cu121 cu118)
#   CUDA_HOME                the CUDA toolkit that builds the kernels (default: the first
#                            of /usr/local/cuda, /usr/local/cuda-* whose nvcc matches
#                            torch's CUDA major version; scripts/cuda_toolkit.sh)
#   SIMWARP_SETUP_DRY_RUN=1  print the choice and the commands instead of running them
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
version="${SIMWARP_TORCH_VERSION:-2.13.0}"
variants="${SIMWARP_CUDA_VARIANTS:-cu130 cu129 cu128 cu126 cu124 cu121 cu118}"
python="${PYTHON:-python3}"
dry="${SIMWARP_SETUP_DRY_RUN:-}"
run() {
    if [ -n "$dry" ]; then
        echo "would run: $*"
    else
        "$@"
    fi
}

if ! command -v nvidia-smi >/dev/null; then
    echo "setup_cuda: no NVIDIA driver here (nvidia-smi not found), so no CUDA build of" >&2
    echo "torch would run. For the CPU: bash scripts/setup.sh${extras:+ $extras}" >&2
    exit 2
fi
driver=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\)\.\([0-9]\).*/\1\2/p' | head -n 1)
if [ -z "$driver" ]; then
    echo "setup_cuda: nvidia-smi did not say which CUDA version the driver supports" >&2
    echo "(is the driver loaded? run nvidia-smi)" >&2
    exit 2
fi
choice=""
for variant in $variants; do
    if [ "${variant#cu}" -le "$driver" ]; then
        choice=$variant
        break
    fi
done
if [ -z "$choice" ]; then
    echo "setup_cuda: the driver supports CUDA ${driver%?}.${driver: -1}, older than every" >&2
    echo "CUDA build of torch $version ($variants); update the NVIDIA driver" >&2
    exit 2
fi
index="https://download.pytorch.org/whl/$choice"
echo "setup_cuda: the driver supports CUDA ${driver%?}.${driver: -1}: torch==$version from $index"

if [ -z "$dry" ] && [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
have=""
if [ -z "$dry" ]; then
    have=$(.venv/bin/python -c "import torch; print(torch.__version__)" 2>/dev/null || true)
fi
if [ "$have" != "$version+$choice" ]; then
    # A CPU build (2.13.0+cpu) satisfies torch==2.13.0 for pip: it must go first.
    [ -n "$have" ] && run .venv/bin/python -m pip uninstall -q -y torch
    run .venv/bin/python -m pip install -q "torch==$version" --index-url "$index"
fi
run bash scripts/setup.sh "$extras"  # the project (torch is there: left as it is)

if [ -n "$dry" ]; then
    torch_cuda="${choice:2:$((${#choice} - 3))}.${choice: -1}"
else
    torch_cuda=$(.venv/bin/python -c "import torch; print(torch.version.cuda or '')")
fi
source scripts/cuda_toolkit.sh
if toolkit=$(cuda_toolkit "${torch_cuda%%.*}"); then
    export CUDA_HOME="$toolkit"
    echo "setup_cuda: building the kernels with the CUDA toolkit in $CUDA_HOME"
else
    echo "setup_cuda: no CUDA ${torch_cuda%%.*}.x toolkit (bin/nvcc and include/) found: the" >&2
    echo "CUDA ops will run the pure torch operators (correct, slower). To build the CUDA" >&2
    echo "kernels, install a CUDA ${torch_cuda%%.*}.x toolkit and run this again with" >&2
    echo "CUDA_HOME set to its folder (e.g. CUDA_HOME=/usr/local/cuda-$torch_cuda)." >&2
fi
run .venv/bin/napari-simwarp build-kernels
run .venv/bin/napari-simwarp info
