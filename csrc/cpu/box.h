// CPU window sums along one axis of a contiguous tensor viewed as (B, L, R): the loop
// (box_axis) and the tensor pass over it (box_pass, in box_sum.cpp), which box_sum runs
// per axis and local_std.cpp reuses for its leading axes and its backward.
//
// out[b, i, r] = Σ_{j=0}^{k-1} x[b, i + j − pad, r], with x = 0 outside [0, L).
//   valid mode: pad = 0,     n_out = L − k + 1
//   full mode:  pad = k − 1, n_out = L + k − 1   (the adjoint of the valid sum)
// Running sums: O(1) per element whatever k. Accumulators are double, so float32 data keeps
// the accuracy of summing each window directly (a float32 running sum would drift).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace simwarp {
namespace cpu {

template <typename T, typename Out = T>
void box_axis(const T* x, Out* out, int64_t B, int64_t L, int64_t R, int64_t k, int64_t pad,
              int64_t n_out) {
  if (R == 1) {
    // Last axis: one serial running sum per line, lines in parallel.
    at::parallel_for(0, B, 64, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const T* xl = x + b * L;
        Out* ol = out + b * n_out;
        double acc = 0.0;
        const int64_t lo0 = -pad, hi0 = -pad + k - 1;
        for (int64_t j = std::max<int64_t>(lo0, 0); j <= std::min(hi0, L - 1); ++j) acc += xl[j];
        ol[0] = static_cast<Out>(acc);
        for (int64_t i = 1; i < n_out; ++i) {
          const int64_t add = hi0 + i, sub = lo0 + i - 1;
          if (add >= 0 && add < L) acc += xl[add];
          if (sub >= 0 && sub < L) acc -= xl[sub];
          ol[i] = static_cast<Out>(acc);
        }
      }
    });
    return;
  }
  // Inner axes: the running sum moves over whole rows of R contiguous values, so the inner
  // loop is contiguous and vectorizes; R is split in chunks to spread the work.
  constexpr int64_t kChunk = 512;
  const int64_t chunks = (R + kChunk - 1) / kChunk;
  at::parallel_for(0, B * chunks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<double> acc(kChunk);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / chunks, c0 = (t % chunks) * kChunk;
      const int64_t cw = std::min(R, c0 + kChunk) - c0;
      const T* xb = x + b * L * R + c0;
      Out* ob = out + b * n_out * R + c0;
      std::fill(acc.begin(), acc.begin() + cw, 0.0);
      const int64_t lo0 = -pad, hi0 = -pad + k - 1;
      for (int64_t j = std::max<int64_t>(lo0, 0); j <= std::min(hi0, L - 1); ++j) {
        const T* row = xb + j * R;
        for (int64_t c = 0; c < cw; ++c) acc[c] += row[c];
      }
      for (int64_t c = 0; c < cw; ++c) ob[c] = static_cast<Out>(acc[c]);
      for (int64_t i = 1; i < n_out; ++i) {
        const int64_t add = hi0 + i, sub = lo0 + i - 1;
        Out* orow = ob + i * R;
        const bool has_add = add >= 0 && add < L, has_sub = sub >= 0 && sub < L;
        if (has_add && has_sub) {
          const T* ar = xb + add * R;
          const T* sr = xb + sub * R;
          for (int64_t c = 0; c < cw; ++c) {
            acc[c] += static_cast<double>(ar[c]) - static_cast<double>(sr[c]);
            orow[c] = static_cast<Out>(acc[c]);
          }
        } else {
          if (has_add) { const T* ar = xb + add * R; for (int64_t c = 0; c < cw; ++c) acc[c] += ar[c]; }
          if (has_sub) { const T* sr = xb + sub * R; for (int64_t c = 0; c < cw; ++c) acc[c] -= sr[c]; }
          for (int64_t c = 0; c < cw; ++c) orow[c] = static_cast<Out>(acc[c]);
        }
      }
    }
  });
}

// One box_axis pass along `dim` of a contiguous tensor (box_sum.cpp); returns a new
// contiguous tensor with n_out along `dim`.
at::Tensor box_pass(const at::Tensor& x, int64_t dim, int64_t k, bool full);

}  // namespace cpu
}  // namespace simwarp
