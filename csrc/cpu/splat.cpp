// CPU implementation of simwarp::splat_fwd / splat_bwd and their registration: forward
// warping by splatting (docs/maths.md §4).
//
// Forward: each image's source pixels are scattered serially in index order (images in
// parallel), so the result is bitwise the same on every run whatever the thread count.
// Backward: gathers only, one source pixel per iteration, in parallel. The landing cell,
// the corner weights and their derivatives come from include/simwarp/splat.h, shared with
// the CUDA kernels.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "checks.h"
#include "simwarp/splat.h"

namespace simwarp {
namespace cpu {
namespace {

template <typename T, int D>
void splat_forward_image(const T* image, const T* disp, T* num, T* den, int64_t C,
                         const int64_t* size, int64_t P) {
  int64_t coord[D] = {0};
  for (int64_t i = 0; i < P; ++i) {
    T position[D];
    for (int k = 0; k < D; ++k) position[k] = static_cast<T>(coord[k]) + disp[k * P + i];
    const SplatCell<T, D> cell(position, size);
    if (cell.valid) {
      for (int bits = 0; bits < (1 << D); ++bits) {
        T w;
        const int64_t j = cell.corner(bits, size, &w, nullptr);
        if (j < 0) continue;
        den[j] += w;
        for (int64_t c = 0; c < C; ++c) num[c * P + j] += w * image[c * P + i];
      }
    }
    for (int k = D - 1; k >= 0; --k) {  // next pixel in row-major order
      if (++coord[k] < size[k]) break;
      coord[k] = 0;
    }
  }
}

template <typename T, int D>
void splat_backward_image(const T* image, const T* disp, const T* scaled, const T* slope0,
                          T* grad_image, T* grad_disp, int64_t C, const int64_t* size,
                          int64_t P) {
  at::parallel_for(0, P, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      int64_t rest = i, coord[D];
      for (int k = D - 1; k >= 0; --k) { coord[k] = rest % size[k]; rest /= size[k]; }
      T position[D];
      for (int k = 0; k < D; ++k) position[k] = static_cast<T>(coord[k]) + disp[k * P + i];
      const SplatCell<T, D> cell(position, size);
      T gd[D] = {T(0)};
      if (cell.valid) {
        for (int bits = 0; bits < (1 << D); ++bits) {
          T w, dw[D];
          const int64_t j = cell.corner(bits, size, &w, dw);
          if (j < 0) continue;
          // slope = Σ_c v_c(j)/den(j) · f_c(i) + (v_den(j) − Σ_c out_c(j) v_c(j)/den(j))
          T slope = slope0[j];
          for (int64_t c = 0; c < C; ++c) {
            const T s = scaled[c * P + j];
            grad_image[c * P + i] += w * s;
            slope += s * image[c * P + i];
          }
          for (int k = 0; k < D; ++k) gd[k] += slope * dw[k];
        }
      }
      for (int k = 0; k < D; ++k) grad_disp[k * P + i] = gd[k];
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> splat_fwd(const at::Tensor& image_in, const at::Tensor& disp_in,
                                             bool normalize, double eps) {
  checks::splat_fwd(image_in, disp_in);
  if (disp_in.numel() == 0) {  // no source pixel (N or P is 0): out and den are empty
    return {at::zeros(image_in.sizes(), image_in.options()),
            at::zeros(checks::splat_den_shape(image_in.sizes()), image_in.options())};
  }
  const at::Tensor image = image_in.contiguous(), disp = disp_in.contiguous();
  const int64_t D = image.dim() - 2, N = image.size(0), C = image.size(1);
  int64_t size[3] = {1, 1, 1}, P = 1;
  for (int64_t k = 0; k < D; ++k) { size[k] = image.size(2 + k); P *= size[k]; }
  at::Tensor out = at::zeros_like(image);
  at::Tensor den = at::zeros(checks::splat_den_shape(image.sizes()), image.options());
  AT_DISPATCH_FLOATING_TYPES(image.scalar_type(), "simwarp_splat_fwd", [&] {
    const scalar_t* img = image.data_ptr<scalar_t>();
    const scalar_t* d = disp.data_ptr<scalar_t>();
    scalar_t* num = out.data_ptr<scalar_t>();
    scalar_t* dn = den.data_ptr<scalar_t>();
    at::parallel_for(0, N, 1, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        if (D == 2)
          splat_forward_image<scalar_t, 2>(img + n * C * P, d + n * 2 * P, num + n * C * P, dn + n * P, C, size, P);
        else
          splat_forward_image<scalar_t, 3>(img + n * C * P, d + n * 3 * P, num + n * C * P, dn + n * P, C, size, P);
      }
    });
    const scalar_t e = static_cast<scalar_t>(eps);
    at::parallel_for(0, N * P, 16384, [&](int64_t a, int64_t b) {
      for (int64_t idx = a; idx < b; ++idx) {
        const int64_t n = idx / P, j = idx % P;
        const scalar_t w = dn[idx];
        for (int64_t c = 0; c < C; ++c) {
          scalar_t& o = num[(n * C + c) * P + j];
          o = w <= e ? scalar_t(0) : (normalize ? o / w : o);
        }
      }
    });
  });
  return {out, den};
}

std::tuple<at::Tensor, at::Tensor> splat_bwd(const std::optional<at::Tensor>& v_out_in,
                                             const std::optional<at::Tensor>& v_den_in,
                                             const at::Tensor& image_in, const at::Tensor& disp_in,
                                             const at::Tensor& out_in, const at::Tensor& den_in,
                                             bool normalize, double eps) {
  checks::splat_bwd(v_out_in, v_den_in, image_in, disp_in, out_in, den_in);
  if (disp_in.numel() == 0)
    return {at::zeros(image_in.sizes(), image_in.options()), at::zeros(disp_in.sizes(), disp_in.options())};
  const at::Tensor image = image_in.contiguous(), disp = disp_in.contiguous();
  const at::Tensor out = out_in.contiguous(), den = den_in.contiguous();
  const int64_t D = image.dim() - 2, N = image.size(0), C = image.size(1);
  int64_t size[3] = {1, 1, 1}, P = 1;
  for (int64_t k = 0; k < D; ++k) { size[k] = image.size(2 + k); P *= size[k]; }
  // Per destination: scaled_c = v_c/den (v_c in plain mode), 0 at holes; slope0 = v_den −
  // Σ_c out_c · scaled_c (normalized) or v_den (plain).
  at::Tensor scaled = at::zeros_like(image);
  at::Tensor slope0 = at::zeros_like(den);
  AT_DISPATCH_FLOATING_TYPES(image.scalar_type(), "simwarp_splat_bwd_prepare", [&] {
    const scalar_t e = static_cast<scalar_t>(eps);
    const scalar_t* dn = den.data_ptr<scalar_t>();
    const scalar_t* o = out.data_ptr<scalar_t>();
    scalar_t* sc = scaled.data_ptr<scalar_t>();
    scalar_t* s0 = slope0.data_ptr<scalar_t>();
    const at::Tensor v_out = v_out_in.has_value() ? v_out_in->contiguous() : at::Tensor();
    const at::Tensor v_den = v_den_in.has_value() ? v_den_in->contiguous() : at::Tensor();
    const scalar_t* vo = v_out.defined() ? v_out.data_ptr<scalar_t>() : nullptr;
    const scalar_t* vd = v_den.defined() ? v_den.data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, N * P, 16384, [&](int64_t a, int64_t b) {
      for (int64_t idx = a; idx < b; ++idx) {
        const int64_t n = idx / P, j = idx % P;
        scalar_t t = vd != nullptr ? vd[idx] : scalar_t(0);
        if (vo != nullptr) {
          for (int64_t c = 0; c < C; ++c) {
            const int64_t q = (n * C + c) * P + j;
            const scalar_t s = splat_scaled_grad(vo[q], dn[idx], e, normalize);
            sc[q] = s;
            if (normalize) t -= s * o[q];
          }
        }
        s0[idx] = t;
      }
    });
  });
  at::Tensor grad_image = at::zeros_like(image);
  at::Tensor grad_disp = at::empty_like(disp);
  AT_DISPATCH_FLOATING_TYPES(image.scalar_type(), "simwarp_splat_bwd", [&] {
    for (int64_t n = 0; n < N; ++n) {
      const scalar_t* img = image.data_ptr<scalar_t>() + n * C * P;
      const scalar_t* d = disp.data_ptr<scalar_t>() + n * D * P;
      const scalar_t* sc = scaled.data_ptr<scalar_t>() + n * C * P;
      const scalar_t* s0 = slope0.data_ptr<scalar_t>() + n * P;
      scalar_t* gi = grad_image.data_ptr<scalar_t>() + n * C * P;
      scalar_t* gd = grad_disp.data_ptr<scalar_t>() + n * D * P;
      if (D == 2)
        splat_backward_image<scalar_t, 2>(img, d, sc, s0, gi, gd, C, size, P);
      else
        splat_backward_image<scalar_t, 3>(img, d, sc, s0, gi, gd, C, size, P);
    }
  });
  return {grad_image, grad_disp};
}

}  // namespace cpu
}  // namespace simwarp

TORCH_LIBRARY_IMPL(simwarp, CPU, m) {
  m.impl("splat_fwd", &simwarp::cpu::splat_fwd);
  m.impl("splat_bwd", &simwarp::cpu::splat_bwd);
}
