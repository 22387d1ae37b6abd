// SciPy's "reflect" border applied to the index, for the fused tiled kernels (ssim.cu,
// local_ncc.cu): no padded copy is made, a tile's halo reads reflect their index, and the
// backward folds the reflection into its taps. No torch headers: the .cu files include it.
#pragma once

#include <cstdint>

#include "launch.h"

namespace simwarp {
namespace cuda {

// SciPy's "reflect" (half-sample symmetric) of a padded index i in [−r, n − 1 + r], r < n.
__device__ __forceinline__ int64_t reflect(int64_t i, int64_t n) {
  return i < 0 ? -1 - i : (i >= n ? 2 * n - 1 - i : i);
}

// The weight with which input q enters the window of output p along one axis of n samples
// (taps w of 2r + 1): the taps of every padded position reflecting to q within it.
__device__ __forceinline__ float folded_tap(const float* w, int r, int64_t n, int64_t p,
                                            int64_t q) {
  float s = 0.0f;
  const int64_t k = 2 * r;
  int64_t j = q - p + r;  // q itself
  if (j >= 0 && j <= k) s += w[j];
  j = -1 - q - p + r;  // its mirror before the axis
  if (j >= 0 && j <= k) s += w[j];
  j = 2 * n - 1 - q - p + r;  // its mirror past the axis
  if (j >= 0 && j <= k) s += w[j];
  return s;
}

}  // namespace cuda
}  // namespace simwarp
