// CUDA kernels of simwarp::local_ncc_fwd / local_ncc_bwd: the local NCC of SciPy-"reflect"
// padded 2-D images or 3-D volumes, box or Gaussian window, forward and backward, one
// kernel each, float32 (docs/maths.md §2.2; the maths of ops/local_ncc.py's
// _LocalNCCMetric and ops/_moments.py, which this kernel reproduces).
//
// Forward, one block of 16 x 16 threads per tile of TZ x 16 x 16 outputs (TZ = 8 for
// volumes, 1 for images) of one volume; each thread owns one (y, x) column of the tile:
//   1. the tile's shift m: the mean of its input box (the tile and its halo of k - 1 per
//      axis, the reflection applied to the index; no padded copy), a tree reduction;
//   2. for each input plane of the box along z: load both planes (centred on m) into
//      shared memory, the horizontal pass of the five moments (a, b, a², b², ab) into
//      shared memory, the vertical pass in registers, and each of the thread's TZ outputs
//      whose window holds that plane adds it with its z tap (registers, unrolled);
//   3. per output, the metric in registers. A window whose sum of squares about m
//      exceeds FLOAT32_RISK (128) times its variance is redone two-pass from the images
//      themselves (global memory, through L1/L2: rare): its mean μ, then the moments
//      about μ; its partials are converted back to moments about m (δ = μ - m):
//        p_a ← p_a + δ_a ρ/Va − δ_b r,  p_b ← p_b + δ_b ρ/Vb − δ_a r.
// Traffic: reads a and b once (the input boxes' overlap from L2; the shift's pass too),
// writes the map, 5 partial maps and two floats per tile: 8 floats per voxel.
//
// With the moments M about m (sums for a box, total n; weighted means for a Gaussian,
// n = 1), Va = M_aa − M_a²/n, Vb likewise, C = M_ab − M_a M_b / n, flat = Va <= f M_aa or
// Vb <= f M_bb (f = ops/_numerics.flat_threshold_factor), r = (Va Vb)^-½ (0 when flat),
// ρ = C r (the map clamps it to [-1, 1]), and the partials
//   P0 = (M_a ρ/Va − r M_b)/n,  P1 = (M_b ρ/Vb − r M_a)/n,  P2 = ρ/Va,  P3 = ρ/Vb,  P4 = r
// (∂ρ/∂M_a, ∂ρ/∂M_b, −2 ∂ρ/∂M_aa, −2 ∂ρ/∂M_bb, ∂ρ/∂M_ab; 1/V = 0 when flat).
//
// Backward, one block per tile of input voxels q (the same grid), G = upstream gradient:
//   ∂L/∂a_q = Σ_p w(p, q) G(p) [P0'(p) − (a_q − m) P2(p) + (b_q − m_b) P4(p)]
//   ∂L/∂b_q = Σ_p w(p, q) G(p) [P1'(p) − (b_q − m_b) P3(p) + (a_q − m) P4(p)]
// with m q's tile's shift and P0' converted from the shift of p's tile, m_p:
// P0' = P0 + (m_p − m) P2 − (m_b,p − m_b) P4 (P1' likewise). w(p, q) folds the reflection
// into the taps (ssim.cu's folded_tap), so nothing is folded afterwards. For each plane
// of outputs p along z within the halo: load G·(P0', P1', P2, P3, P4) for the plane's
// rows and columns within the halo into shared memory, the horizontal then vertical
// adjoint pass, and each of the thread's TZ voxels adds the plane with its folded z tap.
// Traffic: reads G, a, b, the five partial maps, writes the two gradients: 10 floats per
// voxel (9 when G is one value, "mean" reduction).
#include "launch.h"
#include "local_ncc.h"
#include "reflect_taps.h"
#include "tile_moments.h"

#include <cmath>

namespace simwarp {
namespace cuda {
namespace {

constexpr int kTile = kNccTile;
constexpr int kThreadsPerTile = kNccTile * kNccTile;
// ops/_moments.py's FLOAT32_RISK.
constexpr float kRisk = 128.0f;

// The block's tile: volume, first plane, row and column; its index among the volume's.
struct Tile {
  int64_t image, z0, y0, x0, index;
};

template <int TZ>
__device__ __forceinline__ Tile block_tile(int64_t tiles_z, int64_t tiles_y, int64_t tiles_x) {
  const int64_t per_image = tiles_z * tiles_y * tiles_x, b = blockIdx.x;
  const int64_t index = b % per_image;
  const int64_t tz = index / (tiles_y * tiles_x), rest = index % (tiles_y * tiles_x);
  return Tile{b / per_image, tz * TZ, (rest / tiles_x) * kTile, (rest % tiles_x) * kTile, index};
}

// The number of samples of [first, first + extent) at or before `last`.
__device__ __forceinline__ int64_t within(int64_t first, int64_t extent, int64_t last) {
  const int64_t n = last - first + 1;
  return n < extent ? (n > 0 ? n : 0) : extent;
}

template <int TZ>
__global__ void local_ncc_fwd_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                     float* __restrict__ map, float* __restrict__ partials,
                                     float* __restrict__ shifts, NccTaps taps, int64_t images,
                                     int64_t D, int64_t H, int64_t W, int64_t tiles_z,
                                     int64_t tiles_y, int64_t tiles_x, float inv_total,
                                     float flat_factor) {
  SIMWARP_DYNAMIC_SHARED(float, smem);
  const int rz = taps.kz / 2, ry = taps.ky / 2, rx = taps.kx / 2;
  const int RZ = TZ + 2 * rz, RY = kTile + 2 * ry, RX = kTile + 2 * rx;  // the input box
  const int in_plane = RY * RX, rows_plane = RY * kTile;
  float* in_a = smem;                // (RY, RX): one plane of the box, centred
  float* in_b = in_a + in_plane;     // (RY, RX)
  float* rows = in_b + in_plane;     // (5, RY, kTile): horizontal sums
  float* scratch = rows;             // (2, kThreadsPerTile) for the shift's reduction
  const int t = threadIdx.x;
  const Tile tile = block_tile<TZ>(tiles_z, tiles_y, tiles_x);
  const int64_t volume = D * H * W;
  const float* ai = a + tile.image * volume;
  const float* bi = b + tile.image * volume;
  // The padded volume ends at D − 1 + r per axis; past it (outputs past the volume only)
  // the box holds zeros, left out of the shift, as the unfused path's extension is.
  const int64_t last_z = D - 1 + rz, last_y = H - 1 + ry, last_x = W - 1 + rx;
  const int64_t bz = tile.z0 - rz, by = tile.y0 - ry, bx = tile.x0 - rx;

  // 1. The tile's shift.
  float sum_a = 0.0f, sum_b = 0.0f;
  const int64_t box = static_cast<int64_t>(RZ) * in_plane;
  for (int64_t e = t; e < box; e += kThreadsPerTile) {
    const int64_t gz = bz + e / in_plane, gy = by + (e % in_plane) / RX, gx = bx + e % RX;
    if (gz <= last_z && gy <= last_y && gx <= last_x) {
      const int64_t idx = (reflect(gz, D) * H + reflect(gy, H)) * W + reflect(gx, W);
      sum_a += ai[idx];
      sum_b += bi[idx];
    }
  }
  block_sums2<kThreadsPerTile>(scratch, sum_a, sum_b);
  const float count = static_cast<float>(within(bz, RZ, last_z) * within(by, RY, last_y) *
                                         within(bx, RX, last_x));
  const float shift_a = scratch[0] / count, shift_b = scratch[kThreadsPerTile] / count;
  const int64_t per_image = tiles_z * tiles_y * tiles_x;
  if (t == 0 && shifts != nullptr) {
    shifts[tile.image * per_image + tile.index] = shift_a;
    shifts[(images + tile.image) * per_image + tile.index] = shift_b;
  }

  // 2. The moments, plane by plane of the box.
  float acc[TZ][5];
#pragma unroll
  for (int oz = 0; oz < TZ; ++oz)
#pragma unroll
    for (int m = 0; m < 5; ++m) acc[oz][m] = 0.0f;
  const int ly = t / kTile, lx = t % kTile;
  const int planes = static_cast<int>(within(bz, RZ, last_z));
  for (int pl = 0; pl < planes; ++pl) {
    __syncthreads();  // the previous plane's passes are done (and the shift read)
    const int64_t gz = reflect(bz + pl, D);
    for (int e = t; e < in_plane; e += kThreadsPerTile) {
      const int64_t gy = by + e / RX, gx = bx + e % RX;
      float va = 0.0f, vb = 0.0f;
      if (gy <= last_y && gx <= last_x) {
        const int64_t idx = (gz * H + reflect(gy, H)) * W + reflect(gx, W);
        va = ai[idx] - shift_a;
        vb = bi[idx] - shift_b;
      }
      in_a[e] = va;
      in_b[e] = vb;
    }
    __syncthreads();
    horizontal_moments5<kTile, kThreadsPerTile>(in_a, in_b, RY, RX, taps, rows);
    __syncthreads();
    float s[5];
    vertical_sums<5, kTile>(rows, rows_plane, taps.wy, taps.ky, ly, lx, s);
#pragma unroll
    for (int oz = 0; oz < TZ; ++oz) {
      const int j = pl - oz;  // the plane's tap in output oz's window
      if (j >= 0 && j < taps.kz) {
        const float w = taps.wz[j];
#pragma unroll
        for (int m = 0; m < 5; ++m) acc[oz][m] += w * s[m];
      }
    }
  }

  // 3. The metric and its partials, per output of the thread's column.
  const int64_t gy = tile.y0 + ly, gx = tile.x0 + lx;
  if (gy >= H || gx >= W) return;  // no barrier follows
  const int64_t all = images * volume;
#pragma unroll
  for (int oz = 0; oz < TZ; ++oz) {
    const int64_t gz = tile.z0 + oz;
    if (gz >= D) break;
    float sa = acc[oz][0], sb = acc[oz][1], saa = acc[oz][2], sbb = acc[oz][3],
          sab = acc[oz][4];
    float delta_a = 0.0f, delta_b = 0.0f;
    const float va1 = saa - sa * sa * inv_total, vb1 = sbb - sb * sb * inv_total;
    const bool risky = saa > kRisk * va1 || sbb > kRisk * vb1;
    if (risky) {
      // Two-pass from the volumes themselves: differences from the window's mean round
      // no coarser than the data (from the centred plane they would keep its rounding).
      const float center_a = shift_a + sa * inv_total, center_b = shift_b + sb * inv_total;
      delta_a = center_a - shift_a;
      delta_b = center_b - shift_b;
      float m[5] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      for (int k = 0; k < taps.kz; ++k) {
        const int64_t z = reflect(gz - rz + k, D);
        for (int j = 0; j < taps.ky; ++j) {
          const int64_t y = reflect(gy - ry + j, H);
          const float wzy = taps.wz[k] * taps.wy[j];
          for (int i = 0; i < taps.kx; ++i) {
            const int64_t idx = (z * H + y) * W + reflect(gx - rx + i, W);
            add_moments5(wzy * taps.wx[i], ai[idx] - center_a, bi[idx] - center_b, m);
          }
        }
      }
      sa = m[0];
      sb = m[1];
      saa = m[2];
      sbb = m[3];
      sab = m[4];
    }
    const float va = saa - sa * sa * inv_total, vb = sbb - sb * sb * inv_total;
    const float cov = sab - sa * sb * inv_total;
    const bool flat = va <= saa * flat_factor || vb <= sbb * flat_factor;
    const float inv_va = flat ? 0.0f : 1.0f / va, inv_vb = flat ? 0.0f : 1.0f / vb;
    const float r = std::sqrt(inv_va * inv_vb);
    const float rho = cov * r;
    const int64_t at = tile.image * volume + (gz * H + gy) * W + gx;
    map[at] = rho < -1.0f ? -1.0f : (rho > 1.0f ? 1.0f : rho);  // as clamp_
    if (partials == nullptr) continue;
    const float p2 = rho * inv_va, p3 = rho * inv_vb;
    float p0 = (sa * p2 - r * sb) * inv_total, p1 = (sb * p3 - r * sa) * inv_total;
    if (risky) {  // to moments about the tile's shift
      p0 += delta_a * p2 - delta_b * r;
      p1 += delta_b * p3 - delta_a * r;
    }
    partials[at] = p0;
    partials[all + at] = p1;
    partials[2 * all + at] = p2;
    partials[3 * all + at] = p3;
    partials[4 * all + at] = r;
  }
}

template <int TZ>
__global__ void local_ncc_bwd_kernel(const float* __restrict__ grad, bool grad_is_scalar,
                                     const float* __restrict__ a, const float* __restrict__ b,
                                     const float* __restrict__ partials,
                                     const float* __restrict__ shifts, float* __restrict__ grad_a,
                                     float* __restrict__ grad_b, NccTaps taps, int64_t images,
                                     int64_t D, int64_t H, int64_t W, int64_t tiles_z,
                                     int64_t tiles_y, int64_t tiles_x) {
  SIMWARP_DYNAMIC_SHARED(float, smem);
  const int rz = taps.kz / 2, ry = taps.ky / 2, rx = taps.kx / 2;
  const int RZ = TZ + 2 * rz, RY = kTile + 2 * ry, RX = kTile + 2 * rx;
  const int in_plane = RY * RX, rows_plane = RY * kTile;
  float* maps = smem;                 // (5, RY, RX): G·(P0', P1', P2, P3, P4) of one plane
  float* rows = maps + 5 * in_plane;  // (5, RY, kTile): horizontal sums
  const int t = threadIdx.x;
  const Tile tile = block_tile<TZ>(tiles_z, tiles_y, tiles_x);
  const int64_t volume = D * H * W, all = images * volume;
  const int64_t per_image = tiles_z * tiles_y * tiles_x;
  const float* shifts_a = shifts + tile.image * per_image;
  const float* shifts_b = shifts + (images + tile.image) * per_image;
  const float m_a = shifts_a[tile.index], m_b = shifts_b[tile.index];
  const int64_t bz = tile.z0 - rz, by = tile.y0 - ry, bx = tile.x0 - rx;
  const int ly = t / kTile, lx = t % kTile;
  const int64_t qy = tile.y0 + ly, qx = tile.x0 + lx;

  float acc[TZ][5];
#pragma unroll
  for (int oz = 0; oz < TZ; ++oz)
#pragma unroll
    for (int m = 0; m < 5; ++m) acc[oz][m] = 0.0f;
  for (int pl = 0; pl < RZ; ++pl) {
    const int64_t pz = bz + pl;
    if (pz < 0 || pz >= D) continue;  // the same for every thread of the block
    __syncthreads();                  // the previous plane's passes are done
    // 1. The weighted partial maps of every output of the plane whose window reaches the
    // tile.
    for (int e = t; e < in_plane; e += kThreadsPerTile) {
      const int64_t py = by + e / RX, px = bx + e % RX;
      float x[5] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      if (py >= 0 && py < H && px >= 0 && px < W) {
        const int64_t at = tile.image * volume + (pz * H + py) * W + px;
        const float g = grad_is_scalar ? grad[0] : grad[at];
        const float p2 = partials[2 * all + at], p3 = partials[3 * all + at];
        const float p4 = partials[4 * all + at];
        const int64_t p_tile = ((pz / TZ) * tiles_y + py / kTile) * tiles_x + px / kTile;
        const float da = shifts_a[p_tile] - m_a, db = shifts_b[p_tile] - m_b;
        x[0] = g * (partials[at] + da * p2 - db * p4);
        x[1] = g * (partials[all + at] + db * p3 - da * p4);
        x[2] = g * p2;
        x[3] = g * p3;
        x[4] = g * p4;
      }
#pragma unroll
      for (int m = 0; m < 5; ++m) maps[m * in_plane + e] = x[m];
    }
    __syncthreads();
    // 2. Horizontal adjoint pass with the folded taps.
    adjoint_rows<5, kTile, kThreadsPerTile>(maps, in_plane, RX, rows, rows_plane, taps.wx, rx,
                                            W, bx);
    __syncthreads();
    // 3. Vertical adjoint pass, then the plane's share of each voxel of the column.
    if (qy < H && qx < W) {
      float s[5];
      adjoint_column<5, kTile>(rows, rows_plane, taps.wy, ry, H, by, qy, lx, s);
#pragma unroll
      for (int oz = 0; oz < TZ; ++oz) {
        const int64_t qz = tile.z0 + oz;
        if (qz < D && pz - qz <= rz && qz - pz <= rz) {
          const float w = folded_tap(taps.wz, rz, D, pz, qz);
#pragma unroll
          for (int m = 0; m < 5; ++m) acc[oz][m] += w * s[m];
        }
      }
    }
  }

  // 4. The gradients.
  if (qy >= H || qx >= W) return;
#pragma unroll
  for (int oz = 0; oz < TZ; ++oz) {
    const int64_t qz = tile.z0 + oz;
    if (qz >= D) break;
    const int64_t at = tile.image * volume + (qz * H + qy) * W + qx;
    const float ca = a[at] - m_a, cb = b[at] - m_b;
    grad_a[at] = acc[oz][0] - ca * acc[oz][2] + cb * acc[oz][4];
    grad_b[at] = acc[oz][1] - cb * acc[oz][3] + ca * acc[oz][4];
  }
}

}  // namespace

size_t local_ncc_fwd_shared_bytes(int ky, int kx) {
  return tile_shared_bytes<kTile>(2, 5, ky, kx);
}

size_t local_ncc_bwd_shared_bytes(int ky, int kx) {
  return tile_shared_bytes<kTile>(5, 5, ky, kx);
}

cudaError_t launch_local_ncc_fwd(const float* a, const float* b, float* map, float* partials,
                                 float* shifts, const NccTaps& taps, int64_t images, int64_t D,
                                 int64_t H, int64_t W, float inv_total, float flat_factor,
                                 cudaStream_t stream) {
  const int64_t tz = ncc_tile_z(D, taps.kz);
  const int64_t tiles_z = ncc_tiles(D, tz), tiles_y = ncc_tiles(H, kTile);
  const int64_t tiles_x = ncc_tiles(W, kTile), blocks = images * tiles_z * tiles_y * tiles_x;
  const size_t bytes = local_ncc_fwd_shared_bytes(taps.ky, taps.kx);
  if (tz == 1)
    return launch_cooperative(&local_ncc_fwd_kernel<1>, blocks, kThreadsPerTile, bytes, stream,
                              a, b, map, partials, shifts, taps, images, D, H, W, tiles_z,
                              tiles_y, tiles_x, inv_total, flat_factor);
  return launch_cooperative(&local_ncc_fwd_kernel<kNccTileZ>, blocks, kThreadsPerTile, bytes,
                            stream, a, b, map, partials, shifts, taps, images, D, H, W, tiles_z,
                            tiles_y, tiles_x, inv_total, flat_factor);
}

cudaError_t launch_local_ncc_bwd(const float* grad, bool grad_is_scalar, const float* a,
                                 const float* b, const float* partials, const float* shifts,
                                 float* grad_a, float* grad_b, const NccTaps& taps,
                                 int64_t images, int64_t D, int64_t H, int64_t W,
                                 cudaStream_t stream) {
  const int64_t tz = ncc_tile_z(D, taps.kz);
  const int64_t tiles_z = ncc_tiles(D, tz), tiles_y = ncc_tiles(H, kTile);
  const int64_t tiles_x = ncc_tiles(W, kTile), blocks = images * tiles_z * tiles_y * tiles_x;
  const size_t bytes = local_ncc_bwd_shared_bytes(taps.ky, taps.kx);
  if (tz == 1)
    return launch_cooperative(&local_ncc_bwd_kernel<1>, blocks, kThreadsPerTile, bytes, stream,
                              grad, grad_is_scalar, a, b, partials, shifts, grad_a, grad_b,
                              taps, images, D, H, W, tiles_z, tiles_y, tiles_x);
  return launch_cooperative(&local_ncc_bwd_kernel<kNccTileZ>, blocks, kThreadsPerTile, bytes,
                            stream, grad, grad_is_scalar, a, b, partials, shifts, grad_a,
                            grad_b, taps, images, D, H, W, tiles_z, tiles_y, tiles_x);
}

}  // namespace cuda
}  // namespace simwarp
