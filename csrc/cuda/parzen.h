// Launchers of cuda/parzen.cu, the kernels of simwarp::parzen_fwd / parzen_bwd (the mutual
// information's B-spline Parzen joint histogram, docs/maths.md §10). Raw pointers and a
// stream, no torch types, so the .cu compiles with nvcc alone.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace simwarp {
namespace cuda {

// a, b, weight (M, P) (weight may be null); bins ≤ kParzenMaxBins; has_range: the frame
// [lo, hi] for every row, else each row's range over its pixels of positive weight.
// grad (M, bins, bins) must hold zeros: the histogram is summed there with atomics, then
// replaced by ∂score/∂joint. Writes score (M,) (NaN for a row with a non-finite pixel)
// and frame (M, 4) (lo, span of a, then of b). Instantiated for float and double.
template <typename T>
cudaError_t launch_parzen_forward(const T* a, const T* b, const T* weight, int64_t M, int64_t P,
                                  int64_t bins, bool normalize, bool has_range, double lo,
                                  double hi, T* score, T* grad, T* frame, cudaStream_t stream);

// grad_a, grad_b (M, P) from grad_score, score (M,), grad_joint (M, bins, bins), frame.
template <typename T>
cudaError_t launch_parzen_backward(const T* grad_score, const T* score, const T* grad_joint,
                                   const T* a, const T* b, const T* weight, const T* frame,
                                   int64_t M, int64_t P, int64_t bins, T* grad_a, T* grad_b,
                                   cudaStream_t stream);

}  // namespace cuda
}  // namespace simwarp
