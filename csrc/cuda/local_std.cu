// CUDA kernels of simwarp::local_std_fwd / local_std_bwd (docs/maths.md §1): window passes
// (window_pass.h) that carry S1 and S2 as compensated sums in the data's type from one axis
// to the next, the per-element maths of include/simwarp/local_std.h fused into the first
// pass (the backward's vjp, on the fly) and the last (the forward's output, the backward's
// combine). No pass runs in float64 for float32 data: the compensated sums hold the
// accuracy of the CPU's double accumulators at float32's rate.
#include "local_std.h"
#include "simwarp/local_std.h"
#include "window_pass.h"

namespace simwarp {
namespace cuda {
namespace {

// Forward pass: from the data (kFromData) or the previous pass's moments; to the next
// pass's moments or (kLast) to out, s1 and flat.
template <typename T, bool kFromData, bool kLast>
struct ForwardPolicy {
  using Acc = WindowMoments<T>;
  LocalStdForward<T> io;
  PassIndex at;
  int64_t in_plane, out_plane;

  __device__ auto load(int64_t b, int64_t j, int64_t r) const {
    const int64_t q = at.in(b, j, r);
    if constexpr (kFromData) {
      return io.x[q];
    } else {
      const T* m = io.moments;
      Acc v;
      v.s1 = Compensated<T>(m[q], m[in_plane + q]);
      v.s2 = Compensated<T>(m[2 * in_plane + q], m[3 * in_plane + q]);
      return v;
    }
  }

  __device__ void store(int64_t b, int64_t i, int64_t r, const Acc& acc) const {
    const int64_t q = at.out(b, i, r);
    if constexpr (kLast) {
      bool flat;
      io.out[q] = local_std_forward_compensated(acc, io.n, io.eps, io.flat_factor, io.normalized,
                                                &flat);
      io.flat[q] = flat;
      io.s1[q] = acc.s1.value();
    } else {
      const Compensated<T> s1 = acc.s1.normalized(), s2 = acc.s2.normalized();
      T* m = io.moments_out;
      m[q] = s1.hi;
      m[out_plane + q] = s1.lo;
      m[2 * out_plane + q] = s2.hi;
      m[3 * out_plane + q] = s2.lo;
    }
  }
};

// ∂L/∂S1 and ∂L/∂S2 at one position, or their window sums so far.
template <typename T>
struct Partials {
  T d1, d2;
};

template <typename T>
struct PartialSums {
  Compensated<T> d1, d2;

  __device__ void add(const Partials<T>& p) {
    d1.add(p.d1);
    d2.add(p.d2);
  }
  __device__ void sub(const Partials<T>& p) {
    d1.sub(p.d1);
    d2.sub(p.d2);
  }
};

// Backward pass: from the forward's saved tensors (kFromGrad: the vjp on the fly) or the
// previous pass's sums; to the next pass's sums or (kLast) to ∂L/∂x.
template <typename T, bool kFromGrad, bool kLast>
struct BackwardPolicy {
  using Acc = PartialSums<T>;
  LocalStdBackward<T> io;
  PassIndex at;
  int64_t in_plane, out_plane;

  __device__ Partials<T> load(int64_t b, int64_t j, int64_t r) const {
    const int64_t q = at.in(b, j, r);
    Partials<T> p;
    if constexpr (kFromGrad) {
      local_std_vjp(io.grad[q], io.out[q], io.s1[q], io.inv_n, io.normalized, io.flat[q], &p.d1,
                    &p.d2);
    } else {
      p.d1 = io.partials[q];
      p.d2 = io.partials[in_plane + q];
    }
    return p;
  }

  __device__ void store(int64_t b, int64_t i, int64_t r, const Acc& acc) const {
    const int64_t q = at.out(b, i, r);
    if constexpr (kLast) {
      io.dx[q] = local_std_combine(acc.d1.value(), acc.d2.value(), io.x[q]);
    } else {
      io.partials_out[q] = acc.d1.value();
      io.partials_out[out_plane + q] = acc.d2.value();
    }
  }
};

// The pass with the policy its arguments ask for: Policy<T, first, last>.
template <template <typename, bool, bool> class Policy, typename T, typename IO>
cudaError_t launch_pass(const IO& io, bool first, bool last, int64_t B, int64_t L, int64_t R,
                        int64_t k, bool full, int64_t restart, cudaStream_t stream) {
  const AxisPass p = axis_pass(B, L, R, k, full, restart);
  const PassIndex at = pass_index(p);
  const int64_t in = B * L * R, out = B * p.n_out * R;  // the maps' planes
  if (first && last) return launch_window_pass(p, Policy<T, true, true>{io, at, in, out}, stream);
  if (first) return launch_window_pass(p, Policy<T, true, false>{io, at, in, out}, stream);
  if (last) return launch_window_pass(p, Policy<T, false, true>{io, at, in, out}, stream);
  return launch_window_pass(p, Policy<T, false, false>{io, at, in, out}, stream);
}

}  // namespace

template <typename T>
cudaError_t launch_local_std_forward_pass(const LocalStdForward<T>& io, int64_t B, int64_t L,
                                          int64_t R, int64_t k, cudaStream_t stream) {
  // Output k / 2 is the first whose window has left the k / 2 samples of padding that
  // ops/local_std.py puts before the line: summed afresh, so that no rounding of the
  // padding (0 − mean beside a "constant" border) stays in a flat window's sums
  // (tests/csrc/test_local_std_flat_windows.py). Elsewhere it only costs k loads.
  return launch_pass<ForwardPolicy, T>(io, io.x != nullptr, io.moments_out == nullptr, B, L, R,
                                       k, /*full=*/false, /*restart=*/k / 2, stream);
}

template <typename T>
cudaError_t launch_local_std_backward_pass(const LocalStdBackward<T>& io, int64_t B, int64_t L,
                                           int64_t R, int64_t k, cudaStream_t stream) {
  return launch_pass<BackwardPolicy, T>(io, io.grad != nullptr, io.partials_out == nullptr, B, L,
                                        R, k, /*full=*/true, /*restart=*/-1, stream);
}

#define SIMWARP_INSTANTIATE(T)                                                                 \
  template cudaError_t launch_local_std_forward_pass<T>(const LocalStdForward<T>&, int64_t,    \
                                                        int64_t, int64_t, int64_t,             \
                                                        cudaStream_t);                         \
  template cudaError_t launch_local_std_backward_pass<T>(const LocalStdBackward<T>&, int64_t,  \
                                                         int64_t, int64_t, int64_t,            \
                                                         cudaStream_t);
SIMWARP_INSTANTIATE(float)
SIMWARP_INSTANTIATE(double)
#undef SIMWARP_INSTANTIATE

}  // namespace cuda
}  // namespace simwarp
