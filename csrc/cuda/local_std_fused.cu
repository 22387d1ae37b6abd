// CUDA kernels of simwarp::local_std_fused_fwd / local_std_fused_bwd: the 2-D local std over
// a box window (docs/maths.md §1) with SciPy's padding applied to the index and the
// centring on each image's shift done on load, so that no padded, centred copy of the
// image is made; the sums are the compensated float32 sums of local_std.cu (about 48 bits,
// include/simwarp/local_std.h), so values, the flat rule and gradients are those of
// local_std_fwd / local_std_bwd on center_and_pad's output.
//
// Forward, one block per 16 x 16 tile of outputs: the tile's input (tile and halo k − 1,
// padded and centred) into shared memory; horizontal pass: compensated S1, S2 of each input
// row for the tile's 16 columns into shared memory; vertical pass, one thread per output:
// S1, S2 of the window, out, s1 and flat. Traffic: read x, write out, s1, flat (3.25 maps).
//
// Backward, one block per 16 x 16 tile of pixels q (the output has the image's shape):
// ∂L/∂x_q = Σ_p w(p, q) (d1(p) + 2 (x_q − m) d2(p)), d1 = ∂L/∂S1, d2 = ∂L/∂S2 (the vjp of
// local_std.h) and w(p, q) the number of padded positions of p's window that read q (the
// padding folded into the box's taps: 1 inside, more or none near the borders); every p
// with w(p, q) > 0 lies within the halo of q's tile. Traffic: read grad, out, s1, flat, x,
// write dx (5.25 maps).
#include "launch.h"
#include "local_std_fused.h"
#include "simwarp/local_std.h"

namespace simwarp {
namespace cuda {
namespace {

constexpr int kTile = kLocalStdTile;
constexpr int kThreadsPerTile = kLocalStdTile * kLocalStdTile;

struct Tile {
  int64_t image, y0, x0;
};

__device__ __forceinline__ Tile block_tile(int64_t tiles_y, int64_t tiles_x) {
  const int64_t per_image = tiles_y * tiles_x, b = blockIdx.x, index = b % per_image;
  return Tile{b / per_image, (index / tiles_x) * kTile, (index % tiles_x) * kTile};
}

// How many positions of the window of output p (2r + 1 long, padded axis of n) read input q.
__device__ __forceinline__ float box_fold(int r, int64_t n, Padding mode, int64_t p, int64_t q) {
  if (q > r && q < n - 1 - r) return 1.0f;  // no padded position reaches q: only q itself
  int count = 0;
  for (int64_t i = p - r; i <= p + r; ++i) count += pad_source(i, n, mode) == q;
  return static_cast<float>(count);
}

__global__ void local_std_fused_fwd_kernel(const float* __restrict__ x,
                                           const float* __restrict__ shift,
                                           float* __restrict__ out, float* __restrict__ s1,
                                           bool* __restrict__ flat, BoxWindow window,
                                           int64_t H, int64_t W, int64_t tiles_y,
                                           int64_t tiles_x, float eps, float flat_factor,
                                           bool normalize) {
  SIMWARP_DYNAMIC_SHARED(float, smem);
  const int ry = window.ky / 2, rx = window.kx / 2;
  const int RY = kTile + 2 * ry, RX = kTile + 2 * rx, rows_plane = RY * kTile;
  float* in = smem;          // (RY, RX): the padded, centred input
  float* rows = in + RY * RX;  // (4, RY, kTile): S1 and S2 of each row, hi and lo
  const int t = threadIdx.x;
  const Tile tile = block_tile(tiles_y, tiles_x);
  const float* xi = x + tile.image * H * W;
  const float m = shift[tile.image];
  const int64_t last_y = H - 1 + ry, last_x = W - 1 + rx;

  for (int e = t; e < RY * RX; e += kThreadsPerTile) {
    const int64_t gy = tile.y0 - ry + e / RX, gx = tile.x0 - rx + e % RX;
    float v = 0.0f;  // past the padded image: read by outputs past the image only
    if (gy <= last_y && gx <= last_x) {
      const int64_t sy = pad_source(gy, H, window.mode), sx = pad_source(gx, W, window.mode);
      v = (sy < 0 || sx < 0 ? 0.0f : xi[sy * W + sx]) - m;  // "constant": zeros, centred
    }
    in[e] = v;
  }
  __syncthreads();

  for (int e = t; e < rows_plane; e += kThreadsPerTile) {
    const float* line = in + (e / kTile) * RX + e % kTile;
    WindowMoments<float> acc;
    for (int i = 0; i < window.kx; ++i) acc.add(line[i]);
    const Compensated<float> a1 = acc.s1.normalized(), a2 = acc.s2.normalized();
    rows[e] = a1.hi;
    rows[rows_plane + e] = a1.lo;
    rows[2 * rows_plane + e] = a2.hi;
    rows[3 * rows_plane + e] = a2.lo;
  }
  __syncthreads();

  const int ly = t / kTile, ox = t % kTile;
  const int64_t gy = tile.y0 + ly, gx = tile.x0 + ox;
  if (gy >= H || gx >= W) return;
  WindowMoments<float> acc;
  for (int j = 0; j < window.ky; ++j) {
    const int e = (ly + j) * kTile + ox;
    WindowMoments<float> row;
    row.s1 = Compensated<float>(rows[e], rows[rows_plane + e]);
    row.s2 = Compensated<float>(rows[2 * rows_plane + e], rows[3 * rows_plane + e]);
    acc.add(row);
  }
  const int64_t at = tile.image * H * W + gy * W + gx;
  bool is_flat;
  out[at] = local_std_forward_compensated(acc, static_cast<float>(window.ky * window.kx), eps,
                                          flat_factor, normalize, &is_flat);
  flat[at] = is_flat;
  s1[at] = acc.s1.value();
}

__global__ void local_std_fused_bwd_kernel(const float* __restrict__ grad,
                                           const float* __restrict__ out,
                                           const float* __restrict__ s1,
                                           const bool* __restrict__ flat,
                                           const float* __restrict__ x,
                                           const float* __restrict__ shift,
                                           float* __restrict__ dx, BoxWindow window, int64_t H,
                                           int64_t W, int64_t tiles_y, int64_t tiles_x,
                                           bool normalize) {
  SIMWARP_DYNAMIC_SHARED(float, smem);
  const int ry = window.ky / 2, rx = window.kx / 2;
  const int RY = kTile + 2 * ry, RX = kTile + 2 * rx;
  const int in_plane = RY * RX, rows_plane = RY * kTile;
  float* d = smem;                  // (2, RY, RX): ∂L/∂S1, ∂L/∂S2 of the outputs
  float* rows = d + 2 * in_plane;  // (2, RY, kTile): their folded row sums
  const int t = threadIdx.x;
  const Tile tile = block_tile(tiles_y, tiles_x);
  const int64_t plane = tile.image * H * W;
  const float inv_n = 1.0f / static_cast<float>(window.ky * window.kx);

  for (int e = t; e < in_plane; e += kThreadsPerTile) {
    const int64_t py = tile.y0 - ry + e / RX, px = tile.x0 - rx + e % RX;
    float d1 = 0.0f, d2 = 0.0f;
    if (py >= 0 && py < H && px >= 0 && px < W) {
      const int64_t at = plane + py * W + px;
      local_std_vjp(grad[at], out[at], s1[at], inv_n, normalize, flat[at], &d1, &d2);
    }
    d[e] = d1;
    d[in_plane + e] = d2;
  }
  __syncthreads();

  for (int e = t; e < rows_plane; e += kThreadsPerTile) {
    const int ly = e / kTile;
    const int64_t qx = tile.x0 + e % kTile;
    float a1 = 0.0f, a2 = 0.0f;
    if (qx < W) {
      const int64_t lo = qx - rx > 0 ? qx - rx : 0, hi = qx + rx < W - 1 ? qx + rx : W - 1;
      for (int64_t px = lo; px <= hi; ++px) {
        const float w = box_fold(rx, W, window.mode, px, qx);
        const int l = ly * RX + static_cast<int>(px - (tile.x0 - rx));
        a1 += w * d[l];
        a2 += w * d[in_plane + l];
      }
    }
    rows[e] = a1;
    rows[rows_plane + e] = a2;
  }
  __syncthreads();

  const int ly = t / kTile, ox = t % kTile;
  const int64_t qy = tile.y0 + ly, qx = tile.x0 + ox;
  if (qy >= H || qx >= W) return;
  float b1 = 0.0f, b2 = 0.0f;
  const int64_t lo = qy - ry > 0 ? qy - ry : 0, hi = qy + ry < H - 1 ? qy + ry : H - 1;
  for (int64_t py = lo; py <= hi; ++py) {
    const float w = box_fold(ry, H, window.mode, py, qy);
    const int e = static_cast<int>(py - (tile.y0 - ry)) * kTile + ox;
    b1 += w * rows[e];
    b2 += w * rows[rows_plane + e];
  }
  const int64_t at = plane + qy * W + qx;
  dx[at] = local_std_combine(b1, b2, x[at] - shift[tile.image]);
}

}  // namespace

size_t local_std_fused_fwd_shared_bytes(int ky, int kx) {
  const size_t RY = kTile + ky - 1, RX = kTile + kx - 1;
  return (RY * RX + 4 * RY * kTile) * sizeof(float);
}

size_t local_std_fused_bwd_shared_bytes(int ky, int kx) {
  const size_t RY = kTile + ky - 1, RX = kTile + kx - 1;
  return (2 * RY * RX + 2 * RY * kTile) * sizeof(float);
}

cudaError_t launch_local_std_fused_fwd(const float* x, const float* shift, float* out, float* s1,
                                       bool* flat, const BoxWindow& window, int64_t images,
                                       int64_t H, int64_t W, float eps, float flat_factor,
                                       bool normalize, cudaStream_t stream) {
  const int64_t tiles_y = (H + kTile - 1) / kTile, tiles_x = (W + kTile - 1) / kTile;
  return launch_cooperative(&local_std_fused_fwd_kernel, images * tiles_y * tiles_x,
                            kThreadsPerTile, local_std_fused_fwd_shared_bytes(window.ky, window.kx),
                            stream, x, shift, out, s1, flat, window, H, W, tiles_y, tiles_x, eps,
                            flat_factor, normalize);
}

cudaError_t launch_local_std_fused_bwd(const float* grad, const float* out, const float* s1,
                                       const bool* flat, const float* x, const float* shift,
                                       float* dx, const BoxWindow& window, int64_t images,
                                       int64_t H, int64_t W, bool normalize, cudaStream_t stream) {
  const int64_t tiles_y = (H + kTile - 1) / kTile, tiles_x = (W + kTile - 1) / kTile;
  return launch_cooperative(&local_std_fused_bwd_kernel, images * tiles_y * tiles_x,
                            kThreadsPerTile, local_std_fused_bwd_shared_bytes(window.ky, window.kx),
                            stream, grad, out, s1, flat, x, shift, dx, window, H, W, tiles_y,
                            tiles_x, normalize);
}

}  // namespace cuda
}  // namespace simwarp
