# Sourced by ci_cuda_build.sh and gpu_check.sh: cuda_toolkit MAJOR prints the folder of a
# CUDA toolkit whose nvcc has that major version (CUDA_HOME if set, else the first of
# /usr/local/cuda, /usr/local/cuda-*), or nothing. It must be the toolkit's own folder, with
# bin/nvcc and include/cuda_runtime_api.h: on these machines `nvcc` on the PATH is a
# wrapper script, and torch would take its folder for CUDA_HOME, which has no headers.
cuda_toolkit() {
    local major=$1 candidate release
    for candidate in ${CUDA_HOME:-} /usr/local/cuda /usr/local/cuda-*; do
        [ -x "$candidate/bin/nvcc" ] && [ -f "$candidate/include/cuda_runtime_api.h" ] || continue
        release=$("$candidate/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
        if [ "$release" = "$major" ]; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}
