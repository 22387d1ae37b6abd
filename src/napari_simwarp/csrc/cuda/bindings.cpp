// CUDA implementations of the simwarp ops: thin wrappers that check tensors, allocate
// outputs and call the launchers in cuda/*.cu on the current stream. Built only where
// torch has CUDA and nvcc is found.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "launch.h"

namespace simwarp {
namespace cuda {
namespace {

void check(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, ": ", cudaGetErrorString(err));
}

struct Lines {
  int64_t B, L, R;
};

Lines lines_of(const at::Tensor& x, int64_t dim) {
  Lines l{1, x.size(dim), 1};
  for (int64_t d = 0; d < dim; ++d) l.B *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) l.R *= x.size(d);
  return l;
}

at::Tensor box_pass(const at::Tensor& x, int64_t dim, int64_t k, bool full) {
  const Lines l = lines_of(x, dim);
  const int64_t pad = full ? k - 1 : 0;
  const int64_t n_out = full ? l.L + k - 1 : l.L - k + 1;
  auto sizes = x.sizes().vec();
  sizes[dim] = n_out;
  auto out = at::empty(sizes, x.options());
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "simwarp_box_pass_cuda", [&] {
    check(launch_box_axis<scalar_t>(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), l.B, l.L,
                                    l.R, k, pad, n_out, stream),
          "box_sum");
  });
  return out;
}

int64_t window_volume(at::IntArrayRef window) {
  int64_t n = 1;
  for (auto w : window) n *= w;
  return n;
}

}  // namespace

at::Tensor box_sum(const at::Tensor& x, at::IntArrayRef window, bool full) {
  TORCH_CHECK(x.is_floating_point(), "box_sum: x must be float32 or float64");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t first = x.dim() - static_cast<int64_t>(window.size());
  at::Tensor cur = x.contiguous();
  for (int64_t a = static_cast<int64_t>(window.size()) - 1; a >= 0; --a) {
    TORCH_CHECK(full || window[a] <= cur.size(first + a), "box_sum: window larger than the axis");
    if (window[a] > 1) cur = box_pass(cur, first + a, window[a], full);
  }
  return cur.is_same(x) ? x.clone() : cur;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> local_std_fwd(const at::Tensor& xp_in,
                                                              at::IntArrayRef window, double eps,
                                                              bool normalized) {
  const c10::cuda::CUDAGuard guard(xp_in.device());
  const at::Tensor xp = xp_in.contiguous();
  const int64_t d = static_cast<int64_t>(window.size()), first = xp.dim() - d;
  const int64_t last = xp.dim() - 1, k = window[d - 1];
  const Lines l = lines_of(xp, last);
  auto sizes = xp.sizes().vec();
  sizes.back() = l.L - k + 1;
  at::Tensor s1 = at::empty(sizes, xp.options()), s2 = at::empty(sizes, xp.options());
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_rows_cuda", [&] {
    check(launch_box_axis_squares<scalar_t>(xp.data_ptr<scalar_t>(), s1.data_ptr<scalar_t>(),
                                            s2.data_ptr<scalar_t>(), l.B, l.L, l.R, k, stream),
          "local_std_fwd");
  });
  for (int64_t a = d - 2; a >= 0; --a) {
    if (window[a] == 1) continue;
    s1 = box_pass(s1, first + a, window[a], false);
    s2 = box_pass(s2, first + a, window[a], false);
  }
  at::Tensor out = at::empty_like(s1);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_fwd_cuda", [&] {
    check(launch_local_std_forward<scalar_t>(
              s1.data_ptr<scalar_t>(), s2.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
              out.numel(), scalar_t(1) / scalar_t(window_volume(window)),
              static_cast<scalar_t>(eps), normalized, stream),
          "local_std_fwd");
  });
  return {out, s1, s2};
}

at::Tensor local_std_bwd(const at::Tensor& grad_in, const at::Tensor& out, const at::Tensor& s1,
                         const at::Tensor& s2, const at::Tensor& xp_in, at::IntArrayRef window,
                         bool normalized) {
  const c10::cuda::CUDAGuard guard(xp_in.device());
  const at::Tensor grad = grad_in.contiguous(), xp = xp_in.contiguous();
  const int64_t d = static_cast<int64_t>(window.size()), first = xp.dim() - d;
  at::Tensor a = at::empty_like(s1), b = at::empty_like(s1);
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_vjp_cuda", [&] {
    check(launch_local_std_vjp<scalar_t>(
              grad.data_ptr<scalar_t>(), out.contiguous().data_ptr<scalar_t>(),
              s1.contiguous().data_ptr<scalar_t>(), s2.contiguous().data_ptr<scalar_t>(),
              a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), s1.numel(),
              scalar_t(1) / scalar_t(window_volume(window)), normalized, stream),
          "local_std_bwd");
  });
  for (int64_t ax = d - 1; ax >= 0; --ax) {
    if (window[ax] == 1) continue;
    a = box_pass(a, first + ax, window[ax], true);
    b = box_pass(b, first + ax, window[ax], true);
  }
  at::Tensor dx = at::empty_like(xp);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "simwarp_local_std_combine_cuda", [&] {
    check(launch_local_std_combine<scalar_t>(a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
                                             xp.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(),
                                             dx.numel(), stream),
          "local_std_bwd");
  });
  return dx;
}

at::Tensor correlate(const at::Tensor& x_in, at::ArrayRef<double> taps, at::IntArrayRef sizes,
                     bool transpose) {
  TORCH_CHECK(x_in.is_floating_point(), "correlate: x must be float32 or float64");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const int64_t first = x_in.dim() - static_cast<int64_t>(sizes.size());
  at::Tensor all_taps = at::tensor(std::vector<double>(taps.begin(), taps.end()),
                                   x_in.options().dtype(at::kDouble).device(at::kCPU))
                            .to(x_in.options());
  at::Tensor cur = x_in.contiguous();
  auto stream = at::cuda::getCurrentCUDAStream();
  int64_t offset = 0;
  for (int64_t a = 0; a < static_cast<int64_t>(sizes.size()); ++a) {
    const int64_t k = sizes[a], dim = first + a;
    const Lines l = lines_of(cur, dim);
    TORCH_CHECK(k >= 1 && (transpose || k <= l.L), "correlate: window larger than the axis");
    const int64_t n_out = transpose ? l.L + k - 1 : l.L - k + 1;
    auto out_sizes = cur.sizes().vec();
    out_sizes[dim] = n_out;
    at::Tensor out = at::empty(out_sizes, cur.options());
    AT_DISPATCH_FLOATING_TYPES(cur.scalar_type(), "simwarp_correlate_cuda", [&] {
      check(launch_correlate_axis<scalar_t>(cur.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                                            all_taps.data_ptr<scalar_t>() + offset, l.B, l.L, l.R,
                                            k, transpose, n_out, stream),
            "correlate");
    });
    cur = out;
    offset += k;
  }
  return cur.is_same(x_in) ? x_in.clone() : cur;
}

}  // namespace cuda
}  // namespace simwarp

TORCH_LIBRARY_IMPL(simwarp, CUDA, m) {
  m.impl("correlate", &simwarp::cuda::correlate);
  m.impl("box_sum", &simwarp::cuda::box_sum);
  m.impl("local_std_fwd", &simwarp::cuda::local_std_fwd);
  m.impl("local_std_bwd", &simwarp::cuda::local_std_bwd);
}
