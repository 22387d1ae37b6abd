// Compensated sums: about twice the working precision from working-precision arithmetic.
//
// The CUDA kernels sum in the data's own type (float32 runs at full rate on every GPU,
// float64 at 1/64 on most of the GPUs microscopists own), and keep the accuracy of the
// CPU's double accumulators this way (docs/maths.md §1.3). A value is hi + lo with lo the
// rounding error of hi, kept exactly by Knuth's two-sum (additions) and by a fused
// multiply-add (products), so a float32 sum carries about 48 significant bits.
// These are error-free transformations: they hold only if the compiler neither reassociates
// nor contracts them, which is the default of nvcc and of g++ without -ffast-math.
#pragma once

#include "macros.h"

namespace simwarp {

SIMWARP_HD float sw_fma(float a, float b, float c) { return fmaf(a, b, c); }
SIMWARP_HD double sw_fma(double a, double b, double c) { return fma(a, b, c); }

template <typename T>
struct Compensated {
  T hi, lo;

  SIMWARP_HD Compensated() : hi(T(0)), lo(T(0)) {}
  SIMWARP_HD Compensated(T hi_, T lo_) : hi(hi_), lo(lo_) {}

  // hi + v with its rounding error moved into lo (two-sum: exact for any order of sizes).
  SIMWARP_HD void add(T v) {
    const T s = hi + v, z = s - hi;
    lo += (hi - (s - z)) + (v - z);
    hi = s;
  }
  SIMWARP_HD void sub(T v) { add(-v); }
  SIMWARP_HD void add(const Compensated& v) {
    add(v.hi);
    lo += v.lo;
  }
  SIMWARP_HD void sub(const Compensated& v) {
    add(-v.hi);
    lo -= v.lo;
  }
  // ± v², the product split exactly into its rounded value and its error.
  SIMWARP_HD void add_square(T v) {
    const T p = v * v;
    add(p);
    lo += sw_fma(v, v, -p);
  }
  SIMWARP_HD void sub_square(T v) {
    const T p = v * v;
    add(-p);
    lo -= sw_fma(v, v, -p);
  }

  SIMWARP_HD T value() const { return hi + lo; }
  // The same value as a normalized pair (hi the rounded sum, lo what it leaves), the form
  // a pass stores for the next one.
  SIMWARP_HD Compensated normalized() const {
    const T s = hi + lo;
    return Compensated(s, lo - (s - hi));
  }
};

// a · b exactly, as a compensated value (a fused multiply-add gives the product's error).
template <typename T>
SIMWARP_HD Compensated<T> exact_product(T a, T b) {
  const T p = a * b;
  return Compensated<T>(p, sw_fma(a, b, -p));
}

}  // namespace simwarp
