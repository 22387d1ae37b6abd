// CPU implementation of simwarp::local_std_fwd / local_std_bwd and their registration: the
// fused local standard deviation of a padded, centered input, valid mode (docs/maths.md §1).
//
// Forward: S1 = x ⋆ 𝟙 and S2 = x² ⋆ 𝟙 (valid) with the squares made on the fly in the
// first pass, then out = local_std_forward(S1, S2) per element. Backward: the per-element
// vjp gives (∂S1, ∂S2), their full-mode window sums are the adjoint correlation, and
// local_std_combine gives ∂x. The per-element maths is include/simwarp/local_std.h, shared
// with the CUDA kernels. In 2D, local_std_2d.h fuses all of it, padding and centering
// included (the local_std_2d_* ops, local_std_2d.cpp); these ops take that route for 2D
// windows, padding "valid".
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <tuple>

#include "box.h"
#include "checks.h"
#include "local_std_2d.h"
#include "simwarp/local_std.h"

namespace simwarp {
namespace cpu {
namespace {

// Valid window sums of v and v² along one row, in double: s1, s2 get n − k + 1 entries.
template <typename In>
inline void row_window_sums(const In* v, int64_t n, int64_t k, double* s1, double* s2) {
  double a1 = 0.0, a2 = 0.0;
  for (int64_t c = 0; c < k; ++c) { const double x = v[c]; a1 += x; a2 += x * x; }
  s1[0] = a1;
  s2[0] = a2;
  for (int64_t c = 1; c < n - k + 1; ++c) {
    const double add = v[c + k - 1], sub = v[c - 1];
    a1 += add - sub;
    a2 += add * add - sub * sub;
    s1[c] = a1;
    s2[c] = a2;
  }
}

// Last-axis window sums of x and x² in one read of x, accumulated and stored as double.
template <typename T>
void box_last_axis_pair(const T* x, double* o1, double* o2, int64_t B, int64_t L, int64_t k) {
  const int64_t n = L - k + 1;
  at::parallel_for(0, B, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) row_window_sums(x + b * L, L, k, o1 + b * n, o2 + b * n);
  });
}

}  // namespace

// xp (..., *P) padded and centered -> (out, S1, flat), each (..., *(P − k + 1)). The sums
// and V = S2 − S1²/N are formed in double whatever the input dtype (docs/maths.md §1.3).
std::tuple<at::Tensor, at::Tensor, at::Tensor> local_std_fwd(const at::Tensor& xp_in,
                                                              at::IntArrayRef window, double eps,
                                                              bool normalized, double flat_factor) {
  checks::local_std_fwd(xp_in, window);
  if (xp_in.numel() == 0)
    return checks::local_std_zeros(checks::window_output_shape(xp_in.sizes(), window, false), xp_in);
  const at::Tensor xp = xp_in.contiguous();
  const int64_t d = static_cast<int64_t>(window.size());
  const int64_t first = xp.dim() - d;
  const int64_t L = xp.size(-1), k = window[d - 1];
  if (d == 2) return local_std_2d_fwd(xp, window, "valid", eps, normalized, flat_factor);
  auto row_sizes = xp.sizes().vec();
  row_sizes.back() = L - k + 1;
  const auto dbl = xp.options().dtype(at::kDouble);
  at::Tensor s1 = at::empty(row_sizes, dbl), s2 = at::empty(row_sizes, dbl);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_rows", [&] {
    box_last_axis_pair<scalar_t>(xp.data_ptr<scalar_t>(), s1.data_ptr<double>(),
                                 s2.data_ptr<double>(), xp.numel() / L, L, k);
  });
  for (int64_t a = d - 2; a >= 0; --a) {
    if (window[a] == 1) continue;
    s1 = box_pass(s1, first + a, window[a], false);
    s2 = box_pass(s2, first + a, window[a], false);
  }
  at::Tensor out = at::empty(s1.sizes(), xp.options());
  at::Tensor s1_out = at::empty(s1.sizes(), xp.options());
  at::Tensor flat = at::empty(s1.sizes(), xp.options().dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_fwd", [&] {
    const double* p1 = s1.data_ptr<double>();
    const double* p2 = s2.data_ptr<double>();
    scalar_t* po = out.data_ptr<scalar_t>();
    scalar_t* ps = s1_out.data_ptr<scalar_t>();
    bool* pf = flat.data_ptr<bool>();
    const double inv_n = 1.0 / static_cast<double>(checks::window_volume(window));
    at::parallel_for(0, out.numel(), 16384, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        po[i] = static_cast<scalar_t>(
            local_std_forward<double>(p1[i], p2[i], inv_n, eps, flat_factor, normalized, pf + i));
        ps[i] = static_cast<scalar_t>(p1[i]);
      }
    });
  });
  return {out, s1_out, flat};
}

at::Tensor local_std_bwd(const at::Tensor& grad_in, const at::Tensor& out_in,
                         const at::Tensor& s1_in, const at::Tensor& flat_in,
                         const at::Tensor& xp_in, at::IntArrayRef window, bool normalized) {
  checks::local_std_bwd(grad_in, out_in, s1_in, flat_in, xp_in, window);
  if (xp_in.numel() == 0) return at::zeros(xp_in.sizes(), xp_in.options());
  const at::Tensor grad = grad_in.contiguous(), xp = xp_in.contiguous();
  const at::Tensor out = out_in.contiguous(), s1 = s1_in.contiguous(), flat = flat_in.contiguous();
  const int64_t d = static_cast<int64_t>(window.size());
  const int64_t first = xp.dim() - d;
  if (d == 2) return local_std_2d_bwd(grad, out, s1, flat, xp, window, "valid", normalized);
  at::Tensor d_s1 = at::empty_like(s1), d_s2 = at::empty_like(s1);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_vjp", [&] {
    const scalar_t *pg = grad.data_ptr<scalar_t>(), *po = out.data_ptr<scalar_t>();
    const scalar_t* p1 = s1.data_ptr<scalar_t>();
    const bool* pf = flat.data_ptr<bool>();
    scalar_t *q1 = d_s1.data_ptr<scalar_t>(), *q2 = d_s2.data_ptr<scalar_t>();
    const scalar_t inv_n = scalar_t(1) / scalar_t(checks::window_volume(window));
    at::parallel_for(0, s1.numel(), 16384, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        local_std_vjp(pg[i], po[i], p1[i], inv_n, normalized, pf[i], q1 + i, q2 + i);
    });
  });
  // The adjoint of a valid window sum is the full-mode sum with the flipped window; a box
  // is its own flip, so it is the same running sum with k − 1 zeros on each side.
  at::Tensor a = d_s1, b = d_s2;
  for (int64_t ax = d - 1; ax >= 0; --ax) {
    if (window[ax] == 1) continue;
    a = box_pass(a, first + ax, window[ax], true);
    b = box_pass(b, first + ax, window[ax], true);
  }
  at::Tensor dx = at::empty_like(xp);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_combine", [&] {
    const scalar_t *pa = a.data_ptr<scalar_t>(), *pb = b.data_ptr<scalar_t>(), *px = xp.data_ptr<scalar_t>();
    scalar_t* pd = dx.data_ptr<scalar_t>();
    at::parallel_for(0, dx.numel(), 16384, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) pd[i] = local_std_combine(pa[i], pb[i], px[i]);
    });
  });
  return dx;
}

}  // namespace cpu
}  // namespace simwarp

TORCH_LIBRARY_IMPL(simwarp, CPU, m) {
  m.impl("local_std_fwd", &simwarp::cpu::local_std_fwd);
  m.impl("local_std_bwd", &simwarp::cpu::local_std_bwd);
}
