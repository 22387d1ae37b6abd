#!/usr/bin/env bash
# One command that validates the CUDA kernels on a machine with a GPU, designed to finish in
# under 20 minutes on one H100, printing a short table last:
#
#   1. build   the CPU and CUDA extensions, verbosely (the toolkit whose nvcc matches torch)
#   2. check   the self-check "auto" runs (each op against the pure torch path), figures
#   3. parity  every CUDA op against the CPU kernels and float64 (tests/csrc/test_host_shim.py,
#              its "cuda" side: sizes, borders, dtypes, 1D/2D/3D)
#   4. memcheck  the parity run under compute-sanitizer --tool memcheck
#   5. tests   the kernel and operator tests (tests/csrc, tests/ops) with the GPU
#   6. bench   benchmarks/bench_gpu.py: each kernel against the bytes it moves at measured
#              bandwidth, each op against the pure torch path and its peers; rewrites the
#              GPU section of docs/benchmarks.md
#
#   PYTHON=...                  the interpreter, with a CUDA build of torch (default: the
#                               first of .venv-cuda/bin/python, .venv/bin/python, python3
#                               that has one)
#   SIMWARP_GPU_CHECK_LOGS=dir  where each step's log goes (default gpu-check-logs/)
#
# Exits 2 at once without a GPU; otherwise 1 if any step failed, 0 if all passed.
set -uo pipefail
cd "$(dirname "$0")/.."
logs="${SIMWARP_GPU_CHECK_LOGS:-gpu-check-logs}"
start_all=$SECONDS

has_cuda_torch() { "$1" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; }
python="${PYTHON:-}"
if [ -z "$python" ]; then
    for candidate in .venv-cuda/bin/python .venv/bin/python python3; do
        if has_cuda_torch "$candidate"; then
            python=$candidate
            break
        fi
    done
fi
if [ -z "$python" ] || ! command -v nvidia-smi >/dev/null || ! has_cuda_torch "$python"; then
    {
        echo "gpu_check: no usable CUDA GPU here (nvidia-smi: $(command -v nvidia-smi || echo missing);"
        echo "  torch.cuda.is_available() is False for ${python:-every interpreter tried})."
        echo "  This script validates the CUDA kernels on a machine with a GPU. Without one, their"
        echo "  logic is tested by the host shim: pytest tests/csrc/test_host_shim.py"
    } >&2
    exit 2
fi
torch_cuda=$("$python" -c "import torch; print(torch.version.cuda)")
source scripts/cuda_toolkit.sh
if toolkit=$(cuda_toolkit "${torch_cuda%%.*}"); then
    export CUDA_HOME="$toolkit"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" SIMWARP_BACKEND=auto
mkdir -p "$logs"
pytest_args=(-q -p no:cacheprovider)
if "$python" -c "import xdist" 2>/dev/null; then
    parallel=(-n 8)
else
    parallel=()
fi

names=() results=() times=() notes=()
# step NAME LIMIT_S NOTE COMMAND...: run it with its output in $logs/NAME.log.
step() {
    local name=$1 limit=$2 note=$3
    shift 3
    local t0=$SECONDS
    echo "== $name: $*"
    timeout "$limit" "$@" >"$logs/$name.log" 2>&1
    local rc=$?
    local status=PASS
    [ $rc -eq 124 ] && status="TIMEOUT (${limit} s)"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && status="FAIL (exit $rc)"
    tail -n 5 "$logs/$name.log"
    names+=("$name") results+=("$status") times+=($((SECONDS - t0))) notes+=("$note")
}

step build 900 "verbose log: $logs/build.log" "$python" -c "
import json, torch
from napari_simwarp.backend import build_kernels
built = build_kernels(verbose=True)
print(json.dumps(built))
assert built['cuda'] and torch._C._dispatch_has_kernel_for_dispatch_key('simwarp::box_sum', 'CUDA'), built
"
step self_check 300 "each op against pure torch on the GPU" "$python" -c "
import json, torch
from napari_simwarp import backend_info
info = backend_info()
checks = info['self_check']
print(json.dumps(checks, indent=1))
failed = [op for device in checks.values() for op, c in device.items() if not c['passed']]
assert checks and not failed, failed
"
step parity 600 "CUDA vs CPU kernels and float64" \
    "$python" -m pytest "${pytest_args[@]}" tests/csrc/test_host_shim.py -k cuda
if command -v compute-sanitizer >/dev/null || [ -x "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer" ]; then
    sanitizer=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
    # No caching allocator: an access past a tensor must fall outside any allocation.
    step memcheck 900 "compute-sanitizer memcheck of the parity run" \
        env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$sanitizer" --tool memcheck --error-exitcode 1 \
        --target-processes all "$python" -m pytest "${pytest_args[@]}" tests/csrc/test_host_shim.py -k cuda -x
else
    names+=(memcheck) results+=("FAIL (compute-sanitizer not found)") times+=(0) notes+=("")
fi
step tests 900 "tests/csrc tests/ops with the GPU" \
    "$python" -m pytest "${pytest_args[@]}" "${parallel[@]}" tests/csrc tests/ops
step bench 600 "rewrote the GPU section of docs/benchmarks.md" "$python" benchmarks/bench_gpu.py

echo
echo "gpu_check: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)," \
    "torch $("$python" -c 'import torch; print(torch.__version__)'), CUDA_HOME=${CUDA_HOME:-unset}," \
    "$((SECONDS - start_all)) s in all; logs in $logs/"
if [ -f "$logs/bench.log" ]; then  # the ops against the pure torch path and the peers
    grep -E "^\| (local_std|ssim|local_ncc) " "$logs/bench.log"
fi
printf '\n%-11s %-28s %6s  %s\n' step result "s" note
failed=0
for i in "${!names[@]}"; do
    printf '%-11s %-28s %6s  %s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}" "${notes[$i]}"
    [ "${results[$i]}" = PASS ] || failed=1
done
exit $failed
