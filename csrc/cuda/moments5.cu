// CUDA kernel of simwarp::moments5's last-axis pass (docs/maths.md §5.2): one thread per
// output element, the three products formed on the fly, five sums over a block of taps
// held by value (taps.h). Adjacent threads own adjacent outputs of a line, so each tap's
// loads of a and b are coalesced. The leading axes are plain correlate passes over the
// five maps, in place along their own axes (moments5.cpp).
#include "launch.h"
#include "moments5.h"
#include "taps.h"

namespace simwarp {
namespace cuda {
namespace {

template <typename T>
__global__ void moments_last_axis_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                         T* __restrict__ out, TapBlock<T> taps, int64_t lines,
                                         int64_t L, int64_t n, bool accumulate) {
  const int64_t idx = thread_index();
  if (idx >= lines * n) return;
  const int64_t l = idx / n, i = idx % n;
  const T* al = a + l * L + i + taps.first;
  const T* bl = b + l * L + i + taps.first;
  T m[5] = {T(0), T(0), T(0), T(0), T(0)};
  for (int64_t j = 0; j < taps.count; ++j) {
    const T w = taps.w[j], x = al[j], y = bl[j], wx = w * x, wy = w * y;
    m[0] += wx;
    m[1] += wy;
    m[2] += wx * x;
    m[3] += wy * y;
    m[4] += wx * y;
  }
  const int64_t plane = lines * n;
  for (int q = 0; q < 5; ++q) {
    T& o = out[q * plane + idx];
    o = accumulate ? o + m[q] : m[q];
  }
}

}  // namespace

template <typename T>
cudaError_t launch_moments_last_axis(const T* a, const T* b, T* out, const double* taps,
                                     int64_t lines, int64_t L, int64_t k, cudaStream_t stream) {
  const int64_t n = L - k + 1;
  for (int64_t block = 0; block < tap_blocks(k); ++block) {
    const cudaError_t err = launch(&moments_last_axis_kernel<T>, lines * n, stream, a, b, out,
                                   nth_tap_block<T>(taps, k, block), lines, L, n, block > 0);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template cudaError_t launch_moments_last_axis<float>(const float*, const float*, float*,
                                                     const double*, int64_t, int64_t, int64_t,
                                                     cudaStream_t);
template cudaError_t launch_moments_last_axis<double>(const double*, const double*, double*,
                                                      const double*, int64_t, int64_t, int64_t,
                                                      cudaStream_t);

}  // namespace cuda
}  // namespace simwarp
