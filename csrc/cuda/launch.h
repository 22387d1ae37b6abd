// Launchers for the CUDA kernels: raw pointers and a stream, no torch types, so every .cu
// file compiles with nvcc alone. Each returns the launch's cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace simwarp {
namespace cuda {

// Window sums along L of a contiguous (B, L, R) array (see cpu/box.h for pad / n_out),
// accumulated in double and stored as Out.
template <typename T, typename Out>
cudaError_t launch_box_axis(const T* x, Out* out, int64_t B, int64_t L, int64_t R, int64_t k,
                            int64_t pad, int64_t n_out, cudaStream_t stream);

// Valid window sums along L of x and of x², in double, in one read of x.
template <typename T>
cudaError_t launch_box_axis_squares(const T* x, double* sum, double* sum_sq, int64_t B, int64_t L,
                                    int64_t R, int64_t k, cudaStream_t stream);

// One separable-correlation pass along L of a contiguous (B, L, R) array; `taps` (k values)
// live on the device. transpose=False: valid (n_out = L − k + 1); True: its adjoint.
template <typename T>
cudaError_t launch_correlate_axis(const T* x, T* out, const T* taps, int64_t B, int64_t L,
                                  int64_t R, int64_t k, bool transpose, int64_t n_out,
                                  cudaStream_t stream);

// From the double window sums: out, S1 (as T) and the flat mask (include/simwarp/local_std.h).
// The five moments (a, b, a², b², ab) filtered along the last axis of `lines` lines of
// length L; out is (5, lines, L − k + 1); `taps` (k values) live on the device.
template <typename T>
cudaError_t launch_moments_last_axis(const T* a, const T* b, T* out, const T* taps, int64_t lines,
                                     int64_t L, int64_t k, cudaStream_t stream);

template <typename T>
cudaError_t launch_local_std_forward(const double* s1, const double* s2, T* out, T* s1_out,
                                     bool* flat, int64_t n, double inv_n, double eps,
                                     double flat_factor, bool normalized, cudaStream_t stream);

template <typename T>
cudaError_t launch_local_std_vjp(const T* grad, const T* out, const T* s1, const bool* flat,
                                 T* d_s1, T* d_s2, int64_t n, T inv_n, bool normalized,
                                 cudaStream_t stream);

template <typename T>
cudaError_t launch_local_std_combine(const T* box_d_s1, const T* box_d_s2, const T* x, T* dx,
                                     int64_t n, cudaStream_t stream);

// Splatting (SPEC §4). size holds the D (2 or 3) spatial sizes. Forward: atomics (the
// float result may differ in the last bits between runs); backward: gathers, one thread
// per source pixel. v_out / v_den may be null (no incoming gradient); scaled (N, C, P) and
// slope0 (N, P) are scratch buffers the caller allocates.
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
