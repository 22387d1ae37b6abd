// CPU implementation of simwarp::box_sum (window sums over the trailing axes) and its
// registration; also box_pass, the one-axis pass local_std.cpp reuses (declared in box.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "box.h"
#include "checks.h"

namespace simwarp {
namespace cpu {

at::Tensor box_pass(const at::Tensor& x, int64_t dim, int64_t k, bool full) {
  const int64_t L = x.size(dim);
  int64_t B = 1, R = 1;
  for (int64_t d = 0; d < dim; ++d) B *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) R *= x.size(d);
  const int64_t pad = full ? k - 1 : 0;
  const int64_t n_out = full ? L + k - 1 : L - k + 1;
  auto sizes = x.sizes().vec();
  sizes[dim] = n_out;
  auto out = at::empty(sizes, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "simwarp_box_pass", [&] {
    box_axis<scalar_t>(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), B, L, R, k, pad, n_out);
  });
  return out;
}

at::Tensor box_sum(const at::Tensor& x, at::IntArrayRef window, bool full) {
  checks::box_sum(x, window, full);
  if (x.numel() == 0) return at::zeros(checks::window_output_shape(x.sizes(), window, full), x.options());
  const int64_t first = x.dim() - static_cast<int64_t>(window.size());
  at::Tensor cur = x.contiguous();
  // Last axis first: its serial running sums are the cheapest pass to run on the widest data.
  for (int64_t a = static_cast<int64_t>(window.size()) - 1; a >= 0; --a) {
    const int64_t k = window[a];
    if (k == 1) continue;
    cur = box_pass(cur, first + a, k, full);
  }
  return cur.is_same(x) ? x.clone(at::MemoryFormat::Contiguous) : cur;  // never x itself
}

}  // namespace cpu
}  // namespace simwarp

TORCH_LIBRARY_IMPL(simwarp, CPU, m) { m.impl("box_sum", &simwarp::cpu::box_sum); }
