// The Parzen-window joint histogram of mutual information (docs/maths.md §10), for host
// and device: each pixel's bin coordinate, its cubic B-spline cell, the 4 taps and their
// slopes, and the entropies' closed-form gradient (ops/mutual_information.py holds the
// pure torch twin: _pair_bin_coordinates, _bspline3_cells, score_and_gradient).
//
// Intensities x map to bin coordinates ξ = 1 + (bins − 3) · clamp((x − lo) / span, 0, 1),
// so that the four taps β³(ξ − k), k = cell − 1 … cell + 2, cell = ⌊ξ⌋ ≤ bins − 3, all
// fall inside [0, bins − 1] and sum to 1.
#pragma once

#include "macros.h"

#include <cstdint>

namespace simwarp {

// A non-finite value counts as 0 (torch.nan_to_num(x, 0, 0, 0)); x − x is 0 exactly where
// x is finite (the same test the torch path makes).
template <typename T>
SIMWARP_HD T parzen_finite_or_zero(T x) { return (x - x) == T(0) ? x : T(0); }

// The span of a frame [lo, hi]: 1 where it is empty or inverted (no pixel counted).
template <typename T>
SIMWARP_HD T parzen_span(T lo, T hi) {
  const T span = hi - lo;
  return span > T(0) ? span : T(1);
}

// The unit coordinate (x − lo) / span before the clamp: the clamp's gradient passes where
// it lies in [0, 1] (torch's clamp backward, inclusive at both ends).
template <typename T>
SIMWARP_HD T parzen_unit(T x, T lo, T span) { return (x - lo) / span; }

template <typename T>
SIMWARP_HD T parzen_xi(T unit, int64_t bins) {
  const T u = unit < T(0) ? T(0) : (unit > T(1) ? T(1) : unit);
  return u * static_cast<T>(bins - 3) + T(1);
}

// ⌊ξ⌋ clamped to [1, bins − 3] (ξ ≥ 1: the truncation is the floor), and f = ξ − cell.
template <typename T>
SIMWARP_HD int64_t parzen_cell(T xi, int64_t bins, T* f) {
  int64_t cell = static_cast<int64_t>(xi);
  cell = cell < 1 ? 1 : (cell > bins - 3 ? bins - 3 : cell);
  *f = xi - static_cast<T>(cell);
  return cell;
}

// The cubic B-spline's taps β³(ξ − k) of bins k = cell − 1 … cell + 2 at f = ξ − cell.
template <typename T>
SIMWARP_HD void parzen_weights(T f, T* w) {
  const T g = T(1) - f, f2 = f * f, f3 = f2 * f;
  w[0] = g * g * g / T(6);
  w[1] = T(2) / T(3) - f2 + f3 / T(2);
  w[2] = T(1) / T(6) + (f + f2 - f3) / T(2);
  w[3] = f3 / T(6);
}

// Their derivatives with respect to ξ.
template <typename T>
SIMWARP_HD void parzen_slopes(T f, T* s) {
  const T g = T(1) - f, f2 = f * f;
  s[0] = -g * g / T(2);
  s[1] = T(1.5) * f2 - T(2) * f;
  s[2] = T(0.5) + f - T(1.5) * f2;
  s[3] = f2 / T(2);
}

// The smallest probability a logarithm sees: float's smallest normal number, 1e-300 in
// double (the torch path's _tiny).
template <typename W>
SIMWARP_HD W parzen_tiny() { return sizeof(W) == 4 ? W(1.17549435e-38f) : W(1e-300); }

}  // namespace simwarp
