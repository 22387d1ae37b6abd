// The argument checks of simwarp::parzen_fwd / parzen_bwd (the mutual information's
// Parzen joint histogram), shared by cpu/parzen.cpp and cuda/parzen.cpp as checks.h is by
// the other ops (kept beside it so that the ops' files stay apart).
#pragma once

#include "checks.h"

namespace simwarp {
namespace checks {

// The most bins the kernels take (the CUDA score kernel keeps both marginals in a block's
// shared memory); ops/mutual_information.py runs more through torch.
constexpr int64_t kParzenMaxBins = 1024;

// a, b (M, P) intensities; weight (M, P) or absent; bins ≥ 4; value_range empty or (lo, hi).
inline void parzen_fwd(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& weight,
                       int64_t bins, at::ArrayRef<double> value_range) {
  floating("parzen", {"a", a});
  const at::Tensor w = weight.has_value() ? *weight : at::Tensor();
  like_first("parzen", {{"a", a}, {"b", b}, {"weight", w}});
  TORCH_CHECK(a.dim() == 2, "parzen: a must be (M, P), got shape ", a.sizes());
  shape("parzen", {"b", b}, a.sizes());
  if (w.defined()) shape("parzen", {"weight", w}, a.sizes());
  TORCH_CHECK(bins >= 4 && bins <= kParzenMaxBins, "parzen: bins must be between 4 and ",
              kParzenMaxBins, ", got ", bins);
  TORCH_CHECK(value_range.empty() || (value_range.size() == 2 && value_range[1] > value_range[0]),
              "parzen: value_range must be empty or (low, high) with high > low");
}

// The forward's arguments, its score (M,), grad_joint (M, bins, bins) and frame (M, 4),
// and the score's gradient grad_score (M,).
inline void parzen_bwd(const at::Tensor& grad_score, const at::Tensor& score,
                       const at::Tensor& grad_joint, const at::Tensor& a, const at::Tensor& b,
                       const std::optional<at::Tensor>& weight, const at::Tensor& frame,
                       int64_t bins) {
  parzen_fwd(a, b, weight, bins, {});
  like_first("parzen_bwd", {{"a", a}, {"grad_score", grad_score}, {"score", score},
                            {"grad_joint", grad_joint}, {"frame", frame}});
  const int64_t M = a.size(0);
  shape("parzen_bwd", {"grad_score", grad_score}, {M});
  shape("parzen_bwd", {"score", score}, {M});
  shape("parzen_bwd", {"grad_joint", grad_joint}, {M, bins, bins});
  shape("parzen_bwd", {"frame", frame}, {M, 4});
}

}  // namespace checks
}  // namespace simwarp
