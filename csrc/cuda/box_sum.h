// Launcher of cuda/box_sum.cu: window sums along one axis. Raw pointers and a stream, no
// torch types, so the .cu compiles with nvcc alone. box_sum.cpp calls it (box_pass), and
// local_std.cpp through box_pass.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace simwarp {
namespace cuda {

// Window sums along L of a contiguous (B, L, R) array (see cpu/box.h for pad / n_out),
// accumulated in double and stored as Out. Instantiated for <float, float> and
// <double, double>.
template <typename T, typename Out>
cudaError_t launch_box_axis(const T* x, Out* out, int64_t B, int64_t L, int64_t R, int64_t k,
                            int64_t pad, int64_t n_out, cudaStream_t stream);

}  // namespace cuda
}  // namespace simwarp
