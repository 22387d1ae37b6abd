// CUDA binding of simwarp::correlate and its registration: one correlate.cu pass per axis,
// the taps handed to the kernels by value. correlate_pass (declared in binding.h) is the
// pass moments5.cpp uses for its leading axes.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "binding.h"
#include "checks.h"
#include "correlate.h"

namespace simwarp {
namespace cuda {

at::Tensor correlate_pass(const at::Tensor& x, int64_t dim, const double* taps, int64_t k,
                          bool transpose) {
  const Lines l = lines_of(x, dim);
  auto sizes = x.sizes().vec();
  sizes[dim] = transpose ? l.L + k - 1 : l.L - k + 1;
  at::Tensor out = at::empty(sizes, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "simwarp_correlate_cuda", [&] {
    check_launch(launch_correlate_axis<scalar_t>(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                                                 taps, l.B, l.L, l.R, k, transpose,
                                                 current_stream()),
                 "correlate");
  });
  return out;
}

at::Tensor correlate(const at::Tensor& x, at::ArrayRef<double> taps, at::IntArrayRef sizes,
                     bool transpose) {
  checks::correlate(x, taps, sizes, transpose);
  if (x.numel() == 0)
    return at::zeros(checks::window_output_shape(x.sizes(), sizes, transpose), x.options());
  const DeviceGuard guard(x.device());
  const int64_t first = x.dim() - static_cast<int64_t>(sizes.size());
  at::Tensor cur = x.contiguous();
  int64_t offset = 0;
  for (int64_t a = 0; a < static_cast<int64_t>(sizes.size()); ++a) {
    cur = correlate_pass(cur, first + a, taps.data() + offset, sizes[a], transpose);
    offset += sizes[a];
  }
  return cur.is_same(x) ? x.clone(at::MemoryFormat::Contiguous) : cur;  // never x itself
}

}  // namespace cuda
}  // namespace simwarp

SIMWARP_CUDA_LIBRARY_IMPL(m) { m.impl("correlate", &simwarp::cuda::correlate); }
