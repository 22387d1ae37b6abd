// CUDA implementations of the simwarp ops: thin wrappers that check tensors, allocate
// outputs and call the launchers in cuda/*.cu on the current stream. Built only where
// torch has CUDA and nvcc is found.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "launch.h"

namespace simwarp {
namespace cuda {
namespace {

void check(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, ": ", cudaGetErrorString(err));
}

struct Lines {
  int64_t B, L, R;
};

Lines lines_of(const at::Tensor& x, int64_t dim) {
  Lines l{1, x.size(dim), 1};
  for (int64_t d = 0; d < dim; ++d) l.B *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) l.R *= x.size(d);
  return l;
}

at::Tensor box_pass(const at::Tensor& x, int64_t dim, int64_t k, bool full) {
  const Lines l = lines_of(x, dim);
  const int64_t pad = full ? k - 1 : 0;
  const int64_t n_out = full ? l.L + k - 1 : l.L - k + 1;
  auto sizes = x.sizes().vec();
  sizes[dim] = n_out;
  auto out = at::empty(sizes, x.options());
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "simwarp_box_pass_cuda", [&] {
    check(launch_box_axis<scalar_t, scalar_t>(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                                              l.B, l.L, l.R, k, pad, n_out, stream),
          "box_sum");
  });
  return out;
}

int64_t window_volume(at::IntArrayRef window) {
  int64_t n = 1;
  for (auto w : window) n *= w;
  return n;
}

}  // namespace

at::Tensor box_sum(const at::Tensor& x, at::IntArrayRef window, bool full) {
  TORCH_CHECK(x.is_floating_point(), "box_sum: x must be float32 or float64");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t first = x.dim() - static_cast<int64_t>(window.size());
  at::Tensor cur = x.contiguous();
  for (int64_t a = static_cast<int64_t>(window.size()) - 1; a >= 0; --a) {
    TORCH_CHECK(full || window[a] <= cur.size(first + a), "box_sum: window larger than the axis");
    if (window[a] > 1) cur = box_pass(cur, first + a, window[a], full);
  }
  return cur.is_same(x) ? x.clone() : cur;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> local_std_fwd(const at::Tensor& xp_in,
                                                              at::IntArrayRef window, double eps,
                                                              bool normalized, double flat_factor) {
  const c10::cuda::CUDAGuard guard(xp_in.device());
  const at::Tensor xp = xp_in.contiguous();
  const int64_t d = static_cast<int64_t>(window.size()), first = xp.dim() - d;
  const int64_t last = xp.dim() - 1, k = window[d - 1];
  const Lines l = lines_of(xp, last);
  auto sizes = xp.sizes().vec();
  sizes.back() = l.L - k + 1;
  const auto dbl = xp.options().dtype(at::kDouble);
  at::Tensor s1 = at::empty(sizes, dbl), s2 = at::empty(sizes, dbl);
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_rows_cuda", [&] {
    check(launch_box_axis_squares<scalar_t>(xp.data_ptr<scalar_t>(), s1.data_ptr<double>(),
                                            s2.data_ptr<double>(), l.B, l.L, l.R, k, stream),
          "local_std_fwd");
  });
  for (int64_t a = d - 2; a >= 0; --a) {
    if (window[a] == 1) continue;
    s1 = box_pass(s1, first + a, window[a], false);
    s2 = box_pass(s2, first + a, window[a], false);
  }
  at::Tensor out = at::empty(s1.sizes(), xp.options());
  at::Tensor s1_out = at::empty(s1.sizes(), xp.options());
  at::Tensor flat = at::empty(s1.sizes(), xp.options().dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_fwd_cuda", [&] {
    check(launch_local_std_forward<scalar_t>(
              s1.data_ptr<double>(), s2.data_ptr<double>(), out.data_ptr<scalar_t>(),
              s1_out.data_ptr<scalar_t>(), flat.data_ptr<bool>(), out.numel(),
              1.0 / static_cast<double>(window_volume(window)), eps, flat_factor, normalized,
              stream),
          "local_std_fwd");
  });
  return {out, s1_out, flat};
}

at::Tensor local_std_bwd(const at::Tensor& grad_in, const at::Tensor& out_in, const at::Tensor& s1_in,
                         const at::Tensor& flat_in, const at::Tensor& xp_in, at::IntArrayRef window,
                         bool normalized) {
  const c10::cuda::CUDAGuard guard(xp_in.device());
  const at::Tensor grad = grad_in.contiguous(), xp = xp_in.contiguous();
  const at::Tensor out = out_in.contiguous(), s1 = s1_in.contiguous(), flat = flat_in.contiguous();
  const int64_t d = static_cast<int64_t>(window.size()), first = xp.dim() - d;
  at::Tensor a = at::empty_like(s1), b = at::empty_like(s1);
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_vjp_cuda", [&] {
    check(launch_local_std_vjp<scalar_t>(
              grad.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), s1.data_ptr<scalar_t>(),
              flat.data_ptr<bool>(), a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), s1.numel(),
              scalar_t(1) / scalar_t(window_volume(window)), normalized, stream),
          "local_std_bwd");
  });
  for (int64_t ax = d - 1; ax >= 0; --ax) {
    if (window[ax] == 1) continue;
    a = box_pass(a, first + ax, window[ax], true);
    b = box_pass(b, first + ax, window[ax], true);
  }
  at::Tensor dx = at::empty_like(xp);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_combine_cuda", [&] {
    check(launch_local_std_combine<scalar_t>(a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
                                             xp.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(),
                                             dx.numel(), stream),
          "local_std_bwd");
  });
  return dx;
}

std::tuple<at::Tensor, at::Tensor> splat_fwd(const at::Tensor& image_in, const at::Tensor& disp_in,
                                             bool normalize, double eps) {
  const c10::cuda::CUDAGuard guard(image_in.device());
  const at::Tensor image = image_in.contiguous(), disp = disp_in.contiguous();
  const int64_t D = image.dim() - 2, N = image.size(0), C = image.size(1);
  TORCH_CHECK(D == 2 || D == 3, "splat_fwd: image must be (N, C, H, W) or (N, C, D, H, W)");
  int64_t size[3] = {1, 1, 1};
  for (int64_t k = 0; k < D; ++k) size[k] = image.size(2 + k);
  at::Tensor out = at::zeros_like(image);
  auto den_sizes = image.sizes().vec();
  den_sizes[1] = 1;
  at::Tensor den = at::zeros(den_sizes, image.options());
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(image.scalar_type(), "simwarp_splat_fwd_cuda", [&] {
    check(launch_splat_forward<scalar_t>(image.data_ptr<scalar_t>(), disp.data_ptr<scalar_t>(),
                                         out.data_ptr<scalar_t>(), den.data_ptr<scalar_t>(), N, C,
                                         static_cast<int>(D), size, normalize,
                                         static_cast<scalar_t>(eps), stream),
          "splat_fwd");
  });
  return {out, den};
}

std::tuple<at::Tensor, at::Tensor> splat_bwd(const std::optional<at::Tensor>& v_out_in,
                                             const std::optional<at::Tensor>& v_den_in,
                                             const at::Tensor& image_in, const at::Tensor& disp_in,
                                             const at::Tensor& out_in, const at::Tensor& den_in,
                                             bool normalize, double eps) {
  const c10::cuda::CUDAGuard guard(image_in.device());
  const at::Tensor image = image_in.contiguous(), disp = disp_in.contiguous();
  const at::Tensor out = out_in.contiguous(), den = den_in.contiguous();
  const int64_t D = image.dim() - 2, N = image.size(0), C = image.size(1);
  int64_t size[3] = {1, 1, 1};
  for (int64_t k = 0; k < D; ++k) size[k] = image.size(2 + k);
  const at::Tensor v_out = v_out_in.has_value() ? v_out_in->contiguous() : at::Tensor();
  const at::Tensor v_den = v_den_in.has_value() ? v_den_in->contiguous() : at::Tensor();
  at::Tensor grad_image = at::zeros_like(image), grad_disp = at::empty_like(disp);
  at::Tensor scaled = at::empty_like(image), slope0 = at::empty_like(den);
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(image.scalar_type(), "simwarp_splat_bwd_cuda", [&] {
    check(launch_splat_backward<scalar_t>(
              v_out.defined() ? v_out.data_ptr<scalar_t>() : nullptr,
              v_den.defined() ? v_den.data_ptr<scalar_t>() : nullptr, image.data_ptr<scalar_t>(),
              disp.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), den.data_ptr<scalar_t>(),
              scaled.data_ptr<scalar_t>(), slope0.data_ptr<scalar_t>(),
              grad_image.data_ptr<scalar_t>(), grad_disp.data_ptr<scalar_t>(), N, C,
              static_cast<int>(D), size, normalize, static_cast<scalar_t>(eps), stream),
          "splat_bwd");
  });
  return {grad_image, grad_disp};
}

at::Tensor correlate(const at::Tensor& x_in, at::ArrayRef<double> taps, at::IntArrayRef sizes,
                     bool transpose) {
  TORCH_CHECK(x_in.is_floating_point(), "correlate: x must be float32 or float64");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const int64_t first = x_in.dim() - static_cast<int64_t>(sizes.size());
  at::Tensor all_taps = at::tensor(std::vector<double>(taps.begin(), taps.end()),
                                   x_in.options().dtype(at::kDouble).device(at::kCPU))
                            .to(x_in.options());
  at::Tensor cur = x_in.contiguous();
  auto stream = c10::cuda::getCurrentCUDAStream();
  int64_t offset = 0;
  for (int64_t a = 0; a < static_cast<int64_t>(sizes.size()); ++a) {
    const int64_t k = sizes[a], dim = first + a;
    const Lines l = lines_of(cur, dim);
    TORCH_CHECK(k >= 1 && (transpose || k <= l.L), "correlate: window larger than the axis");
    const int64_t n_out = transpose ? l.L + k - 1 : l.L - k + 1;
    auto out_sizes = cur.sizes().vec();
    out_sizes[dim] = n_out;
    at::Tensor out = at::empty(out_sizes, cur.options());
    AT_DISPATCH_FLOATING_TYPES(cur.scalar_type(), "simwarp_correlate_cuda", [&] {
      check(launch_correlate_axis<scalar_t>(cur.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                                            all_taps.data_ptr<scalar_t>() + offset, l.B, l.L, l.R,
                                            k, transpose, n_out, stream),
            "correlate");
    });
    cur = out;
    offset += k;
  }
  return cur.is_same(x_in) ? x_in.clone() : cur;
}

at::Tensor moments5(const at::Tensor& centered_in, at::ArrayRef<double> taps, at::IntArrayRef sizes) {
  TORCH_CHECK(centered_in.is_floating_point() && centered_in.size(0) == 2,
              "moments5: centered must be a float tensor stacking [a, b] on dim 0");
  const c10::cuda::CUDAGuard guard(centered_in.device());
  const at::Tensor centered = centered_in.contiguous();
  const int64_t d = static_cast<int64_t>(sizes.size());
  const int64_t L = centered.size(-1), k_last = sizes[d - 1];
  TORCH_CHECK(k_last <= L, "moments5: window larger than the axis");
  const int64_t per_image = centered.numel() / 2, lines = per_image / L;
  int64_t offset = 0;
  for (int64_t a = 0; a < d - 1; ++a) offset += sizes[a];
  at::Tensor all_taps = at::tensor(std::vector<double>(taps.begin(), taps.end()),
                                   centered.options().dtype(at::kDouble).device(at::kCPU))
                            .to(centered.options());
  auto out_sizes = centered.sizes().vec();
  out_sizes[0] = 5;
  out_sizes.back() = L - k_last + 1;
  at::Tensor first = at::empty(out_sizes, centered.options());
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(centered.scalar_type(), "simwarp_moments5_cuda", [&] {
    const scalar_t* base = centered.data_ptr<scalar_t>();
    check(launch_moments_last_axis<scalar_t>(base, base + per_image, first.data_ptr<scalar_t>(),
                                             all_taps.data_ptr<scalar_t>() + offset, lines, L,
                                             k_last, stream),
          "moments5");
  });
  if (d == 1) return first;
  std::vector<double> lead(taps.begin(), taps.begin() + offset);
  std::vector<int64_t> lead_sizes(sizes.begin(), sizes.end() - 1);
  // The leading axes are plain separable passes: correlate over all but the last axis.
  at::Tensor moved = first.movedim(-1, 1).contiguous();
  at::Tensor filtered = correlate(moved, lead, lead_sizes, false);
  return filtered.movedim(1, -1).contiguous();
}

}  // namespace cuda
}  // namespace simwarp

TORCH_LIBRARY_IMPL(simwarp, CUDA, m) {
  m.impl("moments5", &simwarp::cuda::moments5);
  m.impl("correlate", &simwarp::cuda::correlate);
  m.impl("box_sum", &simwarp::cuda::box_sum);
  m.impl("local_std_fwd", &simwarp::cuda::local_std_fwd);
  m.impl("local_std_bwd", &simwarp::cuda::local_std_bwd);
  m.impl("splat_fwd", &simwarp::cuda::splat_fwd);
  m.impl("splat_bwd", &simwarp::cuda::splat_bwd);
}
