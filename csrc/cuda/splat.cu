// CUDA kernels of simwarp::splat_fwd / splat_bwd (docs/maths.md §4). The landing cell,
// corner weights and their derivatives are include/simwarp/splat.h, the functions the CPU
// path runs.
#include "launch.h"
#include "simwarp/splat.h"
#include "splat.h"

namespace simwarp {
namespace cuda {
namespace {

struct Size3 {
  int64_t s[3];
};

template <typename T, int D>
__device__ void position_of(int64_t i, const T* disp, int64_t P, const int64_t* size, T* position) {
  int64_t rest = i;
  for (int k = D - 1; k >= 0; --k) {
    position[k] = static_cast<T>(rest % size[k]);
    rest /= size[k];
  }
  for (int k = 0; k < D; ++k) position[k] += disp[k * P + i];
}

template <typename T, int D>
__global__ void splat_scatter_kernel(const T* __restrict__ image, const T* __restrict__ disp,
                                     T* __restrict__ num, T* __restrict__ den, int64_t N, int64_t C,
                                     Size3 sz) {
  int64_t P = 1;
  for (int k = 0; k < D; ++k) P *= sz.s[k];
  const int64_t t = thread_index();
  if (t >= N * P) return;
  const int64_t n = t / P, i = t % P;
  T position[D];
  position_of<T, D>(i, disp + n * D * P, P, sz.s, position);
  const SplatCell<T, D> cell(position, sz.s);
  if (!cell.valid) return;
  for (int bits = 0; bits < (1 << D); ++bits) {
    T w;
    const int64_t j = cell.corner(bits, sz.s, &w, nullptr);
    if (j < 0) continue;
    atomicAdd(den + n * P + j, w);
    for (int64_t c = 0; c < C; ++c) atomicAdd(num + (n * C + c) * P + j, w * image[(n * C + c) * P + i]);
  }
}

template <typename T>
__global__ void splat_normalize_kernel(T* __restrict__ num, const T* __restrict__ den, int64_t N,
                                       int64_t C, int64_t P, bool normalize, T eps) {
  const int64_t t = thread_index();
  if (t >= N * C * P) return;
  const int64_t j = t % P, n = t / (C * P);
  const T w = den[n * P + j];
  num[t] = w <= eps ? T(0) : (normalize ? num[t] / w : num[t]);
}

template <typename T>
__global__ void splat_prepare_kernel(const T* __restrict__ v_out, const T* __restrict__ v_den,
                                     const T* __restrict__ out, const T* __restrict__ den,
                                     T* __restrict__ scaled, T* __restrict__ slope0, int64_t N,
                                     int64_t C, int64_t P, bool normalize, T eps) {
  const int64_t t = thread_index();
  if (t >= N * P) return;
  const int64_t n = t / P, j = t % P;
  T s0 = v_den != nullptr ? v_den[t] : T(0);
  for (int64_t c = 0; c < C; ++c) {
    const int64_t q = (n * C + c) * P + j;
    const T s = v_out != nullptr ? splat_scaled_grad(v_out[q], den[t], eps, normalize) : T(0);
    scaled[q] = s;
    if (normalize) s0 -= s * out[q];
  }
  slope0[t] = s0;
}

template <typename T, int D>
__global__ void splat_gather_kernel(const T* __restrict__ image, const T* __restrict__ disp,
                                    const T* __restrict__ scaled, const T* __restrict__ slope0,
                                    T* __restrict__ grad_image, T* __restrict__ grad_disp,
                                    int64_t N, int64_t C, Size3 sz) {
  int64_t P = 1;
  for (int k = 0; k < D; ++k) P *= sz.s[k];
  const int64_t t = thread_index();
  if (t >= N * P) return;
  const int64_t n = t / P, i = t % P;
  T position[D];
  position_of<T, D>(i, disp + n * D * P, P, sz.s, position);
  const SplatCell<T, D> cell(position, sz.s);
  T gd[D];
  for (int k = 0; k < D; ++k) gd[k] = T(0);
  if (cell.valid) {
    for (int bits = 0; bits < (1 << D); ++bits) {
      T w, dw[D];
      const int64_t j = cell.corner(bits, sz.s, &w, dw);
      if (j < 0) continue;
      T slope = slope0[n * P + j];
      for (int64_t c = 0; c < C; ++c) {
        const T s = scaled[(n * C + c) * P + j];
        grad_image[(n * C + c) * P + i] += w * s;
        slope += s * image[(n * C + c) * P + i];
      }
      for (int k = 0; k < D; ++k) gd[k] += slope * dw[k];
    }
  }
  for (int k = 0; k < D; ++k) grad_disp[(n * D + k) * P + i] = gd[k];
}

}  // namespace

template <typename T>
cudaError_t launch_splat_forward(const T* image, const T* disp, T* out, T* den, int64_t N,
                                 int64_t C, int D, const int64_t* size, bool normalize, T eps,
                                 cudaStream_t stream) {
  const Size3 sz{{size[0], size[1], size[2]}};
  int64_t P = 1;
  for (int k = 0; k < D; ++k) P *= size[k];
  cudaError_t err = D == 2 ? launch(&splat_scatter_kernel<T, 2>, N * P, stream, image, disp, out,
                                    den, N, C, sz)
                           : launch(&splat_scatter_kernel<T, 3>, N * P, stream, image, disp, out,
                                    den, N, C, sz);
  if (err != cudaSuccess || C == 0) return err;  // no channel: den only
  return launch(&splat_normalize_kernel<T>, N * C * P, stream, out, den, N, C, P, normalize, eps);
}

template <typename T>
cudaError_t launch_splat_backward(const T* v_out, const T* v_den, const T* image, const T* disp,
                                  const T* out, const T* den, T* scaled, T* slope0,
                                  T* grad_image, T* grad_disp, int64_t N, int64_t C, int D,
                                  const int64_t* size, bool normalize, T eps,
                                  cudaStream_t stream) {
  const Size3 sz{{size[0], size[1], size[2]}};
  int64_t P = 1;
  for (int k = 0; k < D; ++k) P *= size[k];
  const cudaError_t err = launch(&splat_prepare_kernel<T>, N * P, stream, v_out, v_den, out, den,
                                 scaled, slope0, N, C, P, normalize, eps);
  if (err != cudaSuccess) return err;
  return D == 2 ? launch(&splat_gather_kernel<T, 2>, N * P, stream, image, disp, scaled, slope0,
                         grad_image, grad_disp, N, C, sz)
                : launch(&splat_gather_kernel<T, 3>, N * P, stream, image, disp, scaled, slope0,
                         grad_image, grad_disp, N, C, sz);
}

template cudaError_t launch_splat_forward<float>(const float*, const float*, float*, float*, int64_t,
                                                 int64_t, int, const int64_t*, bool, float,
                                                 cudaStream_t);
template cudaError_t launch_splat_forward<double>(const double*, const double*, double*, double*,
                                                  int64_t, int64_t, int, const int64_t*, bool,
                                                  double, cudaStream_t);
template cudaError_t launch_splat_backward<float>(const float*, const float*, const float*,
                                                  const float*, const float*, const float*, float*,
                                                  float*, float*, float*, int64_t, int64_t, int,
                                                  const int64_t*, bool, float, cudaStream_t);
template cudaError_t launch_splat_backward<double>(const double*, const double*, const double*,
                                                   const double*, const double*, const double*,
                                                   double*, double*, double*, double*, int64_t,
                                                   int64_t, int, const int64_t*, bool, double,
                                                   cudaStream_t);

}  // namespace cuda
}  // namespace simwarp
