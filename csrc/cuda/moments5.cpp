// CUDA binding of simwarp::moments5 and its registration: the five moments along the last
// axis in one moments5.cu pass, then the leading axes as plain correlate passes over the
// five maps.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <vector>

#include "binding.h"
#include "checks.h"
#include "moments5.h"

namespace simwarp {
namespace cuda {

at::Tensor moments5(const at::Tensor& centered_in, at::ArrayRef<double> taps, at::IntArrayRef sizes) {
  checks::moments5(centered_in, taps, sizes);
  if (centered_in.numel() == 0)
    return at::zeros(checks::moments5_shape(centered_in.sizes(), sizes), centered_in.options());
  const c10::cuda::CUDAGuard guard(centered_in.device());
  const at::Tensor centered = centered_in.contiguous();
  const int64_t d = static_cast<int64_t>(sizes.size());
  const int64_t L = centered.size(-1), k_last = sizes[d - 1];
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
    check_launch(launch_moments_last_axis<scalar_t>(base, base + per_image,
                                                    first.data_ptr<scalar_t>(),
                                                    all_taps.data_ptr<scalar_t>() + offset, lines,
                                                    L, k_last, stream),
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

TORCH_LIBRARY_IMPL(simwarp, CUDA, m) { m.impl("moments5", &simwarp::cuda::moments5); }
