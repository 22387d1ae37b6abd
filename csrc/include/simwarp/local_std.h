// Local standard deviation (docs/maths.md §1): per-element forward and its vector-Jacobian product.
//
// With S1 = Σ x and S2 = Σ x² over a window of N elements, V = S2 − S1²/N is N times the
// window's variance. V at or below flat_factor · S2 is within the rounding of the sums:
// the window is flat, V = 0, and no gradient flows. The forward returns
//   normalized:   sqrt(V / N)      (the standard deviation)
//   unnormalized: sqrt(V + eps)    (the window energy a ZNCC denominator needs)
// A is the accumulation type (double for float32 data: the cancellation in V needs it).
// The CUDA kernels keep S1 and S2 as compensated sums in the data's own type instead
// (WindowMoments, local_std_forward_compensated): the same accuracy at float32's rate.
#pragma once

#include "compensated.h"
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

// S1 = Σy and S2 = Σy² of a window, as compensated sums: what the CUDA kernels carry from
// one window pass to the next.
template <typename T>
struct WindowMoments {
  Compensated<T> s1, s2;

  SIMWARP_HD void add(T y) {
    s1.add(y);
    s2.add_square(y);
  }
  SIMWARP_HD void sub(T y) {
    s1.sub(y);
    s2.sub_square(y);
  }
  SIMWARP_HD void add(const WindowMoments& m) {
    s1.add(m.s1);
    s2.add(m.s2);
  }
  SIMWARP_HD void sub(const WindowMoments& m) {
    s1.sub(m.s1);
    s2.sub(m.s2);
  }
};

// local_std_forward from compensated sums, in the data's type. N·V = N·S2 − S1² is formed
// from exact products, so V keeps the sums' precision (float32: about 48 bits, where a
// plain float32 V loses everything to the cancellation once the window's mean is ~1000
// times its spread). n is N; flat_factor is relative to that precision (calls.py).
template <typename T>
SIMWARP_HD T local_std_forward_compensated(const WindowMoments<T>& m, T n, T eps, T flat_factor,
                                           bool normalized, bool* flat) {
  Compensated<T> nv = exact_product(n, m.s2.hi);
  nv.lo += n * m.s2.lo;
  nv.sub(exact_product(m.s1.hi, m.s1.hi));
  nv.lo -= T(2) * m.s1.hi * m.s1.lo;  // (hi + lo)² − hi², less the negligible lo²
  T v = nv.value() / n;
  *flat = v <= flat_factor * m.s2.value();
  if (*flat) v = T(0);
  return normalized ? sw_sqrt(v / n) : sw_sqrt(v + eps);
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
