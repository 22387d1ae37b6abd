// CUDA kernel of simwarp::moments5's last-axis pass (docs/maths.md §5.2). Its leading axes
// are plain correlate passes (moments5.cpp).
#include "grid.h"
#include "moments5.h"

namespace simwarp {
namespace cuda {
namespace {

// Five moments along the last axis: one thread per (line, i), products formed on the fly.
template <typename T>
__global__ void moments_last_axis_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                         T* __restrict__ out, const T* __restrict__ w,
                                         int64_t lines, int64_t L, int64_t k) {
  const int64_t n = L - k + 1;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= lines * n) return;
  const int64_t l = idx / n, i = idx % n;
  const T* al = a + l * L + i;
  const T* bl = b + l * L + i;
  T m[5] = {T(0), T(0), T(0), T(0), T(0)};
  for (int64_t j = 0; j < k; ++j) {
    const T wj = w[j], x = al[j], y = bl[j];
    m[0] += wj * x;
    m[1] += wj * y;
    m[2] += wj * x * x;
    m[3] += wj * y * y;
    m[4] += wj * x * y;
  }
  const int64_t plane = lines * n;
  for (int q = 0; q < 5; ++q) out[q * plane + idx] = m[q];
}

}  // namespace

template <typename T>
cudaError_t launch_moments_last_axis(const T* a, const T* b, T* out, const T* taps, int64_t lines,
                                     int64_t L, int64_t k, cudaStream_t stream) {
  const int64_t n = lines * (L - k + 1);
  moments_last_axis_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(a, b, out, taps, lines, L, k);
  return cudaGetLastError();
}

template cudaError_t launch_moments_last_axis<float>(const float*, const float*, float*,
                                                     const float*, int64_t, int64_t, int64_t,
                                                     cudaStream_t);
template cudaError_t launch_moments_last_axis<double>(const double*, const double*, double*,
                                                      const double*, int64_t, int64_t, int64_t,
                                                      cudaStream_t);

}  // namespace cuda
}  // namespace simwarp
