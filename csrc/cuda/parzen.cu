// Kernels of simwarp::parzen_fwd / parzen_bwd: the mutual information's B-spline Parzen
// joint histogram (docs/maths.md §10; the CPU twin cpu/parzen.cpp). Forward: one block
// per row finds its frame (min and max, and whether it is all finite), one thread per
// pixel adds its 4 × 4 taps to the histogram with atomics, one block per row turns the
// histogram into the score and its gradient ∂S/∂J in place (sums in double). Backward:
// one thread per pixel gathers the 4 × 4 bins of ∂S/∂J its taps see (no atomics).
#include "launch.h"
#include "parzen.h"
#include "simwarp/parzen.h"

namespace simwarp {
namespace cuda {
namespace {

constexpr int kRowThreads = 256;

// Sums (or the min, max) of `count` values per thread across the block, into s[k · n + 0].
__device__ void block_reduce(double* s, int count, const int* op) {
  const unsigned n = blockDim.x;
  for (unsigned stride = n / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      for (int k = 0; k < count; ++k) {
        double& x = s[k * n + threadIdx.x];
        const double y = s[k * n + threadIdx.x + stride];
        x = op[k] == 0 ? x + y : (op[k] < 0 ? (y < x ? y : x) : (y > x ? y : x));
      }
    }
    __syncthreads();
  }
}

template <typename T>
__global__ void parzen_frame_kernel(const T* a, const T* b, const T* w, int64_t P, bool has_range,
                                    double lo, double hi, T* frame, T* finite_out) {
  SIMWARP_DYNAMIC_SHARED(double, s);
  const unsigned n = blockDim.x, t = threadIdx.x;
  const int64_t m = blockIdx.x;
  const T big = sizeof(T) == 4 ? T(3.40282347e38f) : T(1.7976931348623157e308);
  T lo_a = big, hi_a = -big, lo_b = big, hi_b = -big;
  double finite = 1.0;
  for (int64_t p = t; p < P; p += n) {
    const T x = a[m * P + p], y = b[m * P + p];
    if (!((x - x) == T(0) && (y - y) == T(0))) finite = 0.0;
    if (w != nullptr && !(w[m * P + p] > T(0))) continue;
    const T xa = parzen_finite_or_zero(x), xb = parzen_finite_or_zero(y);
    lo_a = xa < lo_a ? xa : lo_a;
    hi_a = xa > hi_a ? xa : hi_a;
    lo_b = xb < lo_b ? xb : lo_b;
    hi_b = xb > hi_b ? xb : hi_b;
  }
  s[0 * n + t] = lo_a;
  s[1 * n + t] = hi_a;
  s[2 * n + t] = lo_b;
  s[3 * n + t] = hi_b;
  s[4 * n + t] = finite;
  __syncthreads();
  const int ops[5] = {-1, 1, -1, 1, -1};
  block_reduce(s, 5, ops);
  if (t == 0) {
    T la = static_cast<T>(s[0]), ha = static_cast<T>(s[n]);
    T lb = static_cast<T>(s[2 * n]), hb = static_cast<T>(s[3 * n]);
    if (has_range) {
      la = lb = static_cast<T>(lo);
      ha = hb = static_cast<T>(hi);
    }
    frame[m * 4 + 0] = la;
    frame[m * 4 + 1] = parzen_span(la, ha);
    frame[m * 4 + 2] = lb;
    frame[m * 4 + 3] = parzen_span(lb, hb);
    finite_out[m] = static_cast<T>(s[4 * n]);
  }
}

template <typename T>
__global__ void parzen_histogram_kernel(const T* a, const T* b, const T* w, const T* frame,
                                        int64_t M, int64_t P, int64_t bins, T* joint) {
  const int64_t i = thread_index();
  if (i >= M * P) return;
  const int64_t m = i / P;
  const T weight = w == nullptr ? T(1) : w[i];
  if (weight == T(0)) return;
  const T* f = frame + m * 4;
  T fa, fb, wa[4], wb[4];
  const int64_t ca = parzen_cell(parzen_xi(parzen_unit(parzen_finite_or_zero(a[i]), f[0], f[1]), bins), bins, &fa);
  const int64_t cb = parzen_cell(parzen_xi(parzen_unit(parzen_finite_or_zero(b[i]), f[2], f[3]), bins), bins, &fb);
  parzen_weights(fa, wa);
  parzen_weights(fb, wb);
  T* row = joint + m * bins * bins + (ca - 1) * bins + (cb - 1);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) atomicAdd(row + r * bins + c, weight * wa[r] * wb[c]);
}

// One block per row: J (bins × bins, in grad) → the score and ∂S/∂J in place. Shared:
// 3 · blockDim partial sums, then the two marginals (2 · bins).
template <typename T>
__global__ void parzen_score_kernel(int64_t bins, bool normalize, T* grad, T* score) {
  SIMWARP_DYNAMIC_SHARED(double, s);
  const unsigned n = blockDim.x, t = threadIdx.x;
  const int64_t m = blockIdx.x, B = bins;
  T* J = grad + m * B * B;
  double* ma = s + 3 * n;
  double* mb = ma + B;
  for (int64_t k = t; k < B; k += n) {
    double ra = 0.0, rb = 0.0;
    for (int64_t j = 0; j < B; ++j) {
      ra += static_cast<double>(J[k * B + j]);
      rb += static_cast<double>(J[j * B + k]);
    }
    ma[k] = ra;
    mb[k] = rb;
  }
  double total = 0.0;
  for (int64_t k = t; k < B * B; k += n) total += static_cast<double>(J[k]);
  s[t] = total;
  __syncthreads();
  const int sum1[1] = {0};
  block_reduce(s, 1, sum1);
  total = s[0];
  __syncthreads();
  const double tiny = parzen_tiny<double>();
  const double tt = total > tiny ? total : tiny;
  double h[3] = {0.0, 0.0, 0.0};
  for (int64_t k = t; k < B * B; k += n) {
    const double p = static_cast<double>(J[k]) / tt;
    h[0] += p * log(p > tiny ? p : tiny);
  }
  for (int64_t k = t; k < B; k += n) {
    const double pa = ma[k] / tt, pb = mb[k] / tt;
    h[1] += pa * log(pa > tiny ? pa : tiny);
    h[2] += pb * log(pb > tiny ? pb : tiny);
  }
  s[t] = h[0];
  s[n + t] = h[1];
  s[2 * n + t] = h[2];
  __syncthreads();
  const int sum3[3] = {0, 0, 0};
  block_reduce(s, 3, sum3);
  const double nh_ab = s[0], nh_a = s[n], nh_b = s[2 * n];
  const bool finite = score[m] != T(0);  // the frame kernel's flag
  const bool flat = normalize && nh_ab >= 0.0;
  const double value = normalize ? (flat ? 2.0 : (nh_a + nh_b) / nh_ab) : nh_ab - nh_a - nh_b;
  const double scale = normalize ? -(nh_ab * total) : total;
  for (int64_t k = t; k < B * B; k += n) {
    const int64_t i = k / B, j = k % B;
    const double pab = static_cast<double>(J[k]) / tt, pa = ma[i] / tt, pb = mb[j] / tt;
    const double lab = log(pab > tiny ? pab : tiny), la = log(pa > tiny ? pa : tiny);
    const double lb = log(pb > tiny ? pb : tiny);
    double g = normalize ? (lab * value - la - lb) / scale : (lab - la - lb - value) / scale;
    if (flat || !finite || total == 0.0) g = 0.0;  // total 0: no weight, nothing moves
    J[k] = static_cast<T>(g);
  }
  __syncthreads();  // every thread has read its flag before thread 0 overwrites it
  if (t == 0) {
    score[m] = finite ? static_cast<T>(value) : static_cast<T>(::nan(""));
  }
}

template <typename T>
__global__ void parzen_backward_kernel(const T* grad_score, const T* score, const T* G, const T* a,
                                       const T* b, const T* w, const T* frame, int64_t M,
                                       int64_t P, int64_t bins, T* grad_a, T* grad_b) {
  const int64_t i = thread_index();
  if (i >= M * P) return;
  const int64_t m = i / P;
  const T s = score[m];
  const T gs = s == s ? grad_score[m] : T(0);  // a NaN row passes no gradient
  const T weight = w == nullptr ? T(1) : w[i];
  const T* f = frame + m * 4;
  T fa, fb, wa[4], wb[4], sa[4], sb[4];
  const T ua = parzen_unit(parzen_finite_or_zero(a[i]), f[0], f[1]);
  const T ub = parzen_unit(parzen_finite_or_zero(b[i]), f[2], f[3]);
  const int64_t ca = parzen_cell(parzen_xi(ua, bins), bins, &fa);
  const int64_t cb = parzen_cell(parzen_xi(ub, bins), bins, &fb);
  parzen_weights(fa, wa);
  parzen_weights(fb, wb);
  parzen_slopes(fa, sa);
  parzen_slopes(fb, sb);
  const T* g = G + m * bins * bins + (ca - 1) * bins + (cb - 1);
  T ga = T(0), gb = T(0);
  for (int r = 0; r < 4; ++r) {
    T seen_a = T(0), seen_b = T(0);
    for (int c = 0; c < 4; ++c) {
      seen_a += g[r * bins + c] * wb[c];
      seen_b += g[r * bins + c] * sb[c];
    }
    ga += sa[r] * seen_a;
    gb += wa[r] * seen_b;
  }
  const T common = gs * weight * static_cast<T>(bins - 3);
  const bool in_a = ua >= T(0) && ua <= T(1) && (a[i] - a[i]) == T(0);
  const bool in_b = ub >= T(0) && ub <= T(1) && (b[i] - b[i]) == T(0);
  grad_a[i] = in_a ? common * ga / f[1] : T(0);
  grad_b[i] = in_b ? common * gb / f[3] : T(0);
}

}  // namespace

template <typename T>
cudaError_t launch_parzen_forward(const T* a, const T* b, const T* weight, int64_t M, int64_t P,
                                  int64_t bins, bool normalize, bool has_range, double lo,
                                  double hi, T* score, T* grad, T* frame, cudaStream_t stream) {
  cudaError_t err = launch_cooperative(parzen_frame_kernel<T>, M, kRowThreads,
                                       5 * kRowThreads * sizeof(double), stream, a, b, weight, P,
                                       has_range, lo, hi, frame, score);
  if (err != cudaSuccess) return err;
  err = launch(parzen_histogram_kernel<T>, M * P, stream, a, b, weight, frame, M, P, bins, grad);
  if (err != cudaSuccess) return err;
  return launch_cooperative(parzen_score_kernel<T>, M, kRowThreads,
                            (3 * kRowThreads + 2 * bins) * sizeof(double), stream, bins, normalize,
                            grad, score);
}

template <typename T>
cudaError_t launch_parzen_backward(const T* grad_score, const T* score, const T* grad_joint,
                                   const T* a, const T* b, const T* weight, const T* frame,
                                   int64_t M, int64_t P, int64_t bins, T* grad_a, T* grad_b,
                                   cudaStream_t stream) {
  return launch(parzen_backward_kernel<T>, M * P, stream, grad_score, score, grad_joint, a, b,
                weight, frame, M, P, bins, grad_a, grad_b);
}

#define SIMWARP_PARZEN_INSTANTIATE(T)                                                         \
  template cudaError_t launch_parzen_forward<T>(const T*, const T*, const T*, int64_t, int64_t, \
                                                int64_t, bool, bool, double, double, T*, T*,  \
                                                T*, cudaStream_t);                            \
  template cudaError_t launch_parzen_backward<T>(const T*, const T*, const T*, const T*,       \
                                                 const T*, const T*, const T*, int64_t,       \
                                                 int64_t, int64_t, T*, T*, cudaStream_t);
SIMWARP_PARZEN_INSTANTIATE(float)
SIMWARP_PARZEN_INSTANTIATE(double)

}  // namespace cuda
}  // namespace simwarp
