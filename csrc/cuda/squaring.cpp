// CUDA binding of simwarp::squaring_fwd / squaring_bwd and their registration: outputs and
// buffers allocated here, the squaring.cu kernels on the current stream.
//
// The backward scatters with atomic additions, whose order varies from run to run, so it
// raises torch's non-determinism alert, and the "auto" backend sends the squarings on CUDA
// under torch.use_deterministic_algorithms(True) to the torch path (ops/_kernels). The
// forward gathers only and is deterministic.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "binding.h"
#include "checks.h"
#include "squaring.h"

namespace simwarp {
namespace cuda {

std::tuple<at::Tensor, at::Tensor> squaring_fwd(const at::Tensor& u_in,
                                                at::ArrayRef<double> scale, int64_t steps,
                                                bool keep) {
  checks::squaring_fwd(u_in, scale, steps);
  const at::Tensor u = u_in.contiguous();
  at::Tensor saved = at::empty(checks::squaring_saved_shape(u.sizes(), keep ? steps : 0), u.options());
  if (u.numel() == 0 || steps == 0) return {checks::squaring_scaled_copy(u, scale), saved};  // saved: empty or no field
  const DeviceGuard guard(u.device());
  const int64_t D = u.dim() - 2, N = u.size(0);
  int64_t size[3] = {1, 1, 1}, P = 1;
  for (int64_t k = 0; k < D; ++k) { size[k] = u.size(2 + k); P *= size[k]; }
  // Squaring k < steps − 1 goes to saved[k + 1] (keep) or, ping-pong, to out and spare;
  // the last one to out.
  at::Tensor out = at::empty_like(u);
  at::Tensor spare = !keep && steps > 1 ? at::empty_like(u) : at::Tensor();
  const cudaStream_t stream = current_stream();
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "simwarp_squaring_fwd_cuda", [&] {
    std::vector<scalar_t*> outputs(steps);
    const int64_t field = N * D * P;
    for (int64_t k = 0; k < steps; ++k) {
      if (k == steps - 1) outputs[k] = out.data_ptr<scalar_t>();
      else if (keep) outputs[k] = saved.data_ptr<scalar_t>() + (k + 1) * field;
      else  // ping-pong, the last squaring writing `out`
        outputs[k] = ((steps - 1 - k) % 2 == 0 ? out : spare).data_ptr<scalar_t>();
    }
    // the first squaring writes its input u = scale · v into saved[0] (keep)
    check_launch(launch_squaring_forward<scalar_t>(
                     u.data_ptr<scalar_t>(), squaring_scale<scalar_t>(scale.data(), scale.size()),
                     keep ? saved.data_ptr<scalar_t>() : nullptr, outputs.data(), steps, N,
                     static_cast<int>(D), size, stream),
                 "squaring_fwd");
  });
  return {out, saved};
}

at::Tensor squaring_bwd(const at::Tensor& grad_in, const at::Tensor& saved_in,
                        at::ArrayRef<double> scale, const std::optional<at::Tensor>& base_in) {
  checks::squaring_bwd(grad_in, saved_in, scale, base_in);
  const int64_t steps = saved_in.size(0);
  const at::Tensor grad = grad_in.contiguous();
  const at::Tensor base =
      base_in.has_value() && base_in->defined() ? base_in->contiguous() : at::Tensor();
  if (grad.numel() == 0 || steps == 0)
    return checks::squaring_scaled_copy(base.defined() ? grad + base : grad, scale);
  at::globalContext().alertNotDeterministic("simwarp::squaring_bwd on CUDA (atomic additions)");
  const DeviceGuard guard(grad.device());
  const at::Tensor saved = saved_in.contiguous();
  const int64_t D = grad.dim() - 2, N = grad.size(0);
  int64_t size[3] = {1, 1, 1};
  for (int64_t k = 0; k < D; ++k) size[k] = grad.size(2 + k);
  // buffers[k] holds the gradient with respect to saved[k]; two alternate (k and k + 1
  // are read and written by one launch), buffers[0] the result.
  at::Tensor result = at::empty_like(grad);
  at::Tensor spare = steps > 1 ? at::empty_like(grad) : at::Tensor();
  const cudaStream_t stream = current_stream();
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "simwarp_squaring_bwd_cuda", [&] {
    std::vector<scalar_t*> buffers(steps);
    for (int64_t k = 0; k < steps; ++k)
      buffers[k] = (k % 2 == 0 ? result : spare).data_ptr<scalar_t>();
    check_launch(launch_squaring_backward<scalar_t>(
                     grad.data_ptr<scalar_t>(), saved.data_ptr<scalar_t>(),
                     base.defined() ? base.data_ptr<scalar_t>() : nullptr,
                     squaring_scale<scalar_t>(scale.data(), scale.size()), buffers.data(), steps, N, static_cast<int>(D),
                     size, stream),
                 "squaring_bwd");
  });
  return result;
}

}  // namespace cuda
}  // namespace simwarp

SIMWARP_CUDA_LIBRARY_IMPL(m) {
  m.impl("squaring_fwd", &simwarp::cuda::squaring_fwd);
  m.impl("squaring_bwd", &simwarp::cuda::squaring_bwd);
}
