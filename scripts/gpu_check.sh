#!/usr/bin/env bash
# The GPU check: one command that validates the CUDA path on a machine with a GPU and
# measures it, within 8 minutes on one H100 or H200, build included. Each step has its own
# time box inside one overall deadline, so the command always ends on its own:
#
#   1. build      the CPU and CUDA extensions, for the GPU present only (its sm_XY)
#   2. self_check each compiled op against pure torch on the GPU (what "auto" runs)
#   3. refusals   the C++ refusals of the issue-23 crash, each in a child process, and the
#                 "auto" refusal probe; if one crashes: the compilers and libstdc++ in play
#                 and a rebuild with the system g++ (does another compiler fix it?)
#   4. parity     every CUDA op against the CPU kernels and float64 (test_host_shim*.py -k cuda)
#   5. bench      benchmarks/bench_gpu.py: kernels against the bytes they move, ops against
#                 pure torch and the peers that are installed or carried (below)
#   6. match_template  benchmarks/match_template_float32.py: float32 on the GPU against
#                 scikit-image's float64 on the CPU (accuracy, float64 results, time; in
#                 the bench log)
#   7. register   benchmarks/bench_gpu_register.py: registration on the GPU against the
#                 same machine's CPU, on known truth (2-D/3-D affine and deformable, drift,
#                 2048² and 192³), and a batch of 16 pairs against one run per pair
#   8. suite      the test suite without the Qt tests, on CUDA, in parallel; beside it,
#                 compute-sanitizer memcheck of the parity tests, then racecheck of the
#                 kernels that share memory (fused SSIM, local std: the shim runs one legal
#                 order of a block's threads, so only the GPU can show a shared-memory race)
#
# Output: one folder ($SIMWARP_GPU_CHECK_OUT, default gpu-check/) with summary.md (the
# step table, the versions, and the docs/benchmarks.md sections) and 7 logs: build,
# checks (self-check + refusals), parity, bench, register, suite, memcheck. Back on a
# development machine: `python benchmarks/bench_gpu.py --splice gpu-check/summary.md`
# puts the measured sections into docs/benchmarks.md.
#
# With the device tool (its $OUT comes back; at most 8 files):
#   SIMWARP_GPU_CHECK_OUT=$OUT bash scripts/gpu_check.sh
# The peers that are not installed on the GPU machines travel as wheels in .gpu-wheels/
# (git-ignored; pass `carry: [".gpu-wheels"]`), fetched beforehand on a machine with PyPI:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 -d .gpu-wheels pytorch-msssim kornia kornia-rs monai
# They are installed into a temporary folder on PYTHONPATH, never into the machine's Python.
#
#   PYTHON=...                     the interpreter, with a CUDA build of torch (default: the
#                                  first of .venv-cuda/bin/python, .venv/bin/python, python3
#                                  that has one)
#   SIMWARP_GPU_CHECK_BUDGET=460   seconds for the whole check (the steps share it)
#   SIMWARP_GPU_CHECK_SUITE="-k 'not cpu'"  what the suite step selects (pytest arguments)
#
# Exits 2 at once without a GPU; otherwise 1 if any step failed or was cut, 0 if all passed.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${SIMWARP_GPU_CHECK_OUT:-gpu-check}"
budget="${SIMWARP_GPU_CHECK_BUDGET:-460}"
deadline=$((SECONDS + budget))

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
mkdir -p "$out"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
torch_cuda=$("$python" -c "import torch; print(torch.version.cuda)")
source scripts/cuda_toolkit.sh
if toolkit=$(cuda_toolkit "${torch_cuda%%.*}"); then
    export CUDA_HOME="$toolkit"
fi
# Build for the GPU that is here only (one architecture: half the build time of several).
if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
    TORCH_CUDA_ARCH_LIST=$("$python" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
    export TORCH_CUDA_ARCH_LIST
fi
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" SIMWARP_BACKEND=auto
peers_note="none carried"
if compgen -G ".gpu-wheels/*.whl" >/dev/null; then
    if "$python" -m pip install -q --no-deps --no-index --target "$scratch/peers" .gpu-wheels/*.whl \
        >"$scratch/peers.log" 2>&1; then
        export PYTHONPATH="$PYTHONPATH:$scratch/peers"
        peers_note="installed from .gpu-wheels: $(cd .gpu-wheels && ls ./*.whl | sed 's|^\./||; s|-[0-9].*||' | tr '\n' ' ')"
    else
        peers_note="the carried wheels failed to install: $(tail -n 1 "$scratch/peers.log")"
    fi
fi
cores=$(nproc)

names=() results=() times=() notes=()
# left: seconds before the deadline, less what the later steps need at least
left() { echo $((deadline - SECONDS - $1)); }
record() { names+=("$1") results+=("$2") times+=("$3") notes+=("$4"); }
# step NAME LIMIT RESERVE LOG NOTE COMMAND...: run it time-boxed to min(LIMIT, time left less
# RESERVE), appending to LOG. SIGINT first (pytest prints what failed so far), then KILL.
step() {
    local name=$1 limit=$2 reserve=$3 log=$4 note=$5
    shift 5
    local box
    box=$(left "$reserve")
    [ "$box" -gt "$limit" ] && box=$limit
    if [ "$box" -lt 5 ]; then
        record "$name" "SKIPPED (time box)" 0 "$note"
        return
    fi
    local t0=$SECONDS
    echo "== $name (time box ${box} s): $*" | tee -a "$out/$log.log"
    timeout -s INT -k 15 "$box" "$@" >>"$out/$log.log" 2>&1
    local rc=$?
    local status=PASS
    [ $rc -eq 124 ] && status="TIMEOUT (${box} s)"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && status="FAIL (exit $rc)"
    tail -n 3 "$out/$log.log"
    record "$name" "$status" $((SECONDS - t0)) "$note"
}

step build 180 300 build "verbose; arch $TORCH_CUDA_ARCH_LIST, MAX_JOBS $MAX_JOBS" "$python" -c "
import json, torch
from napari_simwarp.backend import build_kernels
built = build_kernels(verbose=True)
print(json.dumps(built))
assert built['cuda'] and torch._C._dispatch_has_kernel_for_dispatch_key('simwarp::box_sum', 'CUDA'), built
"
step self_check 45 280 checks "each op against pure torch on the GPU" "$python" -c "
import json
from napari_simwarp import backend_info
info = backend_info()
checks = info['self_check']
print(json.dumps(checks, indent=1))
failed = [op for device in checks.values() for op, c in device.items() if not c['passed']]
assert checks and not failed, failed
"
step refusals 90 250 checks "issue 23's crash: refused calls in child processes" \
    "$python" scripts/gpu_refusals.py "$scratch/alt-cache"
step parity 60 220 parity "CUDA vs CPU kernels and float64" \
    "$python" -m pytest -q -p no:cacheprovider tests/csrc/test_host_shim*.py -k cuda
step bench 90 190 bench "peers: $peers_note" \
    "$python" benchmarks/bench_gpu.py --markdown "$scratch/bench.md"
step match_template 45 180 bench "float32 on the GPU against scikit-image's float64" \
    "$python" benchmarks/match_template_float32.py --device cuda
# The benchmark skips the cases it has no time left for (its own budget, inside the box).
register_budget=$(left 160)
[ "$register_budget" -gt 135 ] && register_budget=135
[ "$register_budget" -lt 5 ] && register_budget=5
step register 150 150 register "GPU against this machine's $cores CPU cores" \
    "$python" benchmarks/bench_gpu_register.py --budget "$register_budget" \
    --markdown "$scratch/register.md"

# The suite on CUDA, and memcheck of the parity tests beside it (two of the cores).
suite_args=(-k "not cpu")
if [ -n "${SIMWARP_GPU_CHECK_SUITE:-}" ]; then
    eval "suite_args=(${SIMWARP_GPU_CHECK_SUITE})"
fi
sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer")
memcheck_pid=
box=$(left 5)
if [ -x "$sanitizer" ] && [ "$box" -ge 10 ]; then
    echo "== memcheck (time box ${box} s)" >"$out/memcheck.log"
    # No caching allocator: an access past a tensor must fall outside any allocation.
    (
        t0=$SECONDS
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -s INT -k 15 "$box" "$sanitizer" --tool memcheck \
            --error-exitcode 1 --target-processes all "$python" -m pytest -q -p no:cacheprovider \
            tests/csrc/test_host_shim*.py -k cuda -x >>"$out/memcheck.log" 2>&1
        rc=$?
        race_box=$((box - (SECONDS - t0)))
        if [ "$rc" -eq 0 ] && [ "$race_box" -ge 20 ]; then
            echo "== racecheck of the shared-memory kernels (time box ${race_box} s)" >>"$out/memcheck.log"
            PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -s INT -k 15 "$race_box" "$sanitizer" \
                --tool racecheck --error-exitcode 1 --target-processes all "$python" -m pytest \
                -q -p no:cacheprovider tests/csrc/test_host_shim.py -k "fused and cuda" -x \
                >>"$out/memcheck.log" 2>&1
            rc=$?
        fi
        echo "$rc $((SECONDS - t0))" >"$scratch/memcheck.rc"
    ) &
    memcheck_pid=$!
fi
workers=$((cores > 4 ? cores - 2 : 1))
step suite 600 5 suite "-n $workers ${suite_args[*]}, no Qt" "$python" -m pytest -q \
    -p no:cacheprovider -n "$workers" --durations=10 tests --ignore=tests/_qt "${suite_args[@]}"
if [ -n "$memcheck_pid" ]; then
    wait "$memcheck_pid"
    read -r rc took <"$scratch/memcheck.rc"
    status=PASS
    [ "$rc" -eq 124 ] && status="TIMEOUT"
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && status="FAIL (exit $rc)"
    record memcheck "$status" "$took" "compute-sanitizer memcheck of the parity tests, racecheck of the fused kernels"
elif [ -x "$sanitizer" ]; then
    record memcheck "SKIPPED (time box)" 0 ""
else
    record memcheck "FAIL (compute-sanitizer not found)" 0 ""
fi

# The summary: versions, the step table, the suite's last word, the measured sections.
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1)
failed=0
{
    echo "## GPU check: $(date -u +%Y-%m-%d), $gpu"
    echo
    echo "torch $("$python" -c 'import torch; print(torch.__version__)'), Python $("$python" -c 'import platform; print(platform.python_version())')," \
        "CUDA_HOME=${CUDA_HOME:-unset} (nvcc $("${CUDA_HOME:-/nonexistent}/bin/nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*' || echo '?'))," \
        "c++: $(${CXX:-c++} --version 2>/dev/null | head -n 1), $cores CPU cores;" \
        "$((SECONDS - deadline + budget)) s of a $budget s budget (\`bash scripts/gpu_check.sh\`)."
    echo
    echo "| step | result | s | note |"
    echo "|---|---|---:|---|"
    for i in "${!names[@]}"; do
        echo "| ${names[$i]} | ${results[$i]} | ${times[$i]} | ${notes[$i]} |"
        [ "${results[$i]}" = PASS ] || failed=1
    done
    echo
    echo "Suite: $(grep -E '(passed|failed|error)' "$out/suite.log" | tail -n 1)"
    echo
    for section in "$scratch/bench.md" "$scratch/register.md"; do
        [ -f "$section" ] && cat "$section" && echo
    done
} >"$out/summary.md"
cat "$out/summary.md"
exit $failed
