// CUDA binding of simwarp::splat_fwd / splat_bwd and their registration: outputs and scratch
// buffers allocated here, the splat.cu kernels on the current stream.
//
// The forward scatters with atomic additions, whose order varies from run to run, so it
// raises torch's non-determinism alert: under torch.use_deterministic_algorithms(True) it
// refuses to run (a warning with warn_only=True), and the "auto" backend sends splat on
// CUDA to the pure torch path instead, whose scatter torch makes deterministic
// (ops/_kernels/__init__.py). The backward gathers only and is deterministic.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "binding.h"
#include "checks.h"
#include "splat.h"

namespace simwarp {
namespace cuda {

std::tuple<at::Tensor, at::Tensor> splat_fwd(const at::Tensor& image_in, const at::Tensor& disp_in,
                                             bool normalize, double eps) {
  checks::splat_fwd(image_in, disp_in);
  if (disp_in.numel() == 0) {  // no source pixel (N or P is 0): out and den are empty
    return {at::zeros(image_in.sizes(), image_in.options()),
            at::zeros(checks::splat_den_shape(image_in.sizes()), image_in.options())};
  }
  at::globalContext().alertNotDeterministic("simwarp::splat_fwd on CUDA (atomic additions)");
  const DeviceGuard guard(image_in.device());
  const at::Tensor image = image_in.contiguous(), disp = disp_in.contiguous();
  const int64_t D = image.dim() - 2, N = image.size(0), C = image.size(1);
  int64_t size[3] = {1, 1, 1};
  for (int64_t k = 0; k < D; ++k) size[k] = image.size(2 + k);
  at::Tensor out = at::zeros_like(image);
  at::Tensor den = at::zeros(checks::splat_den_shape(image.sizes()), image.options());
  const cudaStream_t stream = current_stream();
  AT_DISPATCH_FLOATING_TYPES(image.scalar_type(), "simwarp_splat_fwd_cuda", [&] {
    check_launch(launch_splat_forward<scalar_t>(image.data_ptr<scalar_t>(), disp.data_ptr<scalar_t>(),
                                                out.data_ptr<scalar_t>(), den.data_ptr<scalar_t>(),
                                                N, C, static_cast<int>(D), size, normalize,
                                                static_cast<scalar_t>(eps), stream),
                 "splat_fwd");
  });
  return {out, den};
}

std::tuple<at::Tensor, at::Tensor> splat_bwd(const std::optional<at::Tensor>& v_out_in,
                                             const std::optional<at::Tensor>& v_den_in,
                                             const at::Tensor& image_in, const at::Tensor& disp_in,
                                             const at::Tensor& out_in, const at::Tensor& den_in,
                                             bool normalize, double eps) {
  checks::splat_bwd(v_out_in, v_den_in, image_in, disp_in, out_in, den_in);
  if (disp_in.numel() == 0)
    return {at::zeros(image_in.sizes(), image_in.options()), at::zeros(disp_in.sizes(), disp_in.options())};
  const DeviceGuard guard(image_in.device());
  const at::Tensor image = image_in.contiguous(), disp = disp_in.contiguous();
  const at::Tensor out = out_in.contiguous(), den = den_in.contiguous();
  const int64_t D = image.dim() - 2, N = image.size(0), C = image.size(1);
  int64_t size[3] = {1, 1, 1};
  for (int64_t k = 0; k < D; ++k) size[k] = image.size(2 + k);
  const at::Tensor v_out = v_out_in.has_value() ? v_out_in->contiguous() : at::Tensor();
  const at::Tensor v_den = v_den_in.has_value() ? v_den_in->contiguous() : at::Tensor();
  at::Tensor grad_image = at::zeros_like(image), grad_disp = at::empty_like(disp);
  at::Tensor scaled = at::empty_like(image), slope0 = at::empty_like(den);
  const cudaStream_t stream = current_stream();
  AT_DISPATCH_FLOATING_TYPES(image.scalar_type(), "simwarp_splat_bwd_cuda", [&] {
    check_launch(launch_splat_backward<scalar_t>(
                     v_out.defined() ? v_out.data_ptr<scalar_t>() : nullptr,
                     v_den.defined() ? v_den.data_ptr<scalar_t>() : nullptr,
                     image.data_ptr<scalar_t>(), disp.data_ptr<scalar_t>(),
                     out.data_ptr<scalar_t>(), den.data_ptr<scalar_t>(),
                     scaled.data_ptr<scalar_t>(), slope0.data_ptr<scalar_t>(),
                     grad_image.data_ptr<scalar_t>(), grad_disp.data_ptr<scalar_t>(), N, C,
                     static_cast<int>(D), size, normalize, static_cast<scalar_t>(eps), stream),
                 "splat_bwd");
  });
  return {grad_image, grad_disp};
}

}  // namespace cuda
}  // namespace simwarp

SIMWARP_CUDA_LIBRARY_IMPL(m) {
  m.impl("splat_fwd", &simwarp::cuda::splat_fwd);
  m.impl("splat_bwd", &simwarp::cuda::splat_bwd);
}
