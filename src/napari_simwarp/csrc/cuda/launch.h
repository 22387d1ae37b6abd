// Launchers for the CUDA kernels: raw pointers and a stream, no torch types, so every .cu
// file compiles with nvcc alone. Each returns the launch's cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace simwarp {
namespace cuda {

// Window sums along L of a contiguous (B, L, R) array (see cpu/box.h for pad / n_out).
template <typename T>
cudaError_t launch_box_axis(const T* x, T* out, int64_t B, int64_t L, int64_t R, int64_t k, int64_t pad,
                     int64_t n_out, cudaStream_t stream);

// Valid window sums along L of x and of x² in one read of x.
template <typename T>
cudaError_t launch_box_axis_squares(const T* x, T* sum, T* sum_sq, int64_t B, int64_t L, int64_t R,
                             int64_t k, cudaStream_t stream);

// One separable-correlation pass along L of a contiguous (B, L, R) array; `taps` (k values)
// live on the device. transpose=False: valid (n_out = L − k + 1); True: its adjoint.
template <typename T>
cudaError_t launch_correlate_axis(const T* x, T* out, const T* taps, int64_t B, int64_t L,
                                  int64_t R, int64_t k, bool transpose, int64_t n_out,
                                  cudaStream_t stream);

template <typename T>
cudaError_t launch_local_std_forward(const T* s1, const T* s2, T* out, int64_t n, T inv_n, T eps,
                              bool normalized, cudaStream_t stream);

template <typename T>
cudaError_t launch_local_std_vjp(const T* grad, const T* out, const T* s1, const T* s2, T* d_s1, T* d_s2,
                          int64_t n, T inv_n, bool normalized, cudaStream_t stream);

template <typename T>
cudaError_t launch_local_std_combine(const T* box_d_s1, const T* box_d_s2, const T* x, T* dx, int64_t n,
                              cudaStream_t stream);

}  // namespace cuda
}  // namespace simwarp
