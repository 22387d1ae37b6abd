// Launcher of cuda/correlate.cu, the kernel of simwarp::correlate. Raw pointers and a
// stream, no torch types, so the .cu compiles with nvcc alone.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace simwarp {
namespace cuda {

// One separable-correlation pass along L of a contiguous (B, L, R) array with the k taps
// at `taps` (host memory; they travel as kernel arguments, taps.h). transpose=False: valid
// (n_out = L − k + 1); True: its adjoint (n_out = L + k − 1). Instantiated for float and
// double.
template <typename T>
cudaError_t launch_correlate_axis(const T* x, T* out, const double* taps, int64_t B, int64_t L,
                                  int64_t R, int64_t k, bool transpose, cudaStream_t stream);

}  // namespace cuda
}  // namespace simwarp
