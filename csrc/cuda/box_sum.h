// Launcher of cuda/box_sum.cu: window sums along one axis. Raw pointers and a stream, no
// torch types, so the .cu compiles with nvcc alone. box_sum.cpp calls it (box_pass), and
// local_std.cpp's leading axes through box_pass.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace simwarp {
namespace cuda {

// Valid (full = false) or full window sums of length k along L of a contiguous (B, L, R)
// array into out (B, L ∓ (k − 1), R): compensated sums in T (include/simwarp/
// compensated.h), each rounded once. Instantiated for float and double.
template <typename T>
cudaError_t launch_box_axis(const T* x, T* out, int64_t B, int64_t L, int64_t R, int64_t k,
                            bool full, cudaStream_t stream);

}  // namespace cuda
}  // namespace simwarp
