// Launchers of cuda/splat.cu, the kernels of simwarp::splat_fwd / splat_bwd (docs/maths.md
// §4). Raw pointers and a stream, no torch types, so the .cu compiles with nvcc alone.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace simwarp {
namespace cuda {

// size holds the D (2 or 3) spatial sizes. Forward: atomics (the float result may differ
// in the last bits between runs); backward: gathers, one thread per source pixel. v_out /
// v_den may be null (no incoming gradient); scaled (N, C, P) and slope0 (N, P) are scratch
// buffers the caller allocates. Instantiated for float and double.
template <typename T>
cudaError_t launch_splat_forward(const T* image, const T* disp, T* out, T* den, int64_t N,
                                 int64_t C, int D, const int64_t* size, bool normalize, T eps,
                                 cudaStream_t stream);

template <typename T>
cudaError_t launch_splat_backward(const T* v_out, const T* v_den, const T* image, const T* disp,
                                  const T* out, const T* den, T* scaled, T* slope0,
                                  T* grad_image, T* grad_disp, int64_t N, int64_t C, int D,
                                  const int64_t* size, bool normalize, T eps,
                                  cudaStream_t stream);

}  // namespace cuda
}  // namespace simwarp
