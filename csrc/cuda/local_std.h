// Launchers of cuda/local_std.cu, the kernels of simwarp::local_std_fwd / local_std_bwd
// (docs/maths.md §1). Raw pointers and a stream, no torch types, so the .cu compiles with
// nvcc alone. Each call runs one window pass (cuda/window_pass.h) along L of a contiguous
// (B, L, R) array; local_std.cpp chains one per window axis. Instantiated for float and
// double.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace simwarp {
namespace cuda {

// One valid pass of the forward. It reads the data x (the first pass) or the window
// moments the previous pass left (four maps s1.hi, s1.lo, s2.hi, s2.lo of compensated
// sums, each B·L·R long), and writes the moments for the next pass (moments_out, four
// maps of the output's size) or, on the last pass (moments_out null), out, s1 and flat
// from include/simwarp/local_std.h's local_std_forward_compensated. n is the window's
// element count N; flat_factor is relative to the compensated sums' precision.
template <typename T>
struct LocalStdForward {
  const T* x;
  const T* moments;
  T* moments_out;
  T* out;
  T* s1;
  bool* flat;
  T n, eps, flat_factor;
  bool normalized;
};

template <typename T>
cudaError_t launch_local_std_forward_pass(const LocalStdForward<T>& io, int64_t B, int64_t L,
                                          int64_t R, int64_t k, cudaStream_t stream);

// One full-mode pass of the backward (the adjoint of a valid pass). It reads the forward's
// grad, out, s1 and flat (the first pass, which forms ∂L/∂S1 and ∂L/∂S2 on the fly) or the
// two window sums of those partials the previous pass left (partials, two maps), and
// writes the two maps for the next pass (partials_out) or, on the last pass (partials_out
// null), ∂L/∂x = A + 2x·B into dx.
template <typename T>
struct LocalStdBackward {
  const T* grad;
  const T* out;
  const T* s1;
  const bool* flat;
  const T* partials;
  T* partials_out;
  const T* x;
  T* dx;
  T inv_n;
  bool normalized;
};

template <typename T>
cudaError_t launch_local_std_backward_pass(const LocalStdBackward<T>& io, int64_t B, int64_t L,
                                           int64_t R, int64_t k, cudaStream_t stream);

}  // namespace cuda
}  // namespace simwarp
