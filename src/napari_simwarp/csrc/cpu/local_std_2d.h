// Fused 2D local standard deviation on CPU: one read of the input, one write per output.
//
// Output rows are processed in bands of kBandRows. Within a band, the window sums of each
// input row (S1 and S2 along W, a running sum in double) enter a ring of the last kh rows
// and a running column accumulator; when a row leaves the window it is subtracted. So
// every intermediate lives in an L2-sized ring, not in full-size maps. Bands have a fixed
// size (not one per thread), so the result is bitwise the same on any number of threads.
// The per-element maths is include/simwarp/local_std.h, shared with the CUDA kernels.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "simwarp/local_std.h"

namespace simwarp {
namespace cpu {

constexpr int64_t kBandRows = 128;

// Valid window sums of v and v² along one row, in double: s1, s2 get n − k + 1 entries.
template <typename In>
inline void row_window_sums(const In* v, int64_t n, int64_t k, double* s1, double* s2) {
  double a1 = 0.0, a2 = 0.0;
  for (int64_t c = 0; c < k; ++c) { const double x = v[c]; a1 += x; a2 += x * x; }
  s1[0] = a1;
  s2[0] = a2;
  for (int64_t c = 1; c < n - k + 1; ++c) {
    const double add = v[c + k - 1], sub = v[c - 1];
    a1 += add - sub;
    a2 += add * add - sub * sub;
    s1[c] = a1;
    s2[c] = a2;
  }
}

// Full-mode (zero-padded) window sum along one row: out has n + k − 1 entries.
template <typename In>
inline void row_box_full(const In* v, int64_t n, int64_t k, double* out) {
  double acc = 0.0;
  for (int64_t c = 0; c < n + k - 1; ++c) {
    if (c < n) acc += static_cast<double>(v[c]);
    if (c - k >= 0) acc -= static_cast<double>(v[c - k]);
    out[c] = acc;
  }
}

// xp (B, Hp, Wp) -> out, s1 (B, H, W) and flat, H = Hp − kh + 1, W = Wp − kw + 1.
template <typename T>
void local_std_2d_forward(const T* xp, T* out, T* s1_out, bool* flat, int64_t B, int64_t Hp,
                          int64_t Wp, int64_t kh, int64_t kw, double eps, double flat_factor,
                          bool normalized) {
  const int64_t H = Hp - kh + 1, W = Wp - kw + 1;
  const int64_t bands = (H + kBandRows - 1) / kBandRows;
  const double inv_n = 1.0 / static_cast<double>(kh * kw);
  at::parallel_for(0, B * bands, 1, [&](int64_t t0, int64_t t1) {
    std::vector<double> ring1(kh * W), ring2(kh * W), acc1(W), acc2(W);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / bands, r0 = (t % bands) * kBandRows;
      const int64_t r1 = std::min(H, r0 + kBandRows);
      std::fill(acc1.begin(), acc1.end(), 0.0);
      std::fill(acc2.begin(), acc2.end(), 0.0);
      for (int64_t j = r0; j < r1 + kh - 1; ++j) {  // input rows of this band
        const T* row = xp + (b * Hp + j) * Wp;
        double* q1 = ring1.data() + (j % kh) * W;
        double* q2 = ring2.data() + (j % kh) * W;
        if (j >= r0 + kh) {  // row j − kh leaves the window (it sits in this slot)
          for (int64_t c = 0; c < W; ++c) { acc1[c] -= q1[c]; acc2[c] -= q2[c]; }
        }
        row_window_sums(row, Wp, kw, q1, q2);
        for (int64_t c = 0; c < W; ++c) { acc1[c] += q1[c]; acc2[c] += q2[c]; }
        if (j >= r0 + kh - 1) {
          const int64_t i = j - kh + 1;
          const int64_t o = (b * H + i) * W;
          for (int64_t c = 0; c < W; ++c) {
            out[o + c] = static_cast<T>(local_std_forward<double>(
                acc1[c], acc2[c], inv_n, eps, flat_factor, normalized, flat + o + c));
            s1_out[o + c] = static_cast<T>(acc1[c]);
          }
        }
      }
    }
  });
}

// ∂L/∂xp (B, Hp, Wp) from grad, out, s1, flat (B, H, W) and xp: the per-element vjp, the
// full-mode window sums of the two partial maps (ring + running column sums, as above),
// and the combine, fused.
template <typename T>
void local_std_2d_backward(const T* grad, const T* out, const T* s1, const bool* flat, const T* xp,
                           T* dx, int64_t B, int64_t Hp, int64_t Wp, int64_t kh, int64_t kw,
                           bool normalized) {
  const int64_t H = Hp - kh + 1, W = Wp - kw + 1;
  const int64_t bands = (Hp + kBandRows - 1) / kBandRows;
  const T inv_n = T(1) / static_cast<T>(kh * kw);
  at::parallel_for(0, B * bands, 1, [&](int64_t t0, int64_t t1) {
    std::vector<double> ring1(kh * Wp), ring2(kh * Wp), acc1(Wp), acc2(Wp);
    std::vector<T> d1(W), d2(W);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / bands, i0 = (t % bands) * kBandRows;
      const int64_t i1 = std::min(Hp, i0 + kBandRows);
      const int64_t start = i0 - kh + 1;
      std::fill(acc1.begin(), acc1.end(), 0.0);
      std::fill(acc2.begin(), acc2.end(), 0.0);
      for (int64_t r = start; r < i1; ++r) {  // rows of the partial maps (zero outside [0, H))
        const int64_t slot = ((r % kh) + kh) % kh;
        double* q1 = ring1.data() + slot * Wp;
        double* q2 = ring2.data() + slot * Wp;
        if (r >= start + kh) {
          for (int64_t c = 0; c < Wp; ++c) { acc1[c] -= q1[c]; acc2[c] -= q2[c]; }
        }
        if (r >= 0 && r < H) {
          const int64_t o = (b * H + r) * W;
          for (int64_t c = 0; c < W; ++c)
            local_std_vjp(grad[o + c], out[o + c], s1[o + c], inv_n, normalized, flat[o + c],
                          &d1[c], &d2[c]);
          row_box_full(d1.data(), W, kw, q1);
          row_box_full(d2.data(), W, kw, q2);
        } else {
          std::fill(q1, q1 + Wp, 0.0);
          std::fill(q2, q2 + Wp, 0.0);
        }
        for (int64_t c = 0; c < Wp; ++c) { acc1[c] += q1[c]; acc2[c] += q2[c]; }
        if (r >= i0) {
          const int64_t o = (b * Hp + r) * Wp;
          for (int64_t c = 0; c < Wp; ++c)
            dx[o + c] = local_std_combine(static_cast<T>(acc1[c]), static_cast<T>(acc2[c]), xp[o + c]);
        }
      }
    }
  });
}

}  // namespace cpu
}  // namespace simwarp
