// Launcher of cuda/moments5.cu, the last-axis pass of simwarp::moments5 (its leading axes
// are correlate's passes). Raw pointers and a stream, no torch types, so the .cu compiles
// with nvcc alone.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace simwarp {
namespace cuda {

// The five moments (a, b, a², b², ab) filtered along the last axis of `lines` lines of
// length L with the k taps at `taps` (host memory; kernel arguments, taps.h); out is
// (5, lines, L − k + 1). Instantiated for float and double.
template <typename T>
cudaError_t launch_moments_last_axis(const T* a, const T* b, T* out, const double* taps,
                                     int64_t lines, int64_t L, int64_t k, cudaStream_t stream);

}  // namespace cuda
}  // namespace simwarp
