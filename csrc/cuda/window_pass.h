// A window pass along one axis, the kernel under box_sum and local_std on CUDA: for a
// contiguous array seen as (B, L, R) (B lines before the axis, R values after it),
//
//   out[b, i, r] = Σ_{j<k} in[b, i + j − pad, r]   over the j with 0 <= i + j − pad < L,
//
// i < n_out; pad = 0 and n_out = L − k + 1 is the valid sum, pad = k − 1 and n_out =
// L + k − 1 the full one (its adjoint). What is summed, in what accumulator, and what is
// written are a Policy's (box_sum.cu, local_std.cu):
//
//   struct Policy {
//     using Acc = ...;                                   // add(Value), sub(Value)
//     Value load(int64_t b, int64_t j, int64_t r) const; // the term at in[b, j, r]
//     void store(int64_t b, int64_t i, int64_t r, const Acc&) const;
//   };
//
// One thread per (b, chunk of outputs, r), r fastest, each a running sum restarted at its
// chunk: O(1) loads per output whatever k, and a rounding error that never grows with the
// line. Along an inner axis (R > 1) a warp's loads and stores at each step are one
// coalesced row; along the last axis (R == 1) adjacent threads own adjacent chunks of a
// line, and their strided loads fall in the same few cache lines. At 4096² that is 2M
// threads on the last axis and 512K on the other, enough to fill any GPU for one image.
// No shared memory, barriers or warp intrinsics: the host shim runs it exactly.
#pragma once

#include <cstdint>

#include "launch.h"

namespace simwarp {
namespace cuda {

// Outputs per thread: short on the last axis (strided loads stay in L1), longer on inner
// axes (coalesced anyway; fewer restarts).
constexpr int64_t kLastAxisChunk = 8;
constexpr int64_t kInnerAxisChunk = 32;

struct AxisPass {
  int64_t B, L, R;  // the input, as (B, L, R)
  int64_t k, pad;   // window length; zeros before the line (0: valid, k − 1: full)
  int64_t n_out;    // outputs per line
  int64_t chunk;    // outputs per thread
  // An output whose window is summed afresh (−1: none): the first whose window has left
  // the padding a caller put before the line. A running sum keeps the rounding of every
  // term it has seen, and padding far from the data (a "constant" border beside an offset
  // image) would leave more of it in a flat window's sums than the flat rule allows for.
  int64_t restart;

  __device__ __host__ int64_t chunks() const { return (n_out + chunk - 1) / chunk; }
  __device__ __host__ int64_t threads() const { return B * chunks() * R; }
};

// The valid (full = false) or full pass of a k-long window along L of (B, L, R), with the
// output `restart` summed afresh (−1: none).
inline AxisPass axis_pass(int64_t B, int64_t L, int64_t R, int64_t k, bool full,
                          int64_t restart = -1) {
  return AxisPass{B,
                  L,
                  R,
                  k,
                  full ? k - 1 : 0,
                  full ? L + k - 1 : L - k + 1,
                  R == 1 ? kLastAxisChunk : kInnerAxisChunk,
                  restart};
}

template <typename Policy>
__global__ void window_pass_kernel(AxisPass p, Policy policy) {
  const int64_t t = thread_index();
  if (t >= p.threads()) return;
  const int64_t r = t % p.R, rest = t / p.R, chunks = p.chunks();
  const int64_t b = rest / chunks, i0 = (rest % chunks) * p.chunk;
  const int64_t i1 = i0 + p.chunk < p.n_out ? i0 + p.chunk : p.n_out;
  typename Policy::Acc acc;
  const int64_t first = i0 - p.pad;  // output i sums in[i − pad, i − pad + k)
  const int64_t lo = first > 0 ? first : 0, hi = first + p.k < p.L ? first + p.k : p.L;
  for (int64_t j = lo; j < hi; ++j) acc.add(policy.load(b, j, r));
  policy.store(b, i0, r, acc);
  for (int64_t i = i0 + 1; i < i1; ++i) {
    if (i == p.restart) {
      acc = typename Policy::Acc();
      const int64_t from = i - p.pad > 0 ? i - p.pad : 0;
      const int64_t to = i - p.pad + p.k < p.L ? i - p.pad + p.k : p.L;
      for (int64_t j = from; j < to; ++j) acc.add(policy.load(b, j, r));
    } else {
      const int64_t enter = i - p.pad + p.k - 1, leave = i - p.pad - 1;
      if (enter >= 0 && enter < p.L) acc.add(policy.load(b, enter, r));
      if (leave >= 0 && leave < p.L) acc.sub(policy.load(b, leave, r));
    }
    policy.store(b, i, r, acc);
  }
}

template <typename Policy>
cudaError_t launch_window_pass(const AxisPass& p, const Policy& policy, cudaStream_t stream) {
  return launch(&window_pass_kernel<Policy>, p.threads(), stream, p, policy);
}

// Flat indices of one axis pass's input and output elements.
struct PassIndex {
  int64_t L, R, n_out;
  __device__ __host__ int64_t in(int64_t b, int64_t j, int64_t r) const {
    return (b * L + j) * R + r;
  }
  __device__ __host__ int64_t out(int64_t b, int64_t i, int64_t r) const {
    return (b * n_out + i) * R + r;
  }
};

inline PassIndex pass_index(const AxisPass& p) { return PassIndex{p.L, p.R, p.n_out}; }

}  // namespace cuda
}  // namespace simwarp
