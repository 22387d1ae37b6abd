// Scaling and squaring (docs/maths.md §8.3): one squaring u ← u + u(x + u(x)) at one pixel,
// and its backward, for host and device (cpu/squaring.cpp and cuda/squaring.cu run these).
//
// The sampling is grid_sampler's (ops/integrate_velocity.py `_square`: bilinear /
// trilinear, align_corners=True, "border" padding): the position x + u(x) along each axis
// is clipped to [0, n − 1], with a zero derivative on and beyond the border (grid_sampler's
// clip_coordinates_set_grad: "borders are considered out of bounds"); the lower neighbor
// is floor(p) with weight (floor(p) + 1) − p, the upper one floor(p) + 1 with weight
// p − floor(p), and a neighbor outside the image contributes nothing. A corner's weight
// is the product of its axes' weights taken from the last axis to the first (x·y[·z], as
// grid_sampler multiplies them). A non-finite position samples the first pixel.
#pragma once

#include "macros.h"

#include <cstdint>

namespace simwarp {

// p clipped to [0, n − 1]; *grad = ∂clip/∂p (0 on and beyond the border).
template <typename T>
SIMWARP_HD T squaring_clip(T p, int64_t n, T* grad) {
  const T top = static_cast<T>(n - 1);
  if (!(p > T(0))) { *grad = T(0); return T(0); }  // also NaN
  if (p >= top) { *grad = T(0); return top; }
  *grad = T(1);
  return p;
}

// The interpolation cell of one sample position (array-axis order, D = 2 or 3).
template <typename T, int D>
struct SquaringCell {
  int64_t lower[D];
  T upper_w[D];  // weight of the upper neighbor p − floor(p)
  T lower_w[D];  // weight of the lower one (floor(p) + 1) − p
  T clip_grad[D];

  SIMWARP_HD SquaringCell(const T* position, const int64_t* size) {
    for (int k = 0; k < D; ++k) {
      const T p = squaring_clip(position[k], size[k], clip_grad + k);
      const T fl = floor(p);
      lower[k] = static_cast<int64_t>(fl);
      upper_w[k] = p - fl;
      lower_w[k] = (fl + T(1)) - p;
    }
  }

  // Corner `b` (bit D − 1 − k set: upper neighbor along axis k, so b counts x fastest as
  // grid_sampler's nw, ne, sw, se): flat index, or −1 outside; its weight, and
  // ∂weight/∂p_k (before the clip) in dw[k] when dw is not null.
  SIMWARP_HD int64_t corner(int b, const int64_t* size, T* weight, T* dw) const {
    int64_t j = 0;
    T w = T(1);
    T factor[D];
    bool inside = true;
    for (int k = 0; k < D; ++k) {
      const bool up = (b >> (D - 1 - k)) & 1;
      const int64_t idx = lower[k] + (up ? 1 : 0);
      inside = inside && idx < size[k];
      j = j * size[k] + idx;
      factor[k] = up ? upper_w[k] : lower_w[k];
    }
    for (int k = D - 1; k >= 0; --k) w *= factor[k];
    *weight = w;
    if (dw != nullptr) {
      for (int k = 0; k < D; ++k) {
        const bool up = (b >> (D - 1 - k)) & 1;
        T g = up ? T(1) : T(-1);
        for (int m = D - 1; m >= 0; --m)
          if (m != k) g *= factor[m];
        dw[k] = g * clip_grad[k];
      }
    }
    return inside ? j : -1;
  }
};

// The factors of the first squaring's field u = scale · v, one per component (v: the
// op's input): read from v as it is sampled, so that scaling v takes no pass of its own,
// and applied to the gradient as the first squaring's backward adds it. `on` false: no
// factor (every later squaring). Held by value: the kernels take it as a parameter.
template <typename T>
struct SquaringScale {
  T s[3];
  bool on;

  // Component c's value x times its factor (selects, not an index: a kernel parameter
  // indexed at run time would be copied to local memory).
  SIMWARP_HD T operator()(int c, T x) const {
    return on ? (c == 0 ? s[0] : (c == 1 ? s[1] : s[2])) * x : x;
  }
};

// The n factors (0: none) of an op's scale argument, rounded to T (the op's dtype, as a
// product with a tensor of them would round them).
template <typename T>
SquaringScale<T> squaring_scale(const double* factors, size_t n) {
  SquaringScale<T> out{};
  out.on = n > 0;
  for (size_t c = 0; c < n && c < 3; ++c) out.s[c] = static_cast<T>(factors[c]);
  return out;
}

// Pixel i's coordinates (array order) in an image of `size`.
template <int D>
SIMWARP_HD void squaring_coords(int64_t i, const int64_t* size, int64_t* coord) {
  for (int k = D - 1; k >= 0; --k) { coord[k] = i % size[k]; i /= size[k]; }
}

// One squaring at pixel i of one field u = scale · v (v: (D, P)):
// out[c·P + i] = u_c(i) + u_c(i + u(i)); where `scaled` is not null, u_c(i) is written
// there too (the first squaring's input, which the backward reads).
template <typename T, int D>
SIMWARP_HD void squaring_forward_pixel(const T* v, T* out, int64_t i, int64_t P,
                                       const int64_t* size, SquaringScale<T> scale, T* scaled) {
  int64_t coord[D];
  squaring_coords<D>(i, size, coord);
  T here[D], position[D];
  for (int k = 0; k < D; ++k) {
    here[k] = scale(k, v[k * P + i]);
    position[k] = static_cast<T>(coord[k]) + here[k];
  }
  const SquaringCell<T, D> cell(position, size);
  T acc[D];
  for (int c = 0; c < D; ++c) acc[c] = T(0);
  for (int b = 0; b < (1 << D); ++b) {
    T w;
    const int64_t j = cell.corner(b, size, &w, nullptr);
    if (j < 0) continue;
    for (int c = 0; c < D; ++c) acc[c] += scale(c, v[c * P + j]) * w;
  }
  for (int c = 0; c < D; ++c) {
    out[c * P + i] = here[c] + acc[c];
    if (scaled != nullptr) scaled[c * P + i] = here[c];
  }
}

// The backward of one squaring at pixel i: with a (D, P) the gradient with respect to its
// output and u (D, P) its input, adds to `into` (D, P; zeroed by the caller, or for the
// first squaring filled with scale · base) pixel i's
// share of the gradient with respect to u: a(i) + ∂/∂u(i) of the sample position at i
// (a gather) and, through `add(index, value)`, w · a_c(i) to every corner j the sample
// read (a scatter: a plain += on the CPU, atomicAdd on CUDA). Each share is added times
// its component's factor of `scale`: for the first squaring, the gradient with respect to
// v of u = scale · v.
template <typename T, int D, typename Add>
SIMWARP_HD void squaring_backward_pixel(const T* a, const T* u, T* into, int64_t i, int64_t P,
                                        const int64_t* size, Add add, SquaringScale<T> scale) {
  int64_t coord[D];
  squaring_coords<D>(i, size, coord);
  T position[D];
  for (int k = 0; k < D; ++k) position[k] = static_cast<T>(coord[k]) + u[k * P + i];
  const SquaringCell<T, D> cell(position, size);
  T gpos[D];
  for (int k = 0; k < D; ++k) gpos[k] = T(0);
  for (int b = 0; b < (1 << D); ++b) {
    T w, dw[D];
    const int64_t j = cell.corner(b, size, &w, dw);
    if (j < 0) continue;
    T dot = T(0);
    for (int c = 0; c < D; ++c) {
      const T ac = a[c * P + i];
      add(c * P + j, scale(c, w * ac));
      dot += ac * u[c * P + j];
    }
    for (int k = 0; k < D; ++k) gpos[k] += dot * dw[k];
  }
  for (int k = 0; k < D; ++k) add(k * P + i, scale(k, a[k * P + i] + gpos[k]));
}

}  // namespace simwarp
