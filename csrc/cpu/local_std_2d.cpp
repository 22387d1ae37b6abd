// CPU implementation of simwarp::local_std_2d_fwd / local_std_2d_bwd and their
// registration: the local std of images (..., H, W) with SciPy's padding applied and the
// values centered on the fly, by the fused loops of local_std_2d.h. CPU only (ops.cpp).
//
// Its own file rather than part of local_std.cpp: these are two ops of their own (a padding
// argument, a "same"-size output), and local_std.cpp only borrows them, padding "valid",
// for its 2D windows.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

#include "checks.h"
#include "local_std_2d.h"

namespace simwarp {
namespace cpu {
namespace {

Padding parse_padding(c10::string_view name) {
  if (name == "valid") return Padding::kValid;
  if (name == "reflect") return Padding::kReflect;
  if (name == "constant") return Padding::kConstant;
  if (name == "nearest") return Padding::kNearest;
  if (name == "mirror") return Padding::kMirror;
  TORCH_CHECK(false, "local_std_2d: padding must be valid, reflect, mirror, nearest or constant, got ",
              name);
}

// The geometry of a checked, non-empty x (..., H, W).
Plane2d plane_of(const at::Tensor& x, at::IntArrayRef window, Padding mode) {
  const int64_t H = x.size(-2), W = x.size(-1);
  return Plane2d(x.numel() / (H * W), H, W, window[0], window[1], mode);
}

}  // namespace

// x (..., H, W) -> (out, S1, flat), each (..., H, W) under a padding, or valid mode
// (..., H − kh + 1, W − kw + 1) under "valid". Centering and padding happen on the fly.
std::tuple<at::Tensor, at::Tensor, at::Tensor> local_std_2d_fwd(const at::Tensor& x_in,
                                                                 at::IntArrayRef window,
                                                                 c10::string_view padding,
                                                                 double eps, bool normalized,
                                                                 double flat_factor) {
  const Padding mode = parse_padding(padding);
  const bool valid = mode == Padding::kValid;
  checks::local_std_2d_fwd(x_in, window, valid);
  const auto sizes = valid ? checks::window_output_shape(x_in.sizes(), window, false)
                           : x_in.sizes().vec();
  if (x_in.numel() == 0) return checks::local_std_zeros(sizes, x_in);
  const at::Tensor x = x_in.contiguous();
  const Plane2d g = plane_of(x, window, mode);
  at::Tensor out = at::empty(sizes, x.options()), s1 = at::empty(sizes, x.options());
  at::Tensor flat = at::empty(sizes, x.options().dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "simwarp_local_std_2d_fwd", [&] {
    local_std_2d_forward<scalar_t>(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                                   s1.data_ptr<scalar_t>(), flat.data_ptr<bool>(), g, eps,
                                   flat_factor, normalized);
  });
  return {out, s1, flat};
}

at::Tensor local_std_2d_bwd(const at::Tensor& grad_in, const at::Tensor& out_in,
                            const at::Tensor& s1_in, const at::Tensor& flat_in,
                            const at::Tensor& x_in, at::IntArrayRef window,
                            c10::string_view padding, bool normalized) {
  const Padding mode = parse_padding(padding);
  checks::local_std_2d_bwd(grad_in, out_in, s1_in, flat_in, x_in, window, mode == Padding::kValid);
  if (x_in.numel() == 0) return at::zeros(x_in.sizes(), x_in.options());
  const at::Tensor grad = grad_in.contiguous(), x = x_in.contiguous();
  const at::Tensor out = out_in.contiguous(), s1 = s1_in.contiguous(), flat = flat_in.contiguous();
  const Plane2d g = plane_of(x, window, mode);
  at::Tensor dx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "simwarp_local_std_2d_bwd", [&] {
    local_std_2d_backward<scalar_t>(grad.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                                    s1.data_ptr<scalar_t>(), flat.data_ptr<bool>(),
                                    x.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(), g, normalized);
  });
  return dx;
}

}  // namespace cpu
}  // namespace simwarp

TORCH_LIBRARY_IMPL(simwarp, CPU, m) {
  m.impl("local_std_2d_fwd", &simwarp::cpu::local_std_2d_fwd);
  m.impl("local_std_2d_bwd", &simwarp::cpu::local_std_2d_bwd);
}
