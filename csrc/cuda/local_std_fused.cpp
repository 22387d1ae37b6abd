// CUDA binding of simwarp::local_std_fused_fwd / local_std_fused_bwd (CUDA only: their
// schemas are defined here, binding.h) and their registration: the fused 2-D local std of
// local_std_fused.cu, float32, padding and centring inside the kernels. ops/local_std.py
// calls them for float32 CUDA tensors (..., H, W) with windows of at most
// kLocalStdMaxWindow per axis; everything else takes local_std_fwd / local_std_bwd.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "binding.h"
#include "checks.h"
#include "local_std_fused.h"

namespace simwarp {
namespace cuda {
namespace {

BoxWindow box_window(at::IntArrayRef window, c10::string_view padding) {
  Padding mode = Padding::kReflect;
  if (padding == "mirror") mode = Padding::kMirror;
  if (padding == "nearest") mode = Padding::kNearest;
  if (padding == "constant") mode = Padding::kConstant;
  return BoxWindow{static_cast<int>(window[0]), static_cast<int>(window[1]), mode};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> local_std_fused_fwd(
    const at::Tensor& x_in, const at::Tensor& shift_in, at::IntArrayRef window,
    c10::string_view padding, double eps, bool normalize, double flat_factor) {
  checks::local_std_fused_fwd(x_in, shift_in, window, padding, kLocalStdMaxWindow);
  const DeviceGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), shift = shift_in.contiguous();
  const int64_t H = x.size(-2), W = x.size(-1), images = x.numel() / (H * W);
  at::Tensor out = at::empty(x.sizes(), x.options());
  at::Tensor s1 = at::empty(x.sizes(), x.options());
  at::Tensor flat = at::empty(x.sizes(), x.options().dtype(at::kBool));
  if (images == 0) return {out, s1, flat};
  check_launch(launch_local_std_fused_fwd(x.data_ptr<float>(), shift.data_ptr<float>(),
                                          out.data_ptr<float>(), s1.data_ptr<float>(),
                                          flat.data_ptr<bool>(), box_window(window, padding),
                                          images, H, W, static_cast<float>(eps),
                                          static_cast<float>(flat_factor), normalize,
                                          current_stream()),
               "local_std_fused_fwd");
  return {out, s1, flat};
}

at::Tensor local_std_fused_bwd(const at::Tensor& grad_in, const at::Tensor& out_in,
                               const at::Tensor& s1_in, const at::Tensor& flat_in,
                               const at::Tensor& x_in, const at::Tensor& shift_in,
                               at::IntArrayRef window, c10::string_view padding, bool normalize) {
  checks::local_std_fused_bwd(grad_in, out_in, s1_in, flat_in, x_in, shift_in, window, padding,
                              kLocalStdMaxWindow);
  const DeviceGuard guard(x_in.device());
  const at::Tensor grad = grad_in.contiguous(), out = out_in.contiguous();
  const at::Tensor s1 = s1_in.contiguous(), flat = flat_in.contiguous();
  const at::Tensor x = x_in.contiguous(), shift = shift_in.contiguous();
  const int64_t H = x.size(-2), W = x.size(-1), images = x.numel() / (H * W);
  at::Tensor dx = at::empty(x.sizes(), x.options());
  if (images == 0) return dx;
  check_launch(launch_local_std_fused_bwd(grad.data_ptr<float>(), out.data_ptr<float>(),
                                          s1.data_ptr<float>(), flat.data_ptr<bool>(),
                                          x.data_ptr<float>(), shift.data_ptr<float>(),
                                          dx.data_ptr<float>(), box_window(window, padding),
                                          images, H, W, normalize, current_stream()),
               "local_std_fused_bwd");
  return dx;
}

}  // namespace cuda
}  // namespace simwarp

SIMWARP_CUDA_ONLY_SCHEMAS(m) {
  // Local std of images x (..., H, W) float32 over an odd box window (at most 31 per axis),
  // SciPy padding ("reflect", "mirror", "nearest", "constant"), each image centred on its
  // shift (images,): returns (out, S1, flat) as local_std_fwd on the padded, centred image.
  m.def("local_std_fused_fwd(Tensor x, Tensor shift, int[] window, str padding, float eps, bool normalize, float flat_factor) -> (Tensor, Tensor, Tensor)");
  m.def("local_std_fused_bwd(Tensor grad, Tensor out, Tensor s1, Tensor flat, Tensor x, Tensor shift, int[] window, str padding, bool normalize) -> Tensor");
}

SIMWARP_CUDA_LIBRARY_IMPL(m) {
  m.impl("local_std_fused_fwd", &simwarp::cuda::local_std_fused_fwd);
  m.impl("local_std_fused_bwd", &simwarp::cuda::local_std_fused_bwd);
}
