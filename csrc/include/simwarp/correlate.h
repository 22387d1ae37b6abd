// One output element of a 1-D correlation and of its transpose, for host and device.
//
// valid:      out[i] = Σ_j w[j] · x[i + j]              i ∈ [0, L − k]
// transpose:  out[m] = Σ_j w[j] · y[m − j]  (y = 0 outside [0, L))   m ∈ [0, L + k − 2]
// The transpose is the adjoint of the valid correlation (what its backward needs); it is
// not a correlation with the same taps unless they are symmetric, so it is spelled out.
#pragma once

#include "macros.h"

#include <cstdint>

namespace simwarp {

template <typename T, typename W>
SIMWARP_HD T correlate_valid_at(const T* x, int64_t stride, const W* w, int64_t k, int64_t i) {
  W acc = W(0);
  for (int64_t j = 0; j < k; ++j) acc += w[j] * static_cast<W>(x[(i + j) * stride]);
  return static_cast<T>(acc);
}

template <typename T, typename W>
SIMWARP_HD T correlate_transpose_at(const T* y, int64_t stride, int64_t L, const W* w, int64_t k,
                                    int64_t m) {
  W acc = W(0);
  const int64_t j0 = m - (L - 1) > 0 ? m - (L - 1) : 0;
  const int64_t j1 = m < k - 1 ? m : k - 1;
  for (int64_t j = j0; j <= j1; ++j) acc += w[j] * static_cast<W>(y[(m - j) * stride]);
  return static_cast<T>(acc);
}

}  // namespace simwarp
