// CUDA binding of simwarp::box_sum and its registration; also box_pass (declared in
// binding.h). The kernel is box_sum.cu.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "binding.h"
#include "box_sum.h"
#include "checks.h"

namespace simwarp {
namespace cuda {

at::Tensor box_pass(const at::Tensor& x, int64_t dim, int64_t k, bool full) {
  const Lines l = lines_of(x, dim);
  auto sizes = x.sizes().vec();
  sizes[dim] = full ? l.L + k - 1 : l.L - k + 1;
  at::Tensor out = at::empty(sizes, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "simwarp_box_pass_cuda", [&] {
    check_launch(launch_box_axis<scalar_t>(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), l.B,
                                           l.L, l.R, k, full, current_stream()),
                 "box_sum");
  });
  return out;
}

at::Tensor box_sum(const at::Tensor& x, at::IntArrayRef window, bool full) {
  checks::box_sum(x, window, full);
  if (x.numel() == 0) return at::zeros(checks::window_output_shape(x.sizes(), window, full), x.options());
  const DeviceGuard guard(x.device());
  const int64_t first = x.dim() - static_cast<int64_t>(window.size());
  at::Tensor cur = x.contiguous();
  for (int64_t a = static_cast<int64_t>(window.size()) - 1; a >= 0; --a) {
    if (window[a] > 1) cur = box_pass(cur, first + a, window[a], full);
  }
  return cur.is_same(x) ? x.clone(at::MemoryFormat::Contiguous) : cur;  // never x itself
}

}  // namespace cuda
}  // namespace simwarp

SIMWARP_CUDA_LIBRARY_IMPL(m) { m.impl("box_sum", &simwarp::cuda::box_sum); }
