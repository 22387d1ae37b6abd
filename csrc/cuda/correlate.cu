// CUDA kernel of simwarp::correlate along one axis: one thread per output element, the
// per-element sum from include/simwarp/correlate.h. Adjacent threads own adjacent r (the
// contiguous index), so inner-axis passes read coalesced rows.
#include "correlate.h"
#include "grid.h"
#include "simwarp/correlate.h"

namespace simwarp {
namespace cuda {
namespace {

template <typename T>
__global__ void correlate_axis_kernel(const T* __restrict__ x, T* __restrict__ out,
                                      const T* __restrict__ w, int64_t B, int64_t L, int64_t R,
                                      int64_t k, bool transpose, int64_t n_out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= B * n_out * R) return;
  const int64_t r = idx % R, i = (idx / R) % n_out, b = idx / (R * n_out);
  const T* line = x + b * L * R + r;
  out[idx] = transpose ? correlate_transpose_at<T, T>(line, R, L, w, k, i)
                       : correlate_valid_at<T, T>(line, R, w, k, i);
}

}  // namespace

template <typename T>
cudaError_t launch_correlate_axis(const T* x, T* out, const T* taps, int64_t B, int64_t L,
                                  int64_t R, int64_t k, bool transpose, int64_t n_out,
                                  cudaStream_t stream) {
  const int64_t n = B * n_out * R;
  correlate_axis_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(x, out, taps, B, L, R, k,
                                                                   transpose, n_out);
  return cudaGetLastError();
}

template cudaError_t launch_correlate_axis<float>(const float*, float*, const float*, int64_t,
                                                  int64_t, int64_t, int64_t, bool, int64_t,
                                                  cudaStream_t);
template cudaError_t launch_correlate_axis<double>(const double*, double*, const double*, int64_t,
                                                   int64_t, int64_t, int64_t, bool, int64_t,
                                                   cudaStream_t);

}  // namespace cuda
}  // namespace simwarp
