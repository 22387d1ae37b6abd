// CUDA kernel of simwarp::box_sum: window sums along one axis, one thread per line.
#include "box_sum.h"
#include "grid.h"

namespace simwarp {
namespace cuda {
namespace {

// One thread per (b, r) line: a running sum along L (O(1) per element whatever k). Adjacent
// threads own adjacent r, so for inner axes (R > 1) every step reads a coalesced row.
template <typename T, typename Out>
__global__ void box_axis_kernel(const T* __restrict__ x, Out* __restrict__ out, int64_t B,
                                int64_t L, int64_t R, int64_t k, int64_t pad, int64_t n_out) {
  const int64_t line = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (line >= B * R) return;
  const int64_t b = line / R, r = line % R;
  const T* xl = x + b * L * R + r;
  Out* ol = out + b * n_out * R + r;
  double acc = 0.0;
  const int64_t lo0 = -pad, hi0 = -pad + k - 1;
  for (int64_t j = lo0 > 0 ? lo0 : 0; j <= (hi0 < L - 1 ? hi0 : L - 1); ++j) acc += xl[j * R];
  ol[0] = static_cast<Out>(acc);
  for (int64_t i = 1; i < n_out; ++i) {
    const int64_t add = hi0 + i, sub = lo0 + i - 1;
    if (add >= 0 && add < L) acc += xl[add * R];
    if (sub >= 0 && sub < L) acc -= xl[sub * R];
    ol[i * R] = static_cast<Out>(acc);
  }
}

}  // namespace

template <typename T, typename Out>
cudaError_t launch_box_axis(const T* x, Out* out, int64_t B, int64_t L, int64_t R, int64_t k,
                            int64_t pad, int64_t n_out, cudaStream_t stream) {
  box_axis_kernel<T, Out><<<blocks_for(B * R), kThreads, 0, stream>>>(x, out, B, L, R, k, pad, n_out);
  return cudaGetLastError();
}

template cudaError_t launch_box_axis<float, float>(const float*, float*, int64_t, int64_t, int64_t,
                                                   int64_t, int64_t, int64_t, cudaStream_t);
template cudaError_t launch_box_axis<double, double>(const double*, double*, int64_t, int64_t,
                                                     int64_t, int64_t, int64_t, int64_t,
                                                     cudaStream_t);

}  // namespace cuda
}  // namespace simwarp
