// Launchers of cuda/local_std_fused.cu, the fused 2-D local std of simwarp::local_std_fused_fwd /
// local_std_fused_bwd: the image padded (SciPy's modes) and centred inside the kernels, one
// kernel per pass. Raw pointers and a stream, no torch types, so the .cu compiles with nvcc
// alone.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "simwarp/padding.h"

namespace simwarp {
namespace cuda {

// Output tiles of kLocalStdTile² pixels, one block of kLocalStdTile² threads each.
constexpr int kLocalStdTile = 16;
// The longest window axis the fused kernels take (shared memory under 48 KiB).
constexpr int kLocalStdMaxWindow = 31;

struct BoxWindow {
  int ky, kx;    // odd, at most kLocalStdMaxWindow and the axis
  Padding mode;  // reflect, mirror, nearest or constant
};

size_t local_std_fused_fwd_shared_bytes(int ky, int kx);
size_t local_std_fused_bwd_shared_bytes(int ky, int kx);

// Forward over `images` images (H, W) of x, each centred on its shift (images,): out, s1
// (the window sums of the centred values) and flat (images, H, W), as local_std_fwd's.
cudaError_t launch_local_std_fused_fwd(const float* x, const float* shift, float* out, float* s1,
                                       bool* flat, const BoxWindow& window, int64_t images,
                                       int64_t H, int64_t W, float eps, float flat_factor,
                                       bool normalize, cudaStream_t stream);

// Backward: dx (images, H, W) from grad and what the forward returned.
cudaError_t launch_local_std_fused_bwd(const float* grad, const float* out, const float* s1,
                                       const bool* flat, const float* x, const float* shift,
                                       float* dx, const BoxWindow& window, int64_t images,
                                       int64_t H, int64_t W, bool normalize, cudaStream_t stream);

}  // namespace cuda
}  // namespace simwarp
