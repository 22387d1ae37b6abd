// CUDA kernels of simwarp::squaring_fwd / squaring_bwd (scaling and squaring, docs/maths.md
// §8.3): one thread per pixel; the forward gathers, the backward scatters the sampled
// corners' share with atomic additions. The per-pixel maths is include/simwarp/squaring.h,
// the functions the CPU path runs.
#include "launch.h"
#include "simwarp/squaring.h"
#include "squaring.h"

namespace simwarp {
namespace cuda {
namespace {

struct Size3 {
  int64_t s[3];
};

template <typename T>
struct AtomicAdd {
  T* dst;
  __device__ void operator()(int64_t j, T v) const { atomicAdd(dst + j, v); }
};

template <typename T, int D>
__global__ void squaring_forward_kernel(const T* __restrict__ u, T* __restrict__ out, int64_t N,
                                        Size3 sz, SquaringScale<T> scale, T* __restrict__ scaled) {
  int64_t P = 1;
  for (int k = 0; k < D; ++k) P *= sz.s[k];
  const int64_t t = thread_index();
  if (t >= N * P) return;
  const int64_t n = t / P, i = t % P;
  squaring_forward_pixel<T, D>(u + n * D * P, out + n * D * P, i, P, sz.s, scale,
                               scaled == nullptr ? nullptr : scaled + n * D * P);
}

// x (N, D, P) = scale · base, or zeros where base is null.
template <typename T>
__global__ void squaring_fill_kernel(T* __restrict__ x, const T* __restrict__ base,
                                     SquaringScale<T> scale, int64_t count, int64_t P, int D) {
  const int64_t t = thread_index();
  if (t < count) x[t] = base == nullptr ? T(0) : scale(static_cast<int>((t / P) % D), base[t]);
}

template <typename T, int D>
__global__ void squaring_backward_kernel(const T* __restrict__ a, const T* __restrict__ u,
                                         T* into, int64_t N, Size3 sz, SquaringScale<T> scale) {
  int64_t P = 1;
  for (int k = 0; k < D; ++k) P *= sz.s[k];
  const int64_t t = thread_index();
  if (t >= N * P) return;
  const int64_t n = t / P, i = t % P;
  const AtomicAdd<T> add{into + n * D * P};
  squaring_backward_pixel<T, D>(a + n * D * P, u + n * D * P, into + n * D * P, i, P, sz.s, add,
                                scale);
}

}  // namespace

template <typename T>
cudaError_t launch_squaring_forward(const T* v, SquaringScale<T> scale, T* saved0,
                                    T* const* outputs, int64_t steps, int64_t N, int D,
                                    const int64_t* size, cudaStream_t stream) {
  const Size3 sz{{size[0], size[1], size[2]}};
  int64_t P = 1;
  for (int k = 0; k < D; ++k) P *= size[k];
  const T* src = v;
  for (int64_t k = 0; k < steps; ++k) {
    // the first squaring reads v times the scale and writes that into saved0 (if any)
    const SquaringScale<T> s = k == 0 ? scale : SquaringScale<T>{};
    T* scaled = k == 0 ? saved0 : nullptr;
    const cudaError_t err =
        D == 2 ? launch(&squaring_forward_kernel<T, 2>, N * P, stream, src, outputs[k], N, sz, s,
                        scaled)
               : launch(&squaring_forward_kernel<T, 3>, N * P, stream, src, outputs[k], N, sz, s,
                        scaled);
    if (err != cudaSuccess) return err;
    src = outputs[k];
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t launch_squaring_backward(const T* grad, const T* saved, const T* base,
                                     SquaringScale<T> scale, T* const* buffers, int64_t steps,
                                     int64_t N, int D, const int64_t* size,
                                     cudaStream_t stream) {
  const Size3 sz{{size[0], size[1], size[2]}};
  int64_t P = 1;
  for (int k = 0; k < D; ++k) P *= size[k];
  const int64_t field = N * D * P;
  const T* a = grad;
  for (int64_t k = steps - 1; k >= 0; --k) {
    // the first squaring's gradient, with respect to v: times the scale, from scale · base
    const SquaringScale<T> s = k == 0 ? scale : SquaringScale<T>{};
    cudaError_t err = launch(&squaring_fill_kernel<T>, field, stream, buffers[k],
                             k == 0 ? base : nullptr, s, field, P, D);
    if (err != cudaSuccess) return err;
    const T* u = saved + k * field;
    err = D == 2
              ? launch(&squaring_backward_kernel<T, 2>, N * P, stream, a, u, buffers[k], N, sz, s)
              : launch(&squaring_backward_kernel<T, 3>, N * P, stream, a, u, buffers[k], N, sz, s);
    if (err != cudaSuccess) return err;
    a = buffers[k];
  }
  return cudaSuccess;
}

#define SIMWARP_SQUARING_INSTANTIATE(T)                                                    \
  template cudaError_t launch_squaring_forward<T>(const T*, SquaringScale<T>, T*, T* const*, \
                                                  int64_t, int64_t, int, const int64_t*,     \
                                                  cudaStream_t);                             \
  template cudaError_t launch_squaring_backward<T>(const T*, const T*, const T*,             \
                                                   SquaringScale<T>, T* const*, int64_t,     \
                                                   int64_t, int, const int64_t*, cudaStream_t);
SIMWARP_SQUARING_INSTANTIATE(float)
SIMWARP_SQUARING_INSTANTIATE(double)
#undef SIMWARP_SQUARING_INSTANTIATE

}  // namespace cuda
}  // namespace simwarp
