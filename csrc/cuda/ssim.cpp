// CUDA binding of simwarp::ssim_fwd / ssim_bwd (CUDA only: their schemas are defined here,
// binding.h) and their registration: the fused 2-D Gaussian SSIM of ssim.cu, float32.
// ops/ssim.py calls them for float32 CUDA tensors with a 2-D window of at most
// kSsimMaxTaps per axis; everything else takes moments5 and correlate.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "binding.h"
#include "checks.h"
#include "ssim.h"

namespace simwarp {
namespace cuda {
namespace {

SsimTaps ssim_taps(at::ArrayRef<double> taps, at::IntArrayRef sizes) {
  SsimTaps t{};
  t.ky = static_cast<int>(sizes[0]);
  t.kx = static_cast<int>(sizes[1]);
  for (int j = 0; j < t.ky; ++j) t.wy[j] = static_cast<float>(taps[j]);
  for (int i = 0; i < t.kx; ++i) t.wx[i] = static_cast<float>(taps[t.ky + i]);
  return t;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> ssim_fwd(const at::Tensor& a_in,
                                                        const at::Tensor& b_in,
                                                        at::ArrayRef<double> taps,
                                                        at::IntArrayRef sizes, double c1,
                                                        double c2, bool need_partials) {
  checks::ssim_fwd(a_in, b_in, taps, sizes, kSsimMaxTaps);
  const DeviceGuard guard(a_in.device());
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  const int64_t H = a.size(-2), W = a.size(-1), images = a.numel() / (H * W);
  auto four = a.sizes().vec();
  four.insert(four.begin(), 4);
  at::Tensor map = at::empty(a.sizes(), a.options());
  at::Tensor partials = at::empty(need_partials ? four : std::vector<int64_t>{0}, a.options());
  at::Tensor shifts = at::empty(need_partials ? std::vector<int64_t>{2, images, ssim_tiles(H), ssim_tiles(W)}
                                              : std::vector<int64_t>{0},
                                a.options());
  if (images == 0) return {map, partials.zero_(), shifts.zero_()};
  check_launch(launch_ssim_fwd(a.data_ptr<float>(), b.data_ptr<float>(), map.data_ptr<float>(),
                               need_partials ? partials.data_ptr<float>() : nullptr,
                               need_partials ? shifts.data_ptr<float>() : nullptr,
                               ssim_taps(taps, sizes), images, H, W, static_cast<float>(c1),
                               static_cast<float>(c2), current_stream()),
               "ssim_fwd");
  return {map, partials, shifts};
}

std::tuple<at::Tensor, at::Tensor> ssim_bwd(const at::Tensor& grad_in, const at::Tensor& a_in,
                                            const at::Tensor& b_in, const at::Tensor& partials_in,
                                            const at::Tensor& shifts_in, at::ArrayRef<double> taps,
                                            at::IntArrayRef sizes) {
  checks::ssim_bwd(grad_in, a_in, b_in, partials_in, shifts_in, taps, sizes, kSsimMaxTaps,
                   kSsimTile);
  const DeviceGuard guard(a_in.device());
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  const at::Tensor grad = grad_in.contiguous(), partials = partials_in.contiguous();
  const at::Tensor shifts = shifts_in.contiguous();
  const int64_t H = a.size(-2), W = a.size(-1), images = a.numel() / (H * W);
  at::Tensor grad_a = at::empty(a.sizes(), a.options());
  at::Tensor grad_b = at::empty(a.sizes(), a.options());
  if (images == 0) return {grad_a, grad_b};
  const bool scalar = grad.numel() == 1 && grad.sizes() != a.sizes();
  check_launch(launch_ssim_bwd(grad.data_ptr<float>(), scalar, a.data_ptr<float>(),
                               b.data_ptr<float>(), partials.data_ptr<float>(),
                               shifts.data_ptr<float>(), grad_a.data_ptr<float>(),
                               grad_b.data_ptr<float>(), ssim_taps(taps, sizes), images, H, W,
                               current_stream()),
               "ssim_bwd");
  return {grad_a, grad_b};
}

}  // namespace cuda
}  // namespace simwarp

SIMWARP_CUDA_ONLY_SCHEMAS(m) {
  // Fused 2-D Gaussian SSIM of (..., H, W) float32 images, SciPy "reflect" padding, taps
  // concatenated per axis (odd sizes, at most 31): returns (map, partials (4, ...),
  // shifts (2, images, tiles_y, tiles_x)); the last two empty unless need_partials.
  m.def("ssim_fwd(Tensor a, Tensor b, float[] taps, int[] sizes, float c1, float c2, bool need_partials) -> (Tensor, Tensor, Tensor)");
  // Gradients (grad_a, grad_b) from grad (one value, or the map's shape) and the forward's.
  m.def("ssim_bwd(Tensor grad, Tensor a, Tensor b, Tensor partials, Tensor shifts, float[] taps, int[] sizes) -> (Tensor, Tensor)");
}

SIMWARP_CUDA_LIBRARY_IMPL(m) {
  m.impl("ssim_fwd", &simwarp::cuda::ssim_fwd);
  m.impl("ssim_bwd", &simwarp::cuda::ssim_bwd);
}
