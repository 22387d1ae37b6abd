// CUDA kernels of simwarp::local_std_fwd / local_std_bwd (docs/maths.md §1): the last-axis
// window sums of x and x², the per-element forward, vjp and combine. The leading axes' and
// the backward's window sums are box_sum.cu's. The per-element maths is
// include/simwarp/local_std.h, the same functions the CPU runs.
#include "grid.h"
#include "local_std.h"
#include "simwarp/local_std.h"

namespace simwarp {
namespace cuda {
namespace {

// One thread per (b, r) line: running sums of x and x² along L, in double.
template <typename T>
__global__ void box_axis_squares_kernel(const T* __restrict__ x, double* __restrict__ sum,
                                        double* __restrict__ sum_sq, int64_t B, int64_t L,
                                        int64_t R, int64_t k) {
  const int64_t line = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (line >= B * R) return;
  const int64_t b = line / R, r = line % R, n_out = L - k + 1;
  const T* xl = x + b * L * R + r;
  double* o1 = sum + b * n_out * R + r;
  double* o2 = sum_sq + b * n_out * R + r;
  double s1 = 0.0, s2 = 0.0;
  for (int64_t j = 0; j < k; ++j) { const double v = xl[j * R]; s1 += v; s2 += v * v; }
  o1[0] = s1;
  o2[0] = s2;
  for (int64_t i = 1; i < n_out; ++i) {
    const double a = xl[(i + k - 1) * R], s = xl[(i - 1) * R];
    s1 += a - s;
    s2 += a * a - s * s;
    o1[i * R] = s1;
    o2[i * R] = s2;
  }
}

template <typename T>
__global__ void local_std_forward_kernel(const double* __restrict__ s1,
                                         const double* __restrict__ s2, T* __restrict__ out,
                                         T* __restrict__ s1_out, bool* __restrict__ flat, int64_t n,
                                         double inv_n, double eps, double flat_factor,
                                         bool normalized) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = static_cast<T>(
      local_std_forward<double>(s1[i], s2[i], inv_n, eps, flat_factor, normalized, flat + i));
  s1_out[i] = static_cast<T>(s1[i]);
}

template <typename T>
__global__ void local_std_vjp_kernel(const T* __restrict__ grad, const T* __restrict__ out,
                                     const T* __restrict__ s1, const bool* __restrict__ flat,
                                     T* __restrict__ d_s1, T* __restrict__ d_s2, int64_t n,
                                     T inv_n, bool normalized) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) local_std_vjp(grad[i], out[i], s1[i], inv_n, normalized, flat[i], d_s1 + i, d_s2 + i);
}

template <typename T>
__global__ void local_std_combine_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                         const T* __restrict__ x, T* __restrict__ dx, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dx[i] = local_std_combine(a[i], b[i], x[i]);
}

}  // namespace

template <typename T>
cudaError_t launch_box_axis_squares(const T* x, double* sum, double* sum_sq, int64_t B, int64_t L,
                                    int64_t R, int64_t k, cudaStream_t stream) {
  box_axis_squares_kernel<T><<<blocks_for(B * R), kThreads, 0, stream>>>(x, sum, sum_sq, B, L, R, k);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_local_std_forward(const double* s1, const double* s2, T* out, T* s1_out,
                                     bool* flat, int64_t n, double inv_n, double eps,
                                     double flat_factor, bool normalized, cudaStream_t stream) {
  local_std_forward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
      s1, s2, out, s1_out, flat, n, inv_n, eps, flat_factor, normalized);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_local_std_vjp(const T* grad, const T* out, const T* s1, const bool* flat,
                                 T* d_s1, T* d_s2, int64_t n, T inv_n, bool normalized,
                                 cudaStream_t stream) {
  local_std_vjp_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(grad, out, s1, flat, d_s1, d_s2,
                                                                  n, inv_n, normalized);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_local_std_combine(const T* box_d_s1, const T* box_d_s2, const T* x, T* dx,
                                     int64_t n, cudaStream_t stream) {
  local_std_combine_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(box_d_s1, box_d_s2, x, dx, n);
  return cudaGetLastError();
}

#define SIMWARP_INSTANTIATE(T)                                                                   \
  template cudaError_t launch_box_axis_squares<T>(const T*, double*, double*, int64_t, int64_t,  \
                                                  int64_t, int64_t, cudaStream_t);               \
  template cudaError_t launch_local_std_forward<T>(const double*, const double*, T*, T*, bool*, \
                                                   int64_t, double, double, double, bool,       \
                                                   cudaStream_t);                                \
  template cudaError_t launch_local_std_vjp<T>(const T*, const T*, const T*, const bool*, T*, T*,\
                                               int64_t, T, bool, cudaStream_t);                  \
  template cudaError_t launch_local_std_combine<T>(const T*, const T*, const T*, T*, int64_t,   \
                                                   cudaStream_t);
SIMWARP_INSTANTIATE(float)
SIMWARP_INSTANTIATE(double)
#undef SIMWARP_INSTANTIATE

}  // namespace cuda
}  // namespace simwarp
