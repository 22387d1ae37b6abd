// CPU implementation of simwarp::parzen_fwd / parzen_bwd and their registration: the
// B-spline Parzen joint histogram of mutual information, its entropies and their
// closed-form gradient in one pass per image (forward), and the gradient with respect to
// both images' intensities (backward; docs/maths.md §10).
//
// Rows (images × channels) in parallel, each row's pixels serially: the histogram is
// summed in double in index order, bitwise the same whatever the thread count. The
// entropies run in double (the CPU's moment dtype). The taps come from
// include/simwarp/parzen.h, shared with the CUDA kernels.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "checks.h"
#include "simwarp/parzen.h"

namespace simwarp {
namespace cpu {
namespace {

// One row's frame (lo, span) of each image: value_range, else the min and max over the
// pixels of positive weight (non-finite values as 0); and whether the row is all finite.
template <typename T>
bool row_frame(const T* a, const T* b, const T* w, int64_t P, at::ArrayRef<double> range, T* frame) {
  bool finite = true;
  const T big = std::numeric_limits<T>::max();
  T lo_a = big, hi_a = -big, lo_b = big, hi_b = -big;
  for (int64_t p = 0; p < P; ++p) {
    finite = finite && (a[p] - a[p]) == T(0) && (b[p] - b[p]) == T(0);
    if (w != nullptr && !(w[p] > T(0))) continue;
    const T xa = parzen_finite_or_zero(a[p]), xb = parzen_finite_or_zero(b[p]);
    lo_a = xa < lo_a ? xa : lo_a;
    hi_a = xa > hi_a ? xa : hi_a;
    lo_b = xb < lo_b ? xb : lo_b;
    hi_b = xb > hi_b ? xb : hi_b;
  }
  if (!range.empty()) {
    lo_a = lo_b = static_cast<T>(range[0]);
    hi_a = hi_b = static_cast<T>(range[1]);
  }
  frame[0] = lo_a;
  frame[1] = parzen_span(lo_a, hi_a);
  frame[2] = lo_b;
  frame[3] = parzen_span(lo_b, hi_b);
  return finite;
}

// The score of one row's joint histogram J (B × B, double) and ∂S/∂J into grad (as
// ops/mutual_information.py score_and_gradient, empty=True).
template <typename T>
T row_score(const std::vector<double>& J, int64_t B, bool normalize, T* grad) {
  const double tiny = parzen_tiny<double>();
  std::vector<double> ma(B, 0.0), mb(B, 0.0);
  double total = 0.0;
  for (int64_t i = 0; i < B; ++i)
    for (int64_t j = 0; j < B; ++j) {
      const double v = J[i * B + j];
      ma[i] += v;
      mb[j] += v;
      total += v;
    }
  const double t = total > tiny ? total : tiny;
  auto plogp = [&](double v) {
    const double p = v / t;
    return p * std::log(p > tiny ? p : tiny);
  };
  auto logp = [&](double v) {
    const double p = v / t;
    return std::log(p > tiny ? p : tiny);
  };
  double nh_ab = 0.0, nh_a = 0.0, nh_b = 0.0;
  for (int64_t k = 0; k < B * B; ++k) nh_ab += plogp(J[k]);
  for (int64_t k = 0; k < B; ++k) {
    nh_a += plogp(ma[k]);
    nh_b += plogp(mb[k]);
  }
  double score;
  if (normalize) {
    if (nh_ab >= 0.0) {  // H_ab = 0: one bin (or none) holds everything
      for (int64_t k = 0; k < B * B; ++k) grad[k] = T(0);
      return T(2);
    }
    score = (nh_a + nh_b) / nh_ab;
    const double scale = -(nh_ab * total);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < B; ++j)
        grad[i * B + j] =
            static_cast<T>((logp(J[i * B + j]) * score - logp(ma[i]) - logp(mb[j])) / scale);
  } else {
    score = nh_ab - nh_a - nh_b;
    if (total == 0.0) {  // no weight: a score of 0 that no pixel moves
      for (int64_t k = 0; k < B * B; ++k) grad[k] = T(0);
      return static_cast<T>(score);
    }
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < B; ++j)
        grad[i * B + j] =
            static_cast<T>((logp(J[i * B + j]) - logp(ma[i]) - logp(mb[j]) - score) / total);
  }
  return static_cast<T>(score);
}

template <typename T>
void forward_row(const T* a, const T* b, const T* w, int64_t P, int64_t B, bool normalize,
                 at::ArrayRef<double> range, T* score, T* grad, T* frame) {
  const bool finite = row_frame(a, b, w, P, range, frame);
  std::vector<double> J(B * B, 0.0);
  for (int64_t p = 0; p < P; ++p) {
    const T weight = w == nullptr ? T(1) : w[p];
    if (weight == T(0)) continue;
    T fa, fb, wa[4], wb[4];
    const T xa = parzen_finite_or_zero(a[p]), xb = parzen_finite_or_zero(b[p]);
    const int64_t ca = parzen_cell(parzen_xi(parzen_unit(xa, frame[0], frame[1]), B), B, &fa);
    const int64_t cb = parzen_cell(parzen_xi(parzen_unit(xb, frame[2], frame[3]), B), B, &fb);
    parzen_weights(fa, wa);
    parzen_weights(fb, wb);
    double* row = J.data() + (ca - 1) * B + (cb - 1);
    for (int i = 0; i < 4; ++i) {
      const double wi = static_cast<double>(weight * wa[i]);
      for (int j = 0; j < 4; ++j) row[i * B + j] += wi * static_cast<double>(wb[j]);
    }
  }
  *score = row_score<T>(J, B, normalize, grad);
  if (!finite) {  // NaN for a row with a non-finite pixel, and no gradient
    *score = std::numeric_limits<T>::quiet_NaN();
    for (int64_t k = 0; k < B * B; ++k) grad[k] = T(0);
  }
}

template <typename T>
void backward_row(T gs, const T* G, const T* a, const T* b, const T* w, const T* frame, int64_t P,
                  int64_t B, T* grad_a, T* grad_b) {
  const T scale = static_cast<T>(B - 3);
  for (int64_t p = 0; p < P; ++p) {
    const T weight = w == nullptr ? T(1) : w[p];
    T fa, fb, wa[4], wb[4], sa[4], sb[4];
    const T xa = parzen_finite_or_zero(a[p]), xb = parzen_finite_or_zero(b[p]);
    const T ua = parzen_unit(xa, frame[0], frame[1]), ub = parzen_unit(xb, frame[2], frame[3]);
    const int64_t ca = parzen_cell(parzen_xi(ua, B), B, &fa);
    const int64_t cb = parzen_cell(parzen_xi(ub, B), B, &fb);
    parzen_weights(fa, wa);
    parzen_weights(fb, wb);
    parzen_slopes(fa, sa);
    parzen_slopes(fb, sb);
    T ga = T(0), gb = T(0);
    const T* g = G + (ca - 1) * B + (cb - 1);
    for (int i = 0; i < 4; ++i) {
      T seen_a = T(0), seen_b = T(0);  // G's row i seen through b's weights and slopes
      for (int j = 0; j < 4; ++j) {
        seen_a += g[i * B + j] * wb[j];
        seen_b += g[i * B + j] * sb[j];
      }
      ga += sa[i] * seen_a;
      gb += wa[i] * seen_b;
    }
    const T common = gs * weight * scale;
    const bool in_a = ua >= T(0) && ua <= T(1) && (a[p] - a[p]) == T(0);
    const bool in_b = ub >= T(0) && ub <= T(1) && (b[p] - b[p]) == T(0);
    grad_a[p] = in_a ? common * ga / frame[1] : T(0);
    grad_b[p] = in_b ? common * gb / frame[3] : T(0);
  }
}

}  // namespace

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
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  const at::Tensor w = weight_in.has_value() ? weight_in->contiguous() : at::Tensor();
  at::Tensor score = at::empty({M}, a.options());
  at::Tensor grad = at::empty({M, bins, bins}, a.options());
  at::Tensor frame = at::empty({M, 4}, a.options());
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "simwarp_parzen_fwd", [&] {
    const scalar_t* pa = a.data_ptr<scalar_t>();
    const scalar_t* pb = b.data_ptr<scalar_t>();
    const scalar_t* pw = w.defined() ? w.data_ptr<scalar_t>() : nullptr;
    scalar_t* ps = score.data_ptr<scalar_t>();
    scalar_t* pg = grad.data_ptr<scalar_t>();
    scalar_t* pf = frame.data_ptr<scalar_t>();
    at::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m)
        forward_row<scalar_t>(pa + m * P, pb + m * P, pw == nullptr ? nullptr : pw + m * P, P, bins,
                              normalize, value_range, ps + m, pg + m * bins * bins, pf + m * 4);
    });
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
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  const at::Tensor w = weight_in.has_value() ? weight_in->contiguous() : at::Tensor();
  const at::Tensor gs = grad_score_in.contiguous(), score = score_in.contiguous();
  const at::Tensor G = grad_joint_in.contiguous(), frame = frame_in.contiguous();
  at::Tensor grad_a = at::empty_like(a), grad_b = at::empty_like(b);
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "simwarp_parzen_bwd", [&] {
    const scalar_t* pw = w.defined() ? w.data_ptr<scalar_t>() : nullptr;
    for (int64_t m = 0; m < M; ++m) {
      const scalar_t s = score.data_ptr<scalar_t>()[m];
      // a row that scored NaN (a non-finite pixel) passes no gradient
      const scalar_t g = s == s ? gs.data_ptr<scalar_t>()[m] : scalar_t(0);
      const scalar_t* pa = a.data_ptr<scalar_t>() + m * P;
      const scalar_t* pb = b.data_ptr<scalar_t>() + m * P;
      const scalar_t* wm = pw == nullptr ? nullptr : pw + m * P;
      const scalar_t* Gm = G.data_ptr<scalar_t>() + m * bins * bins;
      const scalar_t* fm = frame.data_ptr<scalar_t>() + m * 4;
      scalar_t* ga = grad_a.data_ptr<scalar_t>() + m * P;
      scalar_t* gb = grad_b.data_ptr<scalar_t>() + m * P;
      at::parallel_for(0, P, 8192, [&](int64_t p0, int64_t p1) {
        backward_row<scalar_t>(g, Gm, pa + p0, pb + p0, wm == nullptr ? nullptr : wm + p0, fm,
                               p1 - p0, bins, ga + p0, gb + p0);
      });
    }
  });
  return {grad_a, grad_b};
}

}  // namespace cpu
}  // namespace simwarp

TORCH_LIBRARY_IMPL(simwarp, CPU, m) {
  m.impl("parzen_fwd", &simwarp::cpu::parzen_fwd);
  m.impl("parzen_bwd", &simwarp::cpu::parzen_bwd);
}
