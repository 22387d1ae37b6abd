// Launchers of cuda/local_std.cu, the kernels of simwarp::local_std_fwd / local_std_bwd.
// Raw pointers and a stream, no torch types, so the .cu compiles with nvcc alone. Each
// returns the launch's cudaError_t; instantiated for float and double.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace simwarp {
namespace cuda {

// Valid window sums along L of x and of x², in double, in one read of x.
template <typename T>
cudaError_t launch_box_axis_squares(const T* x, double* sum, double* sum_sq, int64_t B, int64_t L,
                                    int64_t R, int64_t k, cudaStream_t stream);

// From the double window sums: out, S1 (as T) and the flat mask (include/simwarp/local_std.h).
template <typename T>
cudaError_t launch_local_std_forward(const double* s1, const double* s2, T* out, T* s1_out,
                                     bool* flat, int64_t n, double inv_n, double eps,
                                     double flat_factor, bool normalized, cudaStream_t stream);

// Per element, from the incoming gradient: ∂L/∂S1 and ∂L/∂S2.
template <typename T>
cudaError_t launch_local_std_vjp(const T* grad, const T* out, const T* s1, const bool* flat,
                                 T* d_s1, T* d_s2, int64_t n, T inv_n, bool normalized,
                                 cudaStream_t stream);

// ∂L/∂x from the full-mode window sums of ∂L/∂S1 and ∂L/∂S2.
template <typename T>
cudaError_t launch_local_std_combine(const T* box_d_s1, const T* box_d_s2, const T* x, T* dx,
                                     int64_t n, cudaStream_t stream);

}  // namespace cuda
}  // namespace simwarp
