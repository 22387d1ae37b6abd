// CUDA kernel of simwarp::correlate along one axis: one thread per output element, the
// per-element sum from include/simwarp/correlate.h over a block of taps held by value
// (taps.h). Adjacent threads own adjacent r (the contiguous index), so inner-axis passes
// read coalesced rows; on the last axis (R = 1) they own adjacent i, and each tap's loads
// are again one coalesced row.
#include "correlate.h"
#include "launch.h"
#include "simwarp/correlate.h"
#include "taps.h"

namespace simwarp {
namespace cuda {
namespace {

template <typename T>
__global__ void correlate_axis_kernel(const T* __restrict__ x, T* __restrict__ out,
                                      TapBlock<T> taps, int64_t B, int64_t L, int64_t R,
                                      bool transpose, int64_t n_out, bool accumulate) {
  const int64_t idx = thread_index();
  if (idx >= B * n_out * R) return;
  const int64_t r = idx % R, i = (idx / R) % n_out, b = idx / (R * n_out);
  const T* line = x + b * L * R + r;
  // Taps [first, first + count): valid reads x[i + first + j], the transpose y[i − first − j].
  const T v = transpose
                  ? correlate_transpose_at<T, T>(line, R, L, taps.w, taps.count, i - taps.first)
                  : correlate_valid_at<T, T>(line + taps.first * R, R, taps.w, taps.count, i);
  out[idx] = accumulate ? out[idx] + v : v;
}

}  // namespace

template <typename T>
cudaError_t launch_correlate_axis(const T* x, T* out, const double* taps, int64_t B, int64_t L,
                                  int64_t R, int64_t k, bool transpose, cudaStream_t stream) {
  const int64_t n_out = transpose ? L + k - 1 : L - k + 1;
  for (int64_t block = 0; block < tap_blocks(k); ++block) {
    const cudaError_t err = launch(&correlate_axis_kernel<T>, B * n_out * R, stream, x, out,
                                   nth_tap_block<T>(taps, k, block), B, L, R, transpose, n_out,
                                   block > 0);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template cudaError_t launch_correlate_axis<float>(const float*, float*, const double*, int64_t,
                                                  int64_t, int64_t, int64_t, bool, cudaStream_t);
template cudaError_t launch_correlate_axis<double>(const double*, double*, const double*, int64_t,
                                                   int64_t, int64_t, int64_t, bool, cudaStream_t);

}  // namespace cuda
}  // namespace simwarp
