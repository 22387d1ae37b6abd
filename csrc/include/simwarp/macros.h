// One copy of the per-element maths for host and device.
//
// SIMWARP_HD marks a function that compiles as plain inline C++ in the CPU build and as
// __host__ __device__ under nvcc, so the CPU path runs (and CI tests) the very functions
// the CUDA kernels call (the MONAI resample_utils.h habit).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define SIMWARP_HD __host__ __device__ __forceinline__
#else
#define SIMWARP_HD inline
#endif

namespace simwarp {

// sqrt/max that resolve to the right overload on host and device.
template <typename T>
SIMWARP_HD T sw_max(T a, T b) { return a > b ? a : b; }

SIMWARP_HD float sw_sqrt(float v) { return sqrtf(v); }
SIMWARP_HD double sw_sqrt(double v) { return sqrt(v); }

}  // namespace simwarp
