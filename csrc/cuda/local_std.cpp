// CUDA binding of simwarp::local_std_fwd / local_std_bwd and their registration: one
// local_std.cu window pass per window axis, the data read once by the first and the
// outputs written once by the last (docs/maths.md §1). The sums are compensated in the
// data's type, so the flat rule's factor is relative to their precision (calls.py).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "binding.h"
#include "checks.h"
#include "local_std.h"

namespace simwarp {
namespace cuda {
namespace {

// The window axes the passes run along, contiguous-most first: those longer than 1, or the
// last one alone when none is (a pass of one tap still forms the sums).
std::vector<int64_t> pass_axes(at::IntArrayRef window) {
  std::vector<int64_t> axes;
  for (int64_t a = static_cast<int64_t>(window.size()) - 1; a >= 0; --a)
    if (window[a] > 1) axes.push_back(a);
  if (axes.empty()) axes.push_back(static_cast<int64_t>(window.size()) - 1);
  return axes;
}

// One pass per window axis over an array of `shape` whose window axes start at `first`:
// run(lines, k, first_pass, next), where next is a new (maps, *shape after the pass) buffer
// for the pass that follows, or undefined on the last pass. Valid passes shrink each axis
// by k − 1, full ones grow it.
template <typename Run>
void window_passes(at::IntArrayRef window, int64_t first, std::vector<int64_t> shape, bool full,
                   int64_t maps, const at::TensorOptions& options, Run run) {
  const std::vector<int64_t> axes = pass_axes(window);
  for (size_t p = 0; p < axes.size(); ++p) {
    const int64_t dim = first + axes[p], k = window[axes[p]];
    const Lines l = lines_of(shape, dim);
    shape[dim] = full ? l.L + k - 1 : l.L - k + 1;
    std::vector<int64_t> next_shape{maps};
    next_shape.insert(next_shape.end(), shape.begin(), shape.end());
    run(l, k, p == 0, p + 1 == axes.size() ? at::Tensor() : at::empty(next_shape, options));
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> local_std_fwd(const at::Tensor& xp_in,
                                                              at::IntArrayRef window, double eps,
                                                              bool normalized, double flat_factor) {
  checks::local_std_fwd(xp_in, window);
  const std::vector<int64_t> out_shape = checks::window_output_shape(xp_in.sizes(), window, false);
  if (xp_in.numel() == 0) return checks::local_std_zeros(out_shape, xp_in);
  const DeviceGuard guard(xp_in.device());
  const at::Tensor xp = xp_in.contiguous();
  const int64_t first = xp.dim() - static_cast<int64_t>(window.size());
  at::Tensor out = at::empty(out_shape, xp.options()), s1 = at::empty(out_shape, xp.options());
  at::Tensor flat = at::empty(out_shape, xp.options().dtype(at::kBool));
  at::Tensor moments;  // the previous pass's (4, ...)
  window_passes(window, first, xp.sizes().vec(), /*full=*/false, 4, xp.options(),
                [&](const Lines& l, int64_t k, bool first_pass, const at::Tensor& next) {
    AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_fwd_cuda", [&] {
      LocalStdForward<scalar_t> io{};
      io.x = first_pass ? xp.data_ptr<scalar_t>() : nullptr;
      io.moments = first_pass ? nullptr : moments.data_ptr<scalar_t>();
      io.moments_out = next.defined() ? next.data_ptr<scalar_t>() : nullptr;
      io.out = out.data_ptr<scalar_t>();
      io.s1 = s1.data_ptr<scalar_t>();
      io.flat = flat.data_ptr<bool>();
      io.n = static_cast<scalar_t>(checks::window_volume(window));
      io.eps = static_cast<scalar_t>(eps);
      io.flat_factor = static_cast<scalar_t>(flat_factor);
      io.normalized = normalized;
      check_launch(launch_local_std_forward_pass<scalar_t>(io, l.B, l.L, l.R, k, current_stream()),
                   "local_std_fwd");
    });
    moments = next;
  });
  return {out, s1, flat};
}

at::Tensor local_std_bwd(const at::Tensor& grad_in, const at::Tensor& out_in,
                         const at::Tensor& s1_in, const at::Tensor& flat_in,
                         const at::Tensor& xp_in, at::IntArrayRef window, bool normalized) {
  checks::local_std_bwd(grad_in, out_in, s1_in, flat_in, xp_in, window);
  if (xp_in.numel() == 0) return at::zeros(xp_in.sizes(), xp_in.options());
  const DeviceGuard guard(xp_in.device());
  const at::Tensor grad = grad_in.contiguous(), xp = xp_in.contiguous();
  const at::Tensor out = out_in.contiguous(), s1 = s1_in.contiguous(), flat = flat_in.contiguous();
  const int64_t first = xp.dim() - static_cast<int64_t>(window.size());
  at::Tensor dx = at::empty_like(xp, at::MemoryFormat::Contiguous);
  at::Tensor partials;  // the previous pass's (2, ...)
  window_passes(window, first, grad.sizes().vec(), /*full=*/true, 2, xp.options(),
                [&](const Lines& l, int64_t k, bool first_pass, const at::Tensor& next) {
    AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_bwd_cuda", [&] {
      LocalStdBackward<scalar_t> io{};
      if (first_pass) {
        io.grad = grad.data_ptr<scalar_t>();
        io.out = out.data_ptr<scalar_t>();
        io.s1 = s1.data_ptr<scalar_t>();
        io.flat = flat.data_ptr<bool>();
      } else {
        io.partials = partials.data_ptr<scalar_t>();
      }
      io.partials_out = next.defined() ? next.data_ptr<scalar_t>() : nullptr;
      io.x = xp.data_ptr<scalar_t>();
      io.dx = dx.data_ptr<scalar_t>();
      io.inv_n = scalar_t(1) / static_cast<scalar_t>(checks::window_volume(window));
      io.normalized = normalized;
      check_launch(launch_local_std_backward_pass<scalar_t>(io, l.B, l.L, l.R, k, current_stream()),
                   "local_std_bwd");
    });
    partials = next;
  });
  return dx;
}

}  // namespace cuda
}  // namespace simwarp

SIMWARP_CUDA_LIBRARY_IMPL(m) {
  m.impl("local_std_fwd", &simwarp::cuda::local_std_fwd);
  m.impl("local_std_bwd", &simwarp::cuda::local_std_bwd);
}
