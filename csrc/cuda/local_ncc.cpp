// CUDA binding of simwarp::local_ncc_fwd / local_ncc_bwd (CUDA only: their schemas are
// defined here, binding.h) and their registration: the fused local NCC of local_ncc.cu,
// 2-D images and 3-D volumes, float32. ops/local_ncc.py calls them for float32 CUDA tensors
// with a window of at most kNccMaxTaps per axis; everything else takes moments5 and the
// window's adjoint (ops/_moments.py).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <array>
#include <vector>

#include "binding.h"
#include "checks.h"
#include "local_ncc.h"

namespace simwarp {
namespace cuda {
namespace {

// The taps per axis as the kernels take them: a 2-D window gets one z tap of 1.
NccTaps ncc_taps(at::ArrayRef<double> taps, at::IntArrayRef sizes) {
  NccTaps t{};
  const bool volume = sizes.size() == 3;
  t.kz = volume ? static_cast<int>(sizes[0]) : 1;
  t.ky = static_cast<int>(sizes[volume ? 1 : 0]);
  t.kx = static_cast<int>(sizes[volume ? 2 : 1]);
  size_t at = 0;
  if (volume)
    for (int k = 0; k < t.kz; ++k) t.wz[k] = static_cast<float>(taps[at++]);
  else
    t.wz[0] = 1.0f;
  for (int j = 0; j < t.ky; ++j) t.wy[j] = static_cast<float>(taps[at++]);
  for (int i = 0; i < t.kx; ++i) t.wx[i] = static_cast<float>(taps[at++]);
  return t;
}

// (images, D, H, W) of a (..., [D,] H, W) tensor for a window of len(sizes) axes.
std::array<int64_t, 4> volumes(const at::Tensor& a, at::IntArrayRef sizes) {
  const int64_t W = a.size(-1), H = a.size(-2), D = sizes.size() == 3 ? a.size(-3) : 1;
  const int64_t per = D * H * W;
  return {per ? a.numel() / per : 0, D, H, W};
}

std::vector<int64_t> shift_shape(const std::array<int64_t, 4>& v, int kz) {
  const int64_t tz = ncc_tile_z(v[1], kz);
  return {2, v[0], ncc_tiles(v[1], tz), ncc_tiles(v[2], kNccTile), ncc_tiles(v[3], kNccTile)};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> local_ncc_fwd(
    const at::Tensor& a_in, const at::Tensor& b_in, at::ArrayRef<double> taps,
    at::IntArrayRef sizes, double inv_total, double flat_factor, bool need_partials) {
  checks::local_ncc_fwd(a_in, b_in, taps, sizes, kNccMaxTaps);
  const DeviceGuard guard(a_in.device());
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  const auto v = volumes(a, sizes);
  const NccTaps t = ncc_taps(taps, sizes);
  auto five = a.sizes().vec();
  five.insert(five.begin(), 5);
  at::Tensor map = at::empty(a.sizes(), a.options());
  at::Tensor partials = at::empty(need_partials ? five : std::vector<int64_t>{0}, a.options());
  at::Tensor shifts =
      at::empty(need_partials ? shift_shape(v, t.kz) : std::vector<int64_t>{0}, a.options());
  if (v[0] == 0) return {map, partials.zero_(), shifts.zero_()};
  check_launch(launch_local_ncc_fwd(a.data_ptr<float>(), b.data_ptr<float>(),
                                    map.data_ptr<float>(),
                                    need_partials ? partials.data_ptr<float>() : nullptr,
                                    need_partials ? shifts.data_ptr<float>() : nullptr, t, v[0],
                                    v[1], v[2], v[3], static_cast<float>(inv_total),
                                    static_cast<float>(flat_factor), current_stream()),
               "local_ncc_fwd");
  return {map, partials, shifts};
}

std::tuple<at::Tensor, at::Tensor> local_ncc_bwd(const at::Tensor& grad_in,
                                                 const at::Tensor& a_in, const at::Tensor& b_in,
                                                 const at::Tensor& partials_in,
                                                 const at::Tensor& shifts_in,
                                                 at::ArrayRef<double> taps,
                                                 at::IntArrayRef sizes) {
  const auto v = volumes(a_in, sizes);
  const int kz = sizes.size() == 3 ? static_cast<int>(sizes[0]) : 1;
  checks::local_ncc_bwd(grad_in, a_in, b_in, partials_in, shifts_in, taps, sizes, kNccMaxTaps,
                        shift_shape(v, kz));
  const DeviceGuard guard(a_in.device());
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  const at::Tensor grad = grad_in.contiguous(), partials = partials_in.contiguous();
  const at::Tensor shifts = shifts_in.contiguous();
  at::Tensor grad_a = at::empty(a.sizes(), a.options());
  at::Tensor grad_b = at::empty(a.sizes(), a.options());
  if (v[0] == 0) return {grad_a, grad_b};
  const bool scalar = grad.numel() == 1 && grad.sizes() != a.sizes();
  check_launch(launch_local_ncc_bwd(grad.data_ptr<float>(), scalar, a.data_ptr<float>(),
                                    b.data_ptr<float>(), partials.data_ptr<float>(),
                                    shifts.data_ptr<float>(), grad_a.data_ptr<float>(),
                                    grad_b.data_ptr<float>(), ncc_taps(taps, sizes), v[0], v[1],
                                    v[2], v[3], current_stream()),
               "local_ncc_bwd");
  return {grad_a, grad_b};
}

}  // namespace cuda
}  // namespace simwarp

SIMWARP_CUDA_ONLY_SCHEMAS(m) {
  // Fused local NCC of (..., H, W) or (..., D, H, W) float32 images, SciPy "reflect"
  // padding, taps concatenated per axis (odd sizes, at most 25), inv_total = 1 / the
  // window's weight sum, flat_factor the flat rule's level: returns (map, partials (5, ...),
  // shifts (2, images, tiles_z, tiles_y, tiles_x)); the last two empty unless
  // need_partials.
  m.def("local_ncc_fwd(Tensor a, Tensor b, float[] taps, int[] sizes, float inv_total, float flat_factor, bool need_partials) -> (Tensor, Tensor, Tensor)");
  // Gradients (grad_a, grad_b) from grad (one value, or the map's shape) and the forward's.
  m.def("local_ncc_bwd(Tensor grad, Tensor a, Tensor b, Tensor partials, Tensor shifts, float[] taps, int[] sizes) -> (Tensor, Tensor)");
}

SIMWARP_CUDA_LIBRARY_IMPL(m) {
  m.impl("local_ncc_fwd", &simwarp::cuda::local_ncc_fwd);
  m.impl("local_ncc_bwd", &simwarp::cuda::local_ncc_bwd);
}
