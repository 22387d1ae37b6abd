// Local standard deviation (SPEC §1): per-element forward and its vector-Jacobian product.
//
// With S1 = Σ x and S2 = Σ x² over a window of N elements, V = S2 − S1²/N is N times the
// window's variance. The forward returns
//   normalized:   sqrt(max(V, 0) / N)      (the standard deviation)
//   unnormalized: sqrt(max(V, 0) + eps)    (the window energy a ZNCC denominator needs)
// and the backward gives zero gradient wherever V was clamped (V <= 0) or the output is 0.
#pragma once

#include "macros.h"

namespace simwarp {

template <typename T>
SIMWARP_HD T local_std_forward(T s1, T s2, T inv_n, T eps, bool normalized) {
  const T v = sw_max(s2 - s1 * s1 * inv_n, T(0));
  return normalized ? sw_sqrt(v * inv_n) : sw_sqrt(v + eps);
}

// Given g = ∂L/∂out and the forward's output `out`, write ∂L/∂S1 and ∂L/∂S2.
template <typename T>
SIMWARP_HD void local_std_vjp(T g, T out, T s1, T s2, T inv_n, bool normalized, T* d_s1, T* d_s2) {
  const T v = s2 - s1 * s1 * inv_n;
  T d_v = T(0);
  if (v > T(0) && out > T(0)) {
    // out = sqrt(c · v) with c = 1/N (normalized) or out = sqrt(v + eps): ∂out/∂v = c / (2 out).
    d_v = g * (normalized ? inv_n : T(1)) / (T(2) * out);
  }
  *d_s2 = d_v;
  *d_s1 = d_v * (T(-2) * s1 * inv_n);
}

// ∂L/∂x = (∂L/∂S1 ⋆ 𝟙) + 2 x (∂L/∂S2 ⋆ 𝟙), given the two window sums of the partials.
template <typename T>
SIMWARP_HD T local_std_combine(T box_d_s1, T box_d_s2, T x) {
  return box_d_s1 + T(2) * x * box_d_s2;
}

}  // namespace simwarp
