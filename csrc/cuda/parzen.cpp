// CUDA binding of simwarp::parzen_fwd / parzen_bwd and their registration: outputs
// allocated here, the parzen.cu kernels on the current stream.
//
// The forward sums the histogram with atomic additions, whose order varies from run to
// run, so it raises torch's non-determinism alert (as splat does): under
// torch.use_deterministic_algorithms(True) the "auto" backend sends mutual_information on
// CUDA to the pure torch path. The backward gathers only and is deterministic.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "binding.h"
#include "checks.h"
#include "parzen.h"

namespace simwarp {
namespace cuda {

std::tuple<at::Tensor, at::Tensor, at::Tensor> parzen_fwd(const at::Tensor& a_in, const at::Tensor& b_in,
                                                          const std::optional<at::Tensor>& weight_in,
                                                          int64_t bins, bool normalize,
                                                          at::ArrayRef<double> value_range) {
  checks::parzen_fwd(a_in, b_in, weight_in, bins, value_range);
  const int64_t M = a_in.size(0), P = a_in.size(1);
  if (M == 0 || P == 0) {  // nothing counted: an empty histogram's score, no gradient
    return {at::full({M}, normalize ? 2.0 : 0.0, a_in.options()), at::zeros({M, bins, bins}, a_in.options()),
            at::zeros({M, 4}, a_in.options())};
  }
  at::globalContext().alertNotDeterministic("simwarp::parzen_fwd on CUDA (atomic additions)");
  const DeviceGuard guard(a_in.device());
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  const at::Tensor w = weight_in.has_value() ? weight_in->contiguous() : at::Tensor();
  at::Tensor score = at::empty({M}, a.options());
  at::Tensor grad = at::zeros({M, bins, bins}, a.options());
  at::Tensor frame = at::empty({M, 4}, a.options());
  const bool has_range = !value_range.empty();
  const cudaStream_t stream = current_stream();
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "simwarp_parzen_fwd_cuda", [&] {
    check_launch(launch_parzen_forward<scalar_t>(
                     a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
                     w.defined() ? w.data_ptr<scalar_t>() : nullptr, M, P, bins, normalize, has_range,
                     has_range ? value_range[0] : 0.0, has_range ? value_range[1] : 1.0,
                     score.data_ptr<scalar_t>(), grad.data_ptr<scalar_t>(), frame.data_ptr<scalar_t>(),
                     stream),
                 "parzen_fwd");
  });
  return {score, grad, frame};
}

std::tuple<at::Tensor, at::Tensor> parzen_bwd(const at::Tensor& grad_score_in, const at::Tensor& score_in,
                                              const at::Tensor& grad_joint_in, const at::Tensor& a_in,
                                              const at::Tensor& b_in,
                                              const std::optional<at::Tensor>& weight_in,
                                              const at::Tensor& frame_in, int64_t bins) {
  checks::parzen_bwd(grad_score_in, score_in, grad_joint_in, a_in, b_in, weight_in, frame_in, bins);
  const int64_t M = a_in.size(0), P = a_in.size(1);
  if (M == 0 || P == 0) return {at::zeros(a_in.sizes(), a_in.options()), at::zeros(b_in.sizes(), b_in.options())};
  const DeviceGuard guard(a_in.device());
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  const at::Tensor w = weight_in.has_value() ? weight_in->contiguous() : at::Tensor();
  const at::Tensor gs = grad_score_in.contiguous(), score = score_in.contiguous();
  const at::Tensor G = grad_joint_in.contiguous(), frame = frame_in.contiguous();
  at::Tensor grad_a = at::empty_like(a), grad_b = at::empty_like(b);
  const cudaStream_t stream = current_stream();
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "simwarp_parzen_bwd_cuda", [&] {
    check_launch(launch_parzen_backward<scalar_t>(
                     gs.data_ptr<scalar_t>(), score.data_ptr<scalar_t>(), G.data_ptr<scalar_t>(),
                     a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
                     w.defined() ? w.data_ptr<scalar_t>() : nullptr, frame.data_ptr<scalar_t>(), M, P,
                     bins, grad_a.data_ptr<scalar_t>(), grad_b.data_ptr<scalar_t>(), stream),
                 "parzen_bwd");
  });
  return {grad_a, grad_b};
}

}  // namespace cuda
}  // namespace simwarp

SIMWARP_CUDA_LIBRARY_IMPL(m) {
  m.impl("parzen_fwd", &simwarp::cuda::parzen_fwd);
  m.impl("parzen_bwd", &simwarp::cuda::parzen_bwd);
}
