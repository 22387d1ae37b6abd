// CPU implementation of simwarp::correlate (separable correlation over the trailing axes,
// valid mode, and its transpose, with arbitrary taps per axis) and its registration.
//
// Why not the per-element functions of include/simwarp/correlate.h here: on CPU the
// same sums run tap-major over whole contiguous rows, which the compiler vectorizes (the
// CUDA kernels call the per-element form; both compute Σ_j w[j] x[i + j] in the same
// order, and the tests hold the CPU result to the float64 reference).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "checks.h"
#include "correlate_axis.h"

namespace simwarp {
namespace cpu {

at::Tensor correlate(const at::Tensor& x_in, at::ArrayRef<double> taps, at::IntArrayRef sizes,
                     bool transpose) {
  checks::correlate(x_in, taps, sizes, transpose);
  if (x_in.numel() == 0)
    return at::zeros(checks::window_output_shape(x_in.sizes(), sizes, transpose), x_in.options());
  const int64_t first = x_in.dim() - static_cast<int64_t>(sizes.size());
  at::Tensor cur = x_in.contiguous();
  int64_t offset = 0;
  for (int64_t a = 0; a < static_cast<int64_t>(sizes.size()); ++a) {
    const int64_t k = sizes[a], dim = first + a;
    const int64_t L = cur.size(dim);
    int64_t B = 1, R = 1;
    for (int64_t d = 0; d < dim; ++d) B *= cur.size(d);
    for (int64_t d = dim + 1; d < cur.dim(); ++d) R *= cur.size(d);
    const int64_t n_out = transpose ? L + k - 1 : L - k + 1;
    auto out_sizes = cur.sizes().vec();
    out_sizes[dim] = n_out;
    at::Tensor out = at::empty(out_sizes, cur.options());
    AT_DISPATCH_FLOATING_TYPES(cur.scalar_type(), "simwarp_correlate", [&] {
      std::vector<scalar_t> w(taps.begin() + offset, taps.begin() + offset + k);
      correlate_axis<scalar_t>(cur.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), B, L, R, w,
                               transpose, n_out);
    });
    cur = out;
    offset += k;
  }
  return cur.is_same(x_in) ? x_in.clone(at::MemoryFormat::Contiguous) : cur;  // never x itself
}

}  // namespace cpu
}  // namespace simwarp

TORCH_LIBRARY_IMPL(simwarp, CPU, m) { m.impl("correlate", &simwarp::cpu::correlate); }
