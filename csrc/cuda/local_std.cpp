// CUDA binding of simwarp::local_std_fwd / local_std_bwd and their registration: the
// local_std.cu kernels for the last axis and the per-element maths, box_pass (box_sum.cpp)
// for the leading axes and for the backward's full-mode sums. Sums in double as on CPU
// (docs/maths.md §1.3).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

#include "binding.h"
#include "checks.h"
#include "local_std.h"

namespace simwarp {
namespace cuda {

std::tuple<at::Tensor, at::Tensor, at::Tensor> local_std_fwd(const at::Tensor& xp_in,
                                                              at::IntArrayRef window, double eps,
                                                              bool normalized, double flat_factor) {
  checks::local_std_fwd(xp_in, window);
  if (xp_in.numel() == 0)
    return checks::local_std_zeros(checks::window_output_shape(xp_in.sizes(), window, false), xp_in);
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
    check_launch(launch_box_axis_squares<scalar_t>(xp.data_ptr<scalar_t>(), s1.data_ptr<double>(),
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
    check_launch(launch_local_std_forward<scalar_t>(
                     s1.data_ptr<double>(), s2.data_ptr<double>(), out.data_ptr<scalar_t>(),
                     s1_out.data_ptr<scalar_t>(), flat.data_ptr<bool>(), out.numel(),
                     1.0 / static_cast<double>(checks::window_volume(window)), eps, flat_factor,
                     normalized, stream),
                 "local_std_fwd");
  });
  return {out, s1_out, flat};
}

at::Tensor local_std_bwd(const at::Tensor& grad_in, const at::Tensor& out_in, const at::Tensor& s1_in,
                         const at::Tensor& flat_in, const at::Tensor& xp_in, at::IntArrayRef window,
                         bool normalized) {
  checks::local_std_bwd(grad_in, out_in, s1_in, flat_in, xp_in, window);
  if (xp_in.numel() == 0) return at::zeros(xp_in.sizes(), xp_in.options());
  const c10::cuda::CUDAGuard guard(xp_in.device());
  const at::Tensor grad = grad_in.contiguous(), xp = xp_in.contiguous();
  const at::Tensor out = out_in.contiguous(), s1 = s1_in.contiguous(), flat = flat_in.contiguous();
  const int64_t d = static_cast<int64_t>(window.size()), first = xp.dim() - d;
  at::Tensor a = at::empty_like(s1), b = at::empty_like(s1);
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_vjp_cuda", [&] {
    check_launch(launch_local_std_vjp<scalar_t>(
                     grad.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), s1.data_ptr<scalar_t>(),
                     flat.data_ptr<bool>(), a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
                     s1.numel(), scalar_t(1) / scalar_t(checks::window_volume(window)), normalized,
                     stream),
                 "local_std_bwd");
  });
  for (int64_t ax = d - 1; ax >= 0; --ax) {
    if (window[ax] == 1) continue;
    a = box_pass(a, first + ax, window[ax], true);
    b = box_pass(b, first + ax, window[ax], true);
  }
  at::Tensor dx = at::empty_like(xp);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_combine_cuda", [&] {
    check_launch(launch_local_std_combine<scalar_t>(a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
                                                    xp.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(),
                                                    dx.numel(), stream),
                 "local_std_bwd");
  });
  return dx;
}

}  // namespace cuda
}  // namespace simwarp

TORCH_LIBRARY_IMPL(simwarp, CUDA, m) {
  m.impl("local_std_fwd", &simwarp::cuda::local_std_fwd);
  m.impl("local_std_bwd", &simwarp::cuda::local_std_bwd);
}
