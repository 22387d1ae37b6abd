// Launchers of cuda/local_ncc.cu, the fused local NCC of simwarp::local_ncc_fwd /
// local_ncc_bwd (docs/maths.md §2.2; the op's maths in local_ncc.cu). Raw pointers and a
// stream, no torch types, so the .cu compiles with nvcc alone.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace simwarp {
namespace cuda {

// Output tiles of kNccTileZ x kNccTile x kNccTile voxels (3-D; 1 x kNccTile x kNccTile in
// 2-D), one block of kNccTile² threads each, every thread walking its column along z.
constexpr int kNccTile = 16;
constexpr int kNccTileZ = 8;
// The longest window axis the fused kernels take: the backward's shared memory for 25
// taps along H and W, 5 · (40² + 40 · 16) floats, stays under CUDA's default 48 KiB.
constexpr int kNccMaxTaps = 25;

struct NccTaps {
  float wz[kNccMaxTaps];  // the taps along D (one tap of 1 for 2-D images)
  float wy[kNccMaxTaps];  // along H
  float wx[kNccMaxTaps];  // along W
  int kz, ky, kx;         // odd, at most kNccMaxTaps and the image's sizes
};

// Dynamic shared memory of each kernel's block for windows (ky, kx), in bytes.
size_t local_ncc_fwd_shared_bytes(int ky, int kx);
size_t local_ncc_bwd_shared_bytes(int ky, int kx);

// Tiles along an axis of n samples with tiles of `tile`.
inline int64_t ncc_tiles(int64_t n, int64_t tile) { return (n + tile - 1) / tile; }
// The tile's depth for images of depth D (1: 2-D images, viewed as D = 1).
inline int64_t ncc_tile_z(int64_t D, int kz) { return D == 1 && kz == 1 ? 1 : kNccTileZ; }

// Forward over `images` volumes (D, H, W) of a and b (D = 1 for 2-D images): map (images,
// D, H, W); when partials is not null, the five partial maps (5, images, D, H, W) and the
// tiles' shifts (2, images, tiles_z, tiles_y, tiles_x) the backward reads. inv_total is
// 1 / (the window's weight sum), flat_factor the relative level below which a variance
// counts as 0 (ops/_numerics.py).
cudaError_t launch_local_ncc_fwd(const float* a, const float* b, float* map, float* partials,
                                 float* shifts, const NccTaps& taps, int64_t images, int64_t D,
                                 int64_t H, int64_t W, float inv_total, float flat_factor,
                                 cudaStream_t stream);

// Backward: grad_a, grad_b (images, D, H, W) from the upstream gradient (a map, or one
// value when grad_is_scalar) and what the forward returned.
cudaError_t launch_local_ncc_bwd(const float* grad, bool grad_is_scalar, const float* a,
                                 const float* b, const float* partials, const float* shifts,
                                 float* grad_a, float* grad_b, const NccTaps& taps,
                                 int64_t images, int64_t D, int64_t H, int64_t W,
                                 cudaStream_t stream);

}  // namespace cuda
}  // namespace simwarp
