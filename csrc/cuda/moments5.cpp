// CUDA binding of simwarp::moments5 and its registration: the five moments along the last
// axis in one moments5.cu pass, then each leading axis as a correlate pass over the five
// maps along that axis where it lies (no transposes).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "binding.h"
#include "checks.h"
#include "moments5.h"

namespace simwarp {
namespace cuda {

at::Tensor moments5(const at::Tensor& centered_in, at::ArrayRef<double> taps, at::IntArrayRef sizes) {
  checks::moments5(centered_in, taps, sizes);
  if (centered_in.numel() == 0)
    return at::zeros(checks::moments5_shape(centered_in.sizes(), sizes), centered_in.options());
  const DeviceGuard guard(centered_in.device());
  const at::Tensor centered = centered_in.contiguous();
  const int64_t d = static_cast<int64_t>(sizes.size()), first = centered.dim() - d;
  const int64_t L = centered.size(-1), k_last = sizes[d - 1];
  const int64_t per_image = centered.numel() / 2, lines = per_image / L;
  int64_t offset = 0;  // where the last axis's taps start
  for (int64_t a = 0; a < d - 1; ++a) offset += sizes[a];
  auto out_sizes = centered.sizes().vec();
  out_sizes[0] = 5;
  out_sizes.back() = L - k_last + 1;
  at::Tensor cur = at::empty(out_sizes, centered.options());
  AT_DISPATCH_FLOATING_TYPES(centered.scalar_type(), "simwarp_moments5_cuda", [&] {
    const scalar_t* base = centered.data_ptr<scalar_t>();
    check_launch(launch_moments_last_axis<scalar_t>(base, base + per_image,
                                                    cur.data_ptr<scalar_t>(), taps.data() + offset,
                                                    lines, L, k_last, current_stream()),
                 "moments5");
  });
  offset = 0;
  for (int64_t a = 0; a < d - 1; ++a) {
    cur = correlate_pass(cur, first + a, taps.data() + offset, sizes[a], /*transpose=*/false);
    offset += sizes[a];
  }
  return cur;
}

}  // namespace cuda
}  // namespace simwarp

SIMWARP_CUDA_LIBRARY_IMPL(m) { m.impl("moments5", &simwarp::cuda::moments5); }
