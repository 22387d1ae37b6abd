#!/usr/bin/env bash
# CI, no GPU needed: build the CUDA extension with the project's own loader against a CUDA
# build of torch, in a virtual environment of its own (.venv-cuda; the test suite's .venv
# keeps the pinned CPU torch), then run the kernel tests there: the CUDA registrations
# (tests/csrc/test_cuda_build.py), the host-shim parity tests and the rest of tests/csrc,
# all against torch's real CUDA headers and libraries.
#
#   SIMWARP_CUDA_TORCH     the torch to install (default torch==2.14.1, CUDA 13.0, the
#                          CUDA of the nvcc on these machines; about 5 GB with its libraries)
#   SIMWARP_CUDA_VENV      where (default .venv-cuda)
#   CUDA_HOME              the CUDA toolkit (default: the first of /usr/local/cuda,
#                          /usr/local/cuda-* whose nvcc matches torch's CUDA major version)
#   TORCH_CUDA_ARCH_LIST   the GPUs to build for (default 9.0: no GPU here to ask)
#
# Where that torch cannot be installed (no registry, no wheel for this platform), this
# says so and exits 0; a missing or mismatched toolkit fails under SIMWARP_REQUIRE_NVCC=1.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${SIMWARP_CUDA_VENV:-.venv-cuda}"
spec="${SIMWARP_CUDA_TORCH:-torch==2.14.1}"
python="${PYTHON:-python3}"
start=$SECONDS

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.version.cuda is None)" 2>/dev/null; then
    if ! "$venv/bin/python" -m pip install -q "$spec" ninja numpy scipy pytest; then
        echo "ci_cuda_build: SKIPPED: could not install $spec (a CUDA build of torch) here"
        exit 0
    fi
fi
torch_cuda=$("$venv/bin/python" -c "import torch; print(torch.version.cuda or '')")
if [ -z "$torch_cuda" ]; then
    echo "ci_cuda_build: SKIPPED: $spec installed a torch without CUDA"
    exit 0
fi

source scripts/cuda_toolkit.sh
toolkit=$(cuda_toolkit "${torch_cuda%%.*}" || true)
if [ -z "$toolkit" ]; then
    message="no CUDA ${torch_cuda%%.*}.x toolkit (bin/nvcc and include/) found; set CUDA_HOME"
    if [ "${SIMWARP_REQUIRE_NVCC:-0}" = "1" ]; then
        echo "ci_cuda_build: FAILED: $message" >&2
        exit 1
    fi
    echo "ci_cuda_build: SKIPPED: $message"
    exit 0
fi

echo "ci_cuda_build: torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)')," \
    "CUDA_HOME=$toolkit, TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}"
export CUDA_HOME="$toolkit" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" SIMWARP_REQUIRE_COMPILED=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/csrc
echo "ci_cuda_build: done in $((SECONDS - start)) s"
