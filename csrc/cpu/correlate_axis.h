// One separable-correlation pass along one axis of a contiguous (B, L, R) array, on CPU.
// Shared by simwarp::correlate and the five-moment pass.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace simwarp {
namespace cpu {

// o[c] = Σ_q w[q] · rows[q][c] for c < n, q < k, summed in ascending q: every pass of a
// correlation is this, with rows the shifted line (last axis) or whole rows (inner axes).
// Outputs go in blocks held in registers while the k rows stream past (one load per
// multiply-add), instead of k read-modify-write sweeps over o.
template <typename T>
inline void weighted_rows(const T* const* rows, const T* w, int64_t k, int64_t n, T* o) {
  constexpr int64_t kBlock = 16;
  int64_t c = 0;
  for (; c + kBlock <= n; c += kBlock) {
    T acc[kBlock] = {};
    for (int64_t q = 0; q < k; ++q) {
      const T wq = w[q];
      const T* r = rows[q] + c;
      // Vectorize across the block (GCC otherwise vectorizes q, with gathers).
#pragma omp simd
      for (int64_t l = 0; l < kBlock; ++l) acc[l] += wq * r[l];
    }
    for (int64_t l = 0; l < kBlock; ++l) o[c + l] = acc[l];
  }
  for (; c < n; ++c) {
    T acc = T(0);
    for (int64_t q = 0; q < k; ++q) acc += w[q] * rows[q][c];
    o[c] = acc;
  }
}

// o[i] = Σ_j w[j] · s[i + j], i < n: the valid correlation of one line. shifted holds
// w.size() pointers of scratch.
template <typename T>
inline void correlate_line(const T* s, const std::vector<T>& w, int64_t n, T* o,
                           std::vector<const T*>& shifted) {
  for (size_t j = 0; j < w.size(); ++j) shifted[j] = s + j;
  weighted_rows(shifted.data(), w.data(), static_cast<int64_t>(w.size()), n, o);
}

// Along L of a contiguous (B, L, R) array. valid: n_out = L − k + 1, out[i] = Σ_j w[j]
// x[i + j]; transpose (the adjoint): n_out = L + k − 1, out[m] = Σ_j w[j] x[m − j] with
// zeros outside [0, L).
template <typename T>
inline void correlate_axis(const T* x, T* out, int64_t B, int64_t L, int64_t R,
                           const std::vector<T>& w, bool transpose, int64_t n_out) {
  const int64_t k = static_cast<int64_t>(w.size());
  if (R == 1) {
    // The transpose is the valid correlation, with the taps reversed, of the line between
    // k − 1 zeros on each side.
    const std::vector<T> taps = transpose ? std::vector<T>(w.rbegin(), w.rend()) : w;
    at::parallel_for(0, B, 16, [&](int64_t b0, int64_t b1) {
      std::vector<T> padded(transpose ? L + 2 * (k - 1) : 0, T(0));
      std::vector<const T*> shifted(k);
      for (int64_t b = b0; b < b1; ++b) {
        const T* line = x + b * L;
        if (transpose) {
          std::copy(line, line + L, padded.begin() + (k - 1));
          line = padded.data();
        }
        correlate_line(line, taps, n_out, out + b * n_out, shifted);
      }
    });
    return;
  }
  // Inner axes: each output row is a weighted sum of up to k whole input rows.
  constexpr int64_t kChunk = 1024;
  const int64_t chunks = (R + kChunk - 1) / kChunk;
  at::parallel_for(0, B * n_out * chunks, 64, [&](int64_t t0, int64_t t1) {
    std::vector<const T*> rows(k);
    std::vector<T> weights(k);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c = t % chunks, rest = t / chunks;
      const int64_t i = rest % n_out, b = rest / n_out;
      const int64_t c0 = c * kChunk, cw = std::min(R, c0 + kChunk) - c0;
      const T* xb = x + b * L * R + c0;
      int64_t used = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t src = transpose ? i - j : i + j;
        if (src < 0 || src >= L) continue;
        rows[used] = xb + src * R;
        weights[used++] = w[j];
      }
      weighted_rows(rows.data(), weights.data(), used, cw, out + (b * n_out + i) * R + c0);
    }
  });
}

}  // namespace cpu
}  // namespace simwarp
