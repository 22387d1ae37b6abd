// Where a padded position reads from: SciPy's boundary conventions, shared by CPU and CUDA.
//
// Positions are in source coordinates (a pad before the axis is negative, a pad after it
// is n or more); the result is the source index, or −1 where the pad holds zero.
#pragma once

#include <cstdint>

#include "macros.h"

namespace simwarp {

enum class Padding : int {
  kValid = 0,    // no padding: the input already is the padded map
  kReflect = 1,   // half-sample symmetric (c b a | a b c | c b a), SciPy "reflect"
  kConstant = 2,  // zeros outside, SciPy "constant" with cval 0
  kNearest = 3,   // edge replicated, SciPy "nearest"
  kMirror = 4,    // whole-sample symmetric (c b | a b c | b a), SciPy "mirror"
};

SIMWARP_HD int64_t pad_source(int64_t i, int64_t n, Padding mode) {
  if (i >= 0 && i < n) return i;
  if (mode == Padding::kReflect) {  // period 2n, so pads longer than the axis work too
    int64_t m = i % (2 * n);
    if (m < 0) m += 2 * n;
    return m >= n ? 2 * n - 1 - m : m;
  }
  if (mode == Padding::kMirror) {  // period 2n − 2; an axis of one sample repeats it
    if (n == 1) return 0;
    int64_t m = i % (2 * n - 2);
    if (m < 0) m += 2 * n - 2;
    return m >= n ? 2 * n - 2 - m : m;
  }
  if (mode == Padding::kNearest) return i < 0 ? 0 : n - 1;
  return -1;
}

}  // namespace simwarp
