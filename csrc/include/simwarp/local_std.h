// Local standard deviation (docs/maths.md §1): per-element forward and its vector-Jacobian product.
//
// With S1 = Σ x and S2 = Σ x² over a window of N elements, V = S2 − S1²/N is N times the
// window's variance. V at or below flat_factor · S2 is within the rounding of the sums:
// the window is flat, V = 0, and no gradient flows. The forward returns
//   normalized:   sqrt(V / N)      (the standard deviation)
//   unnormalized: sqrt(V + eps)    (the window energy a ZNCC denominator needs)
// A is the accumulation type (double for float32 data: the cancellation in V needs it).
#pragma once

#include "macros.h"

namespace simwarp {

template <typename A>
SIMWARP_HD A local_std_forward(A s1, A s2, A inv_n, A eps, A flat_factor, bool normalized,
                               bool* flat) {
  A v = s2 - s1 * s1 * inv_n;
  *flat = v <= flat_factor * s2;
  if (*flat) v = A(0);
  return normalized ? sw_sqrt(v * inv_n) : sw_sqrt(v + eps);
}

// Given g = ∂L/∂out, the forward's output and S1, write ∂L/∂S1 and ∂L/∂S2 (= ∂L/∂V).
template <typename T>
SIMWARP_HD void local_std_vjp(T g, T out, T s1, T inv_n, bool normalized, bool flat, T* d_s1,
                              T* d_s2) {
  // out = sqrt(V / N) or sqrt(V + eps): ∂out/∂V = 1 / (2 N out) or 1 / (2 out). Both
  // selects come before the division (whose denominator is never 0), so the CPU loops
  // vectorize without a branch.
  const T den = flat ? T(1) : T(2) * (normalized ? out / inv_n : out);
  const T d_v = (flat ? T(0) : g) / den;
  *d_s2 = d_v;
  *d_s1 = d_v * (T(-2) * s1 * inv_n);
}

// ∂L/∂x = (∂L/∂S1 ⋆ 𝟙) + 2 x (∂L/∂S2 ⋆ 𝟙), given the two window sums of the partials.
template <typename T>
SIMWARP_HD T local_std_combine(T box_d_s1, T box_d_s2, T x) {
  return box_d_s1 + T(2) * x * box_d_s2;
}

}  // namespace simwarp
