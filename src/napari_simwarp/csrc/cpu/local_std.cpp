// CPU implementation of the fused local standard deviation (SPEC §1).
//
// Forward: S1 = x ⋆ 𝟙 and S2 = x² ⋆ 𝟙 (valid) with the squares made on the fly in the
// first pass, then out = local_std_forward(S1, S2) per element. Backward: the per-element
// vjp gives (∂S1, ∂S2), their full-mode window sums are the adjoint correlation, and
// local_std_combine gives ∂x. The per-element maths is include/simwarp/local_std.h, shared
// with the CUDA kernels.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <tuple>

#include "box.h"
#include "simwarp/local_std.h"

namespace simwarp {
namespace cpu {

at::Tensor box_pass(const at::Tensor& x, int64_t dim, int64_t k, bool full);

namespace {

// Last-axis window sums of x and x² in one read of x.
template <typename T>
void box_last_axis_pair(const T* x, T* o1, T* o2, int64_t B, int64_t L, int64_t k) {
  const int64_t n = L - k + 1;
  at::parallel_for(0, B, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const T* xl = x + b * L;
      T* l1 = o1 + b * n;
      T* l2 = o2 + b * n;
      double s1 = 0.0, s2 = 0.0;
      for (int64_t j = 0; j < k; ++j) { const double v = xl[j]; s1 += v; s2 += v * v; }
      l1[0] = static_cast<T>(s1);
      l2[0] = static_cast<T>(s2);
      for (int64_t i = 1; i < n; ++i) {
        const double a = xl[i + k - 1], s = xl[i - 1];
        s1 += a - s;
        s2 += a * a - s * s;
        l1[i] = static_cast<T>(s1);
        l2[i] = static_cast<T>(s2);
      }
    }
  });
}

at::Tensor box_leading_axes(at::Tensor t, int64_t first, at::IntArrayRef window, bool full) {
  // Every windowed axis but the last (the last is done by the caller).
  for (int64_t a = static_cast<int64_t>(window.size()) - 2; a >= 0; --a) {
    if (window[a] > 1) t = box_pass(t, first + a, window[a], full);
  }
  return t;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> local_std_fwd(const at::Tensor& xp_in,
                                                              at::IntArrayRef window, double eps,
                                                              bool normalized) {
  TORCH_CHECK(xp_in.is_floating_point(), "local_std_fwd: xp must be float32 or float64");
  const at::Tensor xp = xp_in.contiguous();
  const int64_t d = static_cast<int64_t>(window.size());
  const int64_t first = xp.dim() - d;
  const int64_t L = xp.size(-1), k = window[d - 1];
  TORCH_CHECK(k <= L, "local_std_fwd: window larger than the padded input");
  auto row_sizes = xp.sizes().vec();
  row_sizes.back() = L - k + 1;
  at::Tensor r1 = at::empty(row_sizes, xp.options()), r2 = at::empty(row_sizes, xp.options());
  int64_t n_window = 1;
  for (auto w : window) n_window *= w;
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_rows", [&] {
    box_last_axis_pair<scalar_t>(xp.data_ptr<scalar_t>(), r1.data_ptr<scalar_t>(),
                                 r2.data_ptr<scalar_t>(), xp.numel() / L, L, k);
  });
  at::Tensor s1 = box_leading_axes(r1, first, window, false);
  at::Tensor s2 = box_leading_axes(r2, first, window, false);
  at::Tensor out = at::empty_like(s1);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_fwd", [&] {
    const scalar_t* p1 = s1.data_ptr<scalar_t>();
    const scalar_t* p2 = s2.data_ptr<scalar_t>();
    scalar_t* po = out.data_ptr<scalar_t>();
    const scalar_t inv_n = scalar_t(1) / scalar_t(n_window), e = static_cast<scalar_t>(eps);
    at::parallel_for(0, out.numel(), 16384, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) po[i] = local_std_forward(p1[i], p2[i], inv_n, e, normalized);
    });
  });
  return {out, s1, s2};
}

at::Tensor local_std_bwd(const at::Tensor& grad_in, const at::Tensor& out, const at::Tensor& s1,
                         const at::Tensor& s2, const at::Tensor& xp_in, at::IntArrayRef window,
                         bool normalized) {
  const at::Tensor grad = grad_in.contiguous(), xp = xp_in.contiguous();
  const int64_t d = static_cast<int64_t>(window.size());
  const int64_t first = xp.dim() - d;
  int64_t n_window = 1;
  for (auto w : window) n_window *= w;
  at::Tensor d_s1 = at::empty_like(s1), d_s2 = at::empty_like(s1);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_vjp", [&] {
    const scalar_t *pg = grad.data_ptr<scalar_t>(), *po = out.data_ptr<scalar_t>();
    const scalar_t *p1 = s1.data_ptr<scalar_t>(), *p2 = s2.data_ptr<scalar_t>();
    scalar_t *q1 = d_s1.data_ptr<scalar_t>(), *q2 = d_s2.data_ptr<scalar_t>();
    const scalar_t inv_n = scalar_t(1) / scalar_t(n_window);
    at::parallel_for(0, s1.numel(), 16384, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        local_std_vjp(pg[i], po[i], p1[i], p2[i], inv_n, normalized, q1 + i, q2 + i);
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
