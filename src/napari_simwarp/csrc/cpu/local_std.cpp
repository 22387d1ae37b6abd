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
#include "local_std_2d.h"
#include "simwarp/local_std.h"

namespace simwarp {
namespace cpu {

at::Tensor box_pass(const at::Tensor& x, int64_t dim, int64_t k, bool full);

namespace {

// Last-axis window sums of x and x² in one read of x, accumulated and stored as double.
template <typename T>
void box_last_axis_pair(const T* x, double* o1, double* o2, int64_t B, int64_t L, int64_t k) {
  const int64_t n = L - k + 1;
  at::parallel_for(0, B, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) row_window_sums(x + b * L, L, k, o1 + b * n, o2 + b * n);
  });
}

int64_t window_volume(at::IntArrayRef window) {
  int64_t n = 1;
  for (auto w : window) n *= w;
  return n;
}

}  // namespace

// xp (..., *P) padded and centred -> (out, S1, flat), each (..., *(P − k + 1)). The sums
// and V = S2 − S1²/N are formed in double whatever the input dtype (SPEC §1 "Numerics").
std::tuple<at::Tensor, at::Tensor, at::Tensor> local_std_fwd(const at::Tensor& xp_in,
                                                              at::IntArrayRef window, double eps,
                                                              bool normalized, double flat_factor) {
  TORCH_CHECK(xp_in.is_floating_point(), "local_std_fwd: xp must be float32 or float64");
  const at::Tensor xp = xp_in.contiguous();
  const int64_t d = static_cast<int64_t>(window.size());
  const int64_t first = xp.dim() - d;
  const int64_t L = xp.size(-1), k = window[d - 1];
  TORCH_CHECK(k <= L, "local_std_fwd: window larger than the padded input");
  if (d == 2) {  // the fused single-pass route (local_std_2d.h)
    TORCH_CHECK(window[0] <= xp.size(-2), "local_std_fwd: window larger than the padded input");
    auto sizes = xp.sizes().vec();
    sizes[sizes.size() - 2] -= window[0] - 1;
    sizes.back() -= k - 1;
    at::Tensor out = at::empty(sizes, xp.options()), s1 = at::empty(sizes, xp.options());
    at::Tensor flat = at::empty(sizes, xp.options().dtype(at::kBool));
    const int64_t Hp = xp.size(-2);
    AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_2d", [&] {
      local_std_2d_forward<scalar_t>(xp.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                                     s1.data_ptr<scalar_t>(), flat.data_ptr<bool>(),
                                     xp.numel() / (Hp * L), Hp, L, window[0], k, eps, flat_factor,
                                     normalized);
    });
    return {out, s1, flat};
  }
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
    const double inv_n = 1.0 / static_cast<double>(window_volume(window));
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
  const at::Tensor grad = grad_in.contiguous(), xp = xp_in.contiguous();
  const at::Tensor out = out_in.contiguous(), s1 = s1_in.contiguous(), flat = flat_in.contiguous();
  const int64_t d = static_cast<int64_t>(window.size());
  const int64_t first = xp.dim() - d;
  if (d == 2) {  // the fused single-pass route (local_std_2d.h)
    at::Tensor dx = at::empty_like(xp);
    const int64_t Hp = xp.size(-2), Wp = xp.size(-1);
    AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_2d_bwd", [&] {
      local_std_2d_backward<scalar_t>(grad.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                                      s1.data_ptr<scalar_t>(), flat.data_ptr<bool>(),
                                      xp.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(),
                                      xp.numel() / (Hp * Wp), Hp, Wp, window[0], window[1],
                                      normalized);
    });
    return dx;
  }
  at::Tensor d_s1 = at::empty_like(s1), d_s2 = at::empty_like(s1);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_vjp", [&] {
    const scalar_t *pg = grad.data_ptr<scalar_t>(), *po = out.data_ptr<scalar_t>();
    const scalar_t* p1 = s1.data_ptr<scalar_t>();
    const bool* pf = flat.data_ptr<bool>();
    scalar_t *q1 = d_s1.data_ptr<scalar_t>(), *q2 = d_s2.data_ptr<scalar_t>();
    const scalar_t inv_n = scalar_t(1) / scalar_t(window_volume(window));
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
