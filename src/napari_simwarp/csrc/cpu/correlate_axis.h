// One separable-correlation pass along one axis of a contiguous (B, L, R) array, on CPU.
// Shared by simwarp::correlate and the fused five-moment pass.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace simwarp {
namespace cpu {

// Along L of a contiguous (B, L, R) array. valid: n_out = L − k + 1; transpose: L + k − 1.
template <typename T>
inline void correlate_axis(const T* x, T* out, int64_t B, int64_t L, int64_t R, const std::vector<T>& w,
                    bool transpose, int64_t n_out) {
  const int64_t k = static_cast<int64_t>(w.size());
  if (R == 1) {
    at::parallel_for(0, B, 16, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const T* xl = x + b * L;
        T* ol = out + b * n_out;
        std::fill(ol, ol + n_out, T(0));
        for (int64_t j = 0; j < k; ++j) {
          const T wj = w[j];
          if (!transpose) {
            const T* src = xl + j;
            for (int64_t i = 0; i < n_out; ++i) ol[i] += wj * src[i];
          } else {
            T* dst = ol + j;  // out[m] += w[j] · y[m − j]  ⇔  out[i + j] += w[j] · y[i]
            for (int64_t i = 0; i < L; ++i) dst[i] += wj * xl[i];
          }
        }
      }
    });
    return;
  }
  // Inner axes: each output row is a weighted sum of k whole input rows (contiguous in R).
  constexpr int64_t kChunk = 1024;
  const int64_t chunks = (R + kChunk - 1) / kChunk;
  at::parallel_for(0, B * n_out * chunks, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c = t % chunks, rest = t / chunks;
      const int64_t i = rest % n_out, b = rest / n_out;
      const int64_t c0 = c * kChunk, cw = std::min(R, c0 + kChunk) - c0;
      T* orow = out + (b * n_out + i) * R + c0;
      std::fill(orow, orow + cw, T(0));
      const T* xb = x + b * L * R + c0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t src = transpose ? i - j : i + j;
        if (src < 0 || src >= L) continue;
        const T wj = w[j];
        const T* irow = xb + src * R;
        for (int64_t r = 0; r < cw; ++r) orow[r] += wj * irow[r];
      }
    }
  });
}


}  // namespace cpu
}  // namespace simwarp
