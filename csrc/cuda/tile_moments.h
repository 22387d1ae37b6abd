// The passes over a tile in shared memory that the fused tiled kernels (ssim.cu,
// local_ncc.cu) share: the block's two sums, the five moments (a, b, a², b², ab) of a pair
// of tile inputs, horizontal then vertical, and the adjoint passes of the backward with the
// reflection folded into the taps (reflect_taps.h). Each kernel keeps what is its own:
// what it loads, its metric and its partials. No torch headers: the .cu files include it.
//
// A tile is kTile x kTile outputs, one block of kThreads = kTile² threads; its input
// plane is (RY, RX) = (kTile + ky − 1, kTile + kx − 1) in shared memory; the horizontal
// sums are (N, RY, kTile), one plane of rows_plane = RY · kTile floats per map.
#pragma once

#include <cstddef>
#include <cstdint>

#include "launch.h"
#include "reflect_taps.h"

namespace simwarp {
namespace cuda {

// Dynamic shared memory of a tile kernel's block for windows (ky, kx): `planes` input
// planes (RY, RX) and `sums` maps of horizontal sums (RY, kTile), in bytes.
template <int kTile>
inline size_t tile_shared_bytes(int planes, int sums, int ky, int kx) {
  const size_t RY = kTile + ky - 1, RX = kTile + kx - 1;
  return (planes * RY * RX + sums * RY * kTile) * sizeof(float);
}

// m[0..4] += w · (x, y, x², y², xy): one sample of a pair's five moments.
__device__ __forceinline__ void add_moments5(float w, float x, float y, float* m) {
  const float wx = w * x, wy = w * y;
  m[0] += wx;
  m[1] += wy;
  m[2] += wx * x;
  m[3] += wy * y;
  m[4] += wx * y;
}

// The block's sums of every thread's sum_a and sum_b, left in scratch[0] and
// scratch[kThreads] (scratch: 2 · kThreads floats of shared memory; a tree reduction,
// every thread of the block calls it: it meets barriers).
template <int kThreads>
__device__ __forceinline__ void block_sums2(float* scratch, float sum_a, float sum_b) {
  const int t = threadIdx.x;
  scratch[t] = sum_a;
  scratch[kThreads + t] = sum_b;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (t < stride) {
      scratch[t] += scratch[t + stride];
      scratch[kThreads + t] += scratch[kThreads + t + stride];
    }
    __syncthreads();
  }
}

// Horizontal pass of the five moments: rows[m][row][ox] = Σ_i taps.wx[i] · moment m of
// (in_a, in_b)[row][ox + i], for the RY rows and kTile columns of the tile (in_a, in_b:
// (RY, RX) in shared memory; rows: (5, RY, kTile); taps: the kernel's SsimTaps or NccTaps,
// its kx taps wx along W). No barrier: the caller's follows.
template <int kTile, int kThreads, typename Taps>
__device__ __forceinline__ void horizontal_moments5(const float* in_a, const float* in_b,
                                                    int RY, int RX, const Taps& taps,
                                                    float* rows) {
  const int rows_plane = RY * kTile;
  for (int e = threadIdx.x; e < rows_plane; e += kThreads) {
    const int row = e / kTile, ox = e % kTile;
    const float* la = in_a + row * RX + ox;
    const float* lb = in_b + row * RX + ox;
    float m0 = 0.0f, m1 = 0.0f, m2 = 0.0f, m3 = 0.0f, m4 = 0.0f;
    for (int i = 0; i < taps.kx; ++i) {
      const float w = taps.wx[i], x = la[i], y = lb[i], wx = w * x, wy = w * y;
      m0 += wx;
      m1 += wy;
      m2 += wx * x;
      m3 += wy * y;
      m4 += wx * y;
    }
    rows[e] = m0;
    rows[rows_plane + e] = m1;
    rows[2 * rows_plane + e] = m2;
    rows[3 * rows_plane + e] = m3;
    rows[4 * rows_plane + e] = m4;
  }
}

// Vertical pass of N maps of horizontal sums (rows: (N, RY, kTile)) for the output at
// (ly, lx) of the tile: s[m] = Σ_j wy[j] · rows[m][ly + j][lx].
template <int N, int kTile>
__device__ __forceinline__ void vertical_sums(const float* rows, int rows_plane,
                                              const float* wy, int ky, int ly, int lx,
                                              float* s) {
#pragma unroll
  for (int m = 0; m < N; ++m) s[m] = 0.0f;
  for (int j = 0; j < ky; ++j) {
    const float w = wy[j];
    const int e = (ly + j) * kTile + lx;
#pragma unroll
    for (int m = 0; m < N; ++m) s[m] += w * rows[m * rows_plane + e];
  }
}

// Horizontal adjoint pass of N maps of the outputs around the tile (maps: (N, RY, RX),
// column 0 at image column bx = x0 − rx for the tile's first column x0, zeros outside the
// image): rows[m][row][ox] = Σ_px folded_tap(px, qx) · maps[m][row][px − bx] for the input
// column qx = x0 + ox (an axis of W columns, taps wx of 2 rx + 1); zeros for columns past
// the image (rows: (N, RY, kTile)). No barrier: the caller's follows.
template <int N, int kTile, int kThreads>
__device__ __forceinline__ void adjoint_rows(const float* maps, int in_plane, int RX,
                                             float* rows, int rows_plane, const float* wx,
                                             int rx, int64_t W, int64_t bx) {
  for (int e = threadIdx.x; e < rows_plane; e += kThreads) {
    const int row = e / kTile, ox = e % kTile;
    const int64_t qx = bx + rx + ox;
    float s[N];
#pragma unroll
    for (int m = 0; m < N; ++m) s[m] = 0.0f;
    if (qx < W) {
      const int64_t lo = qx - rx > 0 ? qx - rx : 0, hi = qx + rx < W - 1 ? qx + rx : W - 1;
      for (int64_t px = lo; px <= hi; ++px) {
        const float w = folded_tap(wx, rx, W, px, qx);
        const int l = row * RX + static_cast<int>(px - bx);
#pragma unroll
        for (int m = 0; m < N; ++m) s[m] += w * maps[m * in_plane + l];
      }
    }
#pragma unroll
    for (int m = 0; m < N; ++m) rows[m * rows_plane + e] = s[m];
  }
}

// Vertical adjoint pass for the input pixel at row qy (< H) and tile column lx:
// s[m] = Σ_py folded_tap(py, qy) · rows[m][py − by][lx], rows as adjoint_rows leaves them,
// row 0 at image row by = y0 − ry for the tile's first row y0.
template <int N, int kTile>
__device__ __forceinline__ void adjoint_column(const float* rows, int rows_plane,
                                               const float* wy, int ry, int64_t H, int64_t by,
                                               int64_t qy, int lx, float* s) {
#pragma unroll
  for (int m = 0; m < N; ++m) s[m] = 0.0f;
  const int64_t lo = qy - ry > 0 ? qy - ry : 0, hi = qy + ry < H - 1 ? qy + ry : H - 1;
  for (int64_t py = lo; py <= hi; ++py) {
    const float w = folded_tap(wy, ry, H, py, qy);
    const int e = static_cast<int>(py - by) * kTile + lx;
#pragma unroll
    for (int m = 0; m < N; ++m) s[m] += w * rows[m * rows_plane + e];
  }
}

}  // namespace cuda
}  // namespace simwarp
