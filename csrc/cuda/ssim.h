// Launchers of cuda/ssim.cu, the fused 2-D Gaussian SSIM of simwarp::ssim_fwd / ssim_bwd
// (docs/maths.md §5; the op's maths in ssim.cu). Raw pointers and a stream, no torch
// types, so the .cu compiles with nvcc alone.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace simwarp {
namespace cuda {

// Output tiles of kSsimTile x kSsimTile pixels, one block of kSsimTile² threads each.
constexpr int kSsimTile = 16;
// The longest window axis the fused kernels take: the backward's shared memory for 31
// taps per axis, 4 · (46² + 46 · 16) floats, stays under CUDA's default 48 KiB.
constexpr int kSsimMaxTaps = 31;

struct SsimTaps {
  float wy[kSsimMaxTaps];  // the taps along H
  float wx[kSsimMaxTaps];  // the taps along W
  int ky, kx;              // odd, at most kSsimMaxTaps, at most H and W
};

// Dynamic shared memory of each kernel's block for windows (ky, kx), in bytes.
size_t ssim_fwd_shared_bytes(int ky, int kx);
size_t ssim_bwd_shared_bytes(int ky, int kx);

// Tiles along H and W of an H x W image.
inline int64_t ssim_tiles(int64_t n) { return (n + kSsimTile - 1) / kSsimTile; }

// Forward over `images` images (H, W) each of a and b: map (images, H, W); when
// partials is not null, the four partial maps (4, images, H, W) and the tiles' shifts
// (2, images, tiles_y, tiles_x) the backward reads.
cudaError_t launch_ssim_fwd(const float* a, const float* b, float* map, float* partials,
                            float* shifts, const SsimTaps& taps, int64_t images, int64_t H,
                            int64_t W, float c1, float c2, cudaStream_t stream);

// Backward: grad_a, grad_b (images, H, W) from the upstream gradient (a map (images, H, W),
// or one value when grad_is_scalar) and what the forward returned.
cudaError_t launch_ssim_bwd(const float* grad, bool grad_is_scalar, const float* a,
                            const float* b, const float* partials, const float* shifts,
                            float* grad_a, float* grad_b, const SsimTaps& taps, int64_t images,
                            int64_t H, int64_t W, cudaStream_t stream);

}  // namespace cuda
}  // namespace simwarp
