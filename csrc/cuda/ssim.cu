// CUDA kernels of simwarp::ssim_fwd / ssim_bwd: the 2-D Gaussian SSIM of SciPy-"reflect"
// padded images, forward and backward, one kernel each, float32 (docs/maths.md §5).
//
// Forward, one block per 16 x 16 tile of outputs of one image:
//   1. load both images' tile inputs (the tile and its halo of k − 1) into shared memory,
//      the reflection applied to the index (no padded copy), and the block's mean of
//      each (a tree reduction): the tile's shift m, written for the backward;
//   2. centre the tile on m (float32 sums of values near their window's mean keep the
//      variance, docs/maths.md §1.3);
//   3. horizontal pass: the five moments (a, b, a², b², ab) of each input row, for the
//      tile's 16 columns, into shared memory;
//   4. vertical pass, one thread per output: the five moments, the SSIM and its partial
//      maps, in registers. A window whose sum of squares about m exceeds FLOAT32_RISK
//      (128, ops/_moments.py) times its variance plus C2/2 is redone two-pass from the
//      images themselves in global memory (L2), about its own mean: the differences then
//      round no coarser than the data, as in ops/_moments.py and cuda/local_ncc.cu (from
//      the centred copy they would keep the spacing of |a − m|, coarse in a dim region
//      beside a bright one); its first moments are then taken back to the tile's shift.
// Traffic: reads a and b once (plus halos, and the windows of risky outputs, from L2),
// writes the map, 4 partial maps and two floats per tile: 7 floats per pixel.
//
// With M the window moments of the centred images (M_a = W⋆(a − m), ...), μ = M_a + m,
// σa² = M_aa − M_a², σab = M_ab − M_a M_b, A1 = 2μaμb + C1, B1 = μa² + μb² + C1,
// A2 = 2σab + C2, B2 = σa² + σb² + C2, S = A1 A2 / (B1 B2), r = 1 / (B1 B2), the
// partials of S with respect to (M_a, M_b, M_aa = M_bb, M_ab) are stored as
//   pa = 2r (μb A2 − μa B2 S + M_a B1 S − M_b A1)     (∂S/∂M_a, the others held)
//   pb = 2r (μa A2 − μb B2 S + M_b B1 S − M_a A1)
//   pv = S / B2 = −∂S/∂σ² = −∂S/∂M_aa = −∂S/∂M_bb
//   pc = 2 A1 r = ∂S/∂σab = ∂S/∂M_ab
// (in terms of M, small numbers, not of the plain moments, whose partials cancel).
//
// Backward, one block per 16 x 16 tile of input pixels q (the same grid: the output of a
// "same" filter has the image's shape), with G = upstream gradient:
//   ∂L/∂a_q = Σ_p w(p, q) G(p) [pa'(p) − 2 (a_q − m) pv(p) + (b_q − m_b) pc(p)]
// and the same for b with a and b swapped; m is the block's own tile's shift and pa' is
// pa converted from the shift of p's tile, m_p, to m (the moments about m and m_p differ
// by constants): pa' = pa − 2 (m − m_p) pv + (m_b − m_b,p) pc. w(p, q) folds the
// reflection into the taps: the sum of the taps that put pixel q (directly or mirrored)
// into the window of output p, so no padded gradient buffer is folded afterwards. Every p
// whose window reaches q, mirrored or not, lies within the halo of q's tile, so:
//   1. load G·(pa', pb', pv, pc) for the tile and its halo (zeros outside the image);
//   2. horizontal pass of the four maps with the folded taps into shared memory;
//   3. vertical pass, one thread per pixel: the four adjoint sums, then both gradients.
// Traffic: reads G, a, b, the four partial maps, writes the two gradients: 9 floats per
// pixel (8 when G is one value, "mean" reduction).
#include "launch.h"
#include "reflect_taps.h"
#include "ssim.h"
#include "tile_moments.h"

namespace simwarp {
namespace cuda {
namespace {

constexpr int kTile = kSsimTile;
constexpr int kThreadsPerTile = kSsimTile * kSsimTile;
// ops/_moments.py's FLOAT32_RISK.
constexpr float kRisk = 128.0f;

// The block's tile: image, first row and column; the index of its tile among the image's.
struct Tile {
  int64_t image, y0, x0, index;
};

__device__ __forceinline__ Tile block_tile(int64_t tiles_y, int64_t tiles_x) {
  const int64_t per_image = tiles_y * tiles_x, b = blockIdx.x;
  const int64_t index = b % per_image;
  return Tile{b / per_image, (index / tiles_x) * kTile, (index % tiles_x) * kTile, index};
}

__global__ void ssim_fwd_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                float* __restrict__ map, float* __restrict__ partials,
                                float* __restrict__ shifts, SsimTaps taps, int64_t images,
                                int64_t H, int64_t W, int64_t tiles_y, int64_t tiles_x,
                                float c1, float c2) {
  SIMWARP_DYNAMIC_SHARED(float, smem);
  const int ry = taps.ky / 2, rx = taps.kx / 2;
  const int RY = kTile + 2 * ry, RX = kTile + 2 * rx;  // the tile's input
  float* in_a = smem;                // (RY, RX), centred
  float* in_b = in_a + RY * RX;      // (RY, RX)
  float* rows = in_b + RY * RX;      // (5, RY, kTile): horizontal sums
  float* scratch = rows;             // (2, kThreadsPerTile) before the horizontal pass
  const int t = threadIdx.x;
  const Tile tile = block_tile(tiles_y, tiles_x);
  const int64_t plane = H * W;
  const float* ai = a + tile.image * plane;
  const float* bi = b + tile.image * plane;

  // 1. The inputs (padded rows and columns up to H − 1 + r, W − 1 + r; zeros past them,
  // read only by outputs past the image) and their sums.
  const int64_t last_y = H - 1 + ry, last_x = W - 1 + rx;
  float sum_a = 0.0f, sum_b = 0.0f;
  for (int e = t; e < RY * RX; e += kThreadsPerTile) {
    const int64_t gy = tile.y0 - ry + e / RX, gx = tile.x0 - rx + e % RX;
    float va = 0.0f, vb = 0.0f;
    if (gy <= last_y && gx <= last_x) {
      const int64_t idx = reflect(gy, H) * W + reflect(gx, W);
      va = ai[idx];
      vb = bi[idx];
    }
    in_a[e] = va;
    in_b[e] = vb;
    sum_a += va;
    sum_b += vb;
  }
  block_sums2<kThreadsPerTile>(scratch, sum_a, sum_b);
  const int64_t rows_in = (last_y - (tile.y0 - ry) + 1) < RY ? last_y - (tile.y0 - ry) + 1 : RY;
  const int64_t cols_in = (last_x - (tile.x0 - rx) + 1) < RX ? last_x - (tile.x0 - rx) + 1 : RX;
  const float count = static_cast<float>(rows_in * cols_in);
  const float shift_a = scratch[0] / count, shift_b = scratch[kThreadsPerTile] / count;
  if (t == 0 && shifts != nullptr) {
    shifts[tile.image * tiles_y * tiles_x + tile.index] = shift_a;
    shifts[(images + tile.image) * tiles_y * tiles_x + tile.index] = shift_b;
  }
  // 2. Centre (the zeros past the padded image stay zeros).
  for (int e = t; e < RY * RX; e += kThreadsPerTile) {
    const int64_t gy = tile.y0 - ry + e / RX, gx = tile.x0 - rx + e % RX;
    if (gy <= last_y && gx <= last_x) {
      in_a[e] -= shift_a;
      in_b[e] -= shift_b;
    }
  }
  __syncthreads();  // the centred inputs are written, the scratch sums read

  // 3. Horizontal pass.
  horizontal_moments5<kTile, kThreadsPerTile>(in_a, in_b, RY, RX, taps, rows);
  __syncthreads();

  // 4. Vertical pass, the SSIM and its partials.
  const int ly = t / kTile, ox = t % kTile;
  const int64_t gy = tile.y0 + ly, gx = tile.x0 + ox;
  if (gy >= H || gx >= W) return;  // no barrier follows
  float sums[5];
  vertical_sums<5, kTile>(rows, RY * kTile, taps.wy, taps.ky, ly, ox, sums);
  float mx = sums[0], my = sums[1];
  const float mxx = sums[2], myy = sums[3], mxy = sums[4];
  float va = mxx - mx * mx, vb = myy - my * my, cov = mxy - mx * my;
  const float floor = 0.5f * c2;
  float mua = mx + shift_a, mub = my + shift_b;
  if (mxx > kRisk * (va + floor) || myy > kRisk * (vb + floor)) {
    // Two-pass from the images themselves (the reflection applied to the index), about
    // the window's mean as the one pass found it: the centred copy in shared memory holds
    // a − m rounded to the spacing of |a − m|, coarser than the data wherever the tile's
    // mean is more than twice the window's values (a dim region beside a bright one).
    const float ca = mua, cb = mub;
    float m[5] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int j = 0; j < taps.ky; ++j) {
      const int64_t row = reflect(gy - ry + j, H) * W;
      float r[5] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      for (int i = 0; i < taps.kx; ++i) {
        const int64_t idx = row + reflect(gx - rx + i, W);
        add_moments5(taps.wx[i], ai[idx] - ca, bi[idx] - cb, r);
      }
      const float w = taps.wy[j];
#pragma unroll
      for (int k = 0; k < 5; ++k) m[k] += w * r[k];
    }
    // The taps sum to 1: m[0], m[1] are the means' offsets from the centres.
    va = m[2] - m[0] * m[0];
    vb = m[3] - m[1] * m[1];
    cov = m[4] - m[0] * m[1];
    mua = ca + m[0];
    mub = cb + m[1];
    // The partials below take the first moments about the tile's shift (the backward's).
    mx = mua - shift_a;
    my = mub - shift_b;
  }
  const float a1 = 2.0f * mua * mub + c1, b1 = mua * mua + mub * mub + c1;
  const float a2 = 2.0f * cov + c2, b2 = va + vb + c2;
  const float r = 1.0f / (b1 * b2);
  const float s = a1 * a2 * r;
  const int64_t at = tile.image * plane + gy * W + gx;
  map[at] = s;
  if (partials == nullptr) return;
  const int64_t all = images * plane;
  const float r2 = 2.0f * r;
  partials[at] = r2 * (mub * a2 - mua * b2 * s + mx * b1 * s - my * a1);
  partials[all + at] = r2 * (mua * a2 - mub * b2 * s + my * b1 * s - mx * a1);
  partials[2 * all + at] = s / b2;
  partials[3 * all + at] = a1 * r2;
}

__global__ void ssim_bwd_kernel(const float* __restrict__ grad, bool grad_is_scalar,
                                const float* __restrict__ a, const float* __restrict__ b,
                                const float* __restrict__ partials,
                                const float* __restrict__ shifts, float* __restrict__ grad_a,
                                float* __restrict__ grad_b, SsimTaps taps, int64_t images,
                                int64_t H, int64_t W, int64_t tiles_y, int64_t tiles_x) {
  SIMWARP_DYNAMIC_SHARED(float, smem);
  const int ry = taps.ky / 2, rx = taps.kx / 2;
  const int RY = kTile + 2 * ry, RX = kTile + 2 * rx;
  const int in_plane = RY * RX, rows_plane = RY * kTile;
  float* maps = smem;                  // (4, RY, RX): G·(pa', pb', pv, pc)
  float* rows = maps + 4 * in_plane;  // (4, RY, kTile): horizontal sums
  const int t = threadIdx.x;
  const Tile tile = block_tile(tiles_y, tiles_x);
  const int64_t plane = H * W, all = images * plane, per_image = tiles_y * tiles_x;
  const float* shifts_a = shifts + tile.image * per_image;
  const float* shifts_b = shifts + (images + tile.image) * per_image;
  const float m_a = shifts_a[tile.index], m_b = shifts_b[tile.index];

  // 1. The weighted partial maps of every output whose window reaches the tile.
  for (int e = t; e < in_plane; e += kThreadsPerTile) {
    const int64_t py = tile.y0 - ry + e / RX, px = tile.x0 - rx + e % RX;
    float xa = 0.0f, xb = 0.0f, xv = 0.0f, xc = 0.0f;
    if (py >= 0 && py < H && px >= 0 && px < W) {
      const int64_t at = tile.image * plane + py * W + px;
      const float g = grad_is_scalar ? grad[0] : grad[at];
      const float pv = partials[2 * all + at], pc = partials[3 * all + at];
      const int64_t p_tile = (py / kTile) * tiles_x + px / kTile;
      const float da = m_a - shifts_a[p_tile], db = m_b - shifts_b[p_tile];
      xa = g * (partials[at] - 2.0f * da * pv + db * pc);
      xb = g * (partials[all + at] - 2.0f * db * pv + da * pc);
      xv = g * pv;
      xc = g * pc;
    }
    maps[e] = xa;
    maps[in_plane + e] = xb;
    maps[2 * in_plane + e] = xv;
    maps[3 * in_plane + e] = xc;
  }
  __syncthreads();

  // 2. Horizontal adjoint pass with the folded taps.
  adjoint_rows<4, kTile, kThreadsPerTile>(maps, in_plane, RX, rows, rows_plane, taps.wx, rx, W,
                                          tile.x0 - rx);
  __syncthreads();

  // 3. Vertical adjoint pass and the gradients.
  const int ly = t / kTile, ox = t % kTile;
  const int64_t qy = tile.y0 + ly, qx = tile.x0 + ox;
  if (qy >= H || qx >= W) return;
  float q[4];
  adjoint_column<4, kTile>(rows, rows_plane, taps.wy, ry, H, tile.y0 - ry, qy, ox, q);
  const int64_t at = tile.image * plane + qy * W + qx;
  const float ca = a[at] - m_a, cb = b[at] - m_b;
  grad_a[at] = q[0] - 2.0f * ca * q[2] + cb * q[3];
  grad_b[at] = q[1] - 2.0f * cb * q[2] + ca * q[3];
}

}  // namespace

size_t ssim_fwd_shared_bytes(int ky, int kx) {
  return tile_shared_bytes<kTile>(2, 5, ky, kx);
}

size_t ssim_bwd_shared_bytes(int ky, int kx) {
  return tile_shared_bytes<kTile>(4, 4, ky, kx);
}

cudaError_t launch_ssim_fwd(const float* a, const float* b, float* map, float* partials,
                            float* shifts, const SsimTaps& taps, int64_t images, int64_t H,
                            int64_t W, float c1, float c2, cudaStream_t stream) {
  const int64_t tiles_y = ssim_tiles(H), tiles_x = ssim_tiles(W);
  return launch_cooperative(&ssim_fwd_kernel, images * tiles_y * tiles_x, kThreadsPerTile,
                            ssim_fwd_shared_bytes(taps.ky, taps.kx), stream, a, b, map,
                            partials, shifts, taps, images, H, W, tiles_y, tiles_x, c1, c2);
}

cudaError_t launch_ssim_bwd(const float* grad, bool grad_is_scalar, const float* a,
                            const float* b, const float* partials, const float* shifts,
                            float* grad_a, float* grad_b, const SsimTaps& taps, int64_t images,
                            int64_t H, int64_t W, cudaStream_t stream) {
  const int64_t tiles_y = ssim_tiles(H), tiles_x = ssim_tiles(W);
  return launch_cooperative(&ssim_bwd_kernel, images * tiles_y * tiles_x, kThreadsPerTile,
                            ssim_bwd_shared_bytes(taps.ky, taps.kx), stream, grad,
                            grad_is_scalar, a, b, partials, shifts, grad_a, grad_b, taps,
                            images, H, W, tiles_y, tiles_x);
}

}  // namespace cuda
}  // namespace simwarp
