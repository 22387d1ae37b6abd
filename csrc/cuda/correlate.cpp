// CUDA binding of simwarp::correlate and its registration: one correlate.cu pass per axis,
// the taps copied to the device once. moments5.cpp calls it too (declared in binding.h).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <vector>

#include "binding.h"
#include "checks.h"
#include "correlate.h"

namespace simwarp {
namespace cuda {

at::Tensor correlate(const at::Tensor& x_in, at::ArrayRef<double> taps, at::IntArrayRef sizes,
                     bool transpose) {
  checks::correlate(x_in, taps, sizes, transpose);
  if (x_in.numel() == 0)
    return at::zeros(checks::window_output_shape(x_in.sizes(), sizes, transpose), x_in.options());
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
    const int64_t n_out = transpose ? l.L + k - 1 : l.L - k + 1;
    auto out_sizes = cur.sizes().vec();
    out_sizes[dim] = n_out;
    at::Tensor out = at::empty(out_sizes, cur.options());
    AT_DISPATCH_FLOATING_TYPES(cur.scalar_type(), "simwarp_correlate_cuda", [&] {
      check_launch(launch_correlate_axis<scalar_t>(cur.data_ptr<scalar_t>(),
                                                   out.data_ptr<scalar_t>(),
                                                   all_taps.data_ptr<scalar_t>() + offset, l.B,
                                                   l.L, l.R, k, transpose, n_out, stream),
                   "correlate");
    });
    cur = out;
    offset += k;
  }
  return cur.is_same(x_in) ? x_in.clone(at::MemoryFormat::Contiguous) : cur;  // never x itself
}

}  // namespace cuda
}  // namespace simwarp

TORCH_LIBRARY_IMPL(simwarp, CUDA, m) { m.impl("correlate", &simwarp::cuda::correlate); }
