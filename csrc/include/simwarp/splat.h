// Splatting (docs/maths.md §4): where one source pixel lands and its share of each of the 2ᴰ
// neighbors, for host and device.
//
// A source pixel at q moved by d lands at p = q + d. Along each axis the lower neighbor
// is floor(p) with weight 1 − f and the upper one floor(p) + 1 with weight f, f = p −
// floor(p). Neighbors outside [0, n − 1] receive nothing (their share leaves the image);
// a non-finite p lands nowhere. The weight of a corner is the product of its axes' hats,
// and ∂weight/∂d_k = ±Π_{m≠k} hat_m (+ for the upper neighbor along k).
#pragma once

#include "macros.h"

#include <cstdint>

namespace simwarp {

template <typename T>
SIMWARP_HD bool splat_axis(T position, int64_t n, int64_t* lower, T* frac) {
  if (!(position == position) || position > T(n) || position < T(-1)) return false;  // NaN / far off
  const T fl = floor(position);
  *lower = static_cast<int64_t>(fl);
  *frac = position - fl;
  return true;
}

// Landing cell of a source pixel in D dimensions (D = 2 or 3), array-axis order.
template <typename T, int D>
struct SplatCell {
  int64_t lower[D];
  T frac[D];
  bool valid;

  SIMWARP_HD SplatCell(const T* position, const int64_t* size) : valid(true) {
    for (int k = 0; k < D; ++k) valid = valid && splat_axis(position[k], size[k], lower + k, frac + k);
  }

  // Corner `bits` (bit k set: upper neighbor along axis k): flat index in an array of
  // `size`, or −1 when outside; its weight; and ∂weight/∂position_k in grad[k].
  SIMWARP_HD int64_t corner(int bits, const int64_t* size, T* weight, T* grad) const {
    T hat[D];
    int64_t flat = 0;
    bool inside = true;
    for (int k = 0; k < D; ++k) {
      const bool upper = (bits >> (D - 1 - k)) & 1;
      const int64_t c = lower[k] + (upper ? 1 : 0);
      inside = inside && c >= 0 && c < size[k];
      flat = flat * size[k] + c;
      hat[k] = upper ? frac[k] : T(1) - frac[k];
    }
    T w = T(1);
    for (int k = 0; k < D; ++k) w *= hat[k];
    *weight = w;
    if (grad != nullptr) {
      for (int k = 0; k < D; ++k) {
        const bool upper = (bits >> (D - 1 - k)) & 1;
        T g = upper ? T(1) : T(-1);
        for (int m = 0; m < D; ++m) if (m != k) g *= hat[m];
        grad[k] = g;
      }
    }
    return inside ? flat : -1;
  }
};

// Per destination j, what the backward gathers (normalized mode): v_c(j)/den(j) and the
// value-independent part of the displacement slope, v_den(j) − Σ_c out_c(j) v_c(j)/den(j).
// Holes (den <= eps) pass nothing.
template <typename T>
SIMWARP_HD T splat_scaled_grad(T v, T den, T eps, bool normalize) {
  if (den <= eps) return T(0);
  return normalize ? v / den : v;
}

}  // namespace simwarp
