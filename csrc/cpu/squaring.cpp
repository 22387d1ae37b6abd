// CPU implementation of simwarp::squaring_fwd / squaring_bwd and their registration: the
// whole scaling-and-squaring chain (docs/maths.md §8.3) as one op each way.
//
// Forward: gathers only, all pixels in parallel, one pass per squaring. Backward: from the
// last squaring to the first, each field's pixels in index order (fields in parallel), so
// the scatter into the sampled corners is serial and the result bitwise the same on every
// run whatever the thread count. The per-pixel maths is include/simwarp/squaring.h, shared
// with the CUDA kernels.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "checks.h"
#include "simwarp/squaring.h"

namespace simwarp {
namespace cpu {
namespace {

// One squaring of every field of src (N, D, P) times scale into out; `scaled`, when not
// null, gets the scaled fields.
template <typename T, int D>
void forward_step(const T* src, T* out, int64_t N, int64_t P, const int64_t* size,
                  SquaringScale<T> scale, T* scaled) {
  at::parallel_for(0, N * P, 4096, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / P, i = t % P;
      squaring_forward_pixel<T, D>(src + n * D * P, out + n * D * P, i, P, size, scale,
                                   scaled == nullptr ? nullptr : scaled + n * D * P);
    }
  });
}

template <typename T, int D>
void backward_step(const T* a, const T* u, T* into, int64_t N, int64_t P, const int64_t* size,
                   SquaringScale<T> scale) {
  at::parallel_for(0, N, 1, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      T* dst = into + n * D * P;
      auto add = [dst](int64_t j, T v) { dst[j] += v; };
      for (int64_t i = 0; i < P; ++i)
        squaring_backward_pixel<T, D>(a + n * D * P, u + n * D * P, dst, i, P, size, add, scale);
    }
  });
}

// The squarings of u = scale · v: squaring k into buffers[k], the first one's input u into
// saved0 where it is not null.
template <typename T>
void run_forward(const T* v, SquaringScale<T> scale, T* saved0, T* const* buffers,
                 int64_t steps, int64_t D, int64_t N, int64_t P, const int64_t* size) {
  const T* src = v;
  for (int64_t k = 0; k < steps; ++k) {
    T* dst = buffers[k];
    const SquaringScale<T> s = k == 0 ? scale : SquaringScale<T>{};
    T* scaled = k == 0 ? saved0 : nullptr;
    if (D == 2) forward_step<T, 2>(src, dst, N, P, size, s, scaled);
    else forward_step<T, 3>(src, dst, N, P, size, s, scaled);
    src = dst;
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> squaring_fwd(const at::Tensor& u_in,
                                                at::ArrayRef<double> scale, int64_t steps,
                                                bool keep) {
  checks::squaring_fwd(u_in, scale, steps);
  const at::Tensor u = u_in.contiguous();
  at::Tensor saved = at::empty(checks::squaring_saved_shape(u.sizes(), keep ? steps : 0), u.options());
  if (u.numel() == 0 || steps == 0) return {checks::squaring_scaled_copy(u, scale), saved};  // saved: empty or no field
  const int64_t D = u.dim() - 2, N = u.size(0);
  int64_t size[3] = {1, 1, 1}, P = 1;
  for (int64_t k = 0; k < D; ++k) { size[k] = u.size(2 + k); P *= size[k]; }
  // Squaring k < steps − 1 goes to saved[k + 1] (keep) or, ping-pong, to out and spare;
  // the last one to out.
  at::Tensor out = at::empty_like(u);
  at::Tensor spare = !keep && steps > 1 ? at::empty_like(u) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "simwarp_squaring_fwd", [&] {
    std::vector<scalar_t*> buffers(steps);
    const int64_t field = N * D * P;
    for (int64_t k = 0; k < steps; ++k) {
      if (k == steps - 1) buffers[k] = out.data_ptr<scalar_t>();
      else if (keep) buffers[k] = saved.data_ptr<scalar_t>() + (k + 1) * field;
      else  // ping-pong, the last squaring writing `out`
        buffers[k] = ((steps - 1 - k) % 2 == 0 ? out : spare).data_ptr<scalar_t>();
    }
    // the first squaring writes its input u = scale · v into saved[0] (keep)
    run_forward<scalar_t>(u.data_ptr<scalar_t>(), squaring_scale<scalar_t>(scale.data(), scale.size()),
                          keep ? saved.data_ptr<scalar_t>() : nullptr, buffers.data(), steps,
                          D, N, P, size);
  });
  return {out, saved};
}

at::Tensor squaring_bwd(const at::Tensor& grad_in, const at::Tensor& saved_in,
                        at::ArrayRef<double> scale, const std::optional<at::Tensor>& base) {
  checks::squaring_bwd(grad_in, saved_in, scale, base);
  const int64_t steps = saved_in.size(0);
  at::Tensor a = grad_in.contiguous();
  const bool has_base = base.has_value() && base->defined();
  if (a.numel() == 0 || steps == 0)
    return checks::squaring_scaled_copy(has_base ? a + *base : a, scale);
  const at::Tensor saved = saved_in.contiguous();
  const int64_t D = a.dim() - 2, N = a.size(0);
  int64_t size[3] = {1, 1, 1}, P = 1;
  for (int64_t k = 0; k < D; ++k) { size[k] = a.size(2 + k); P *= size[k]; }
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "simwarp_squaring_bwd", [&] {
    const int64_t field = N * D * P;
    for (int64_t k = steps - 1; k >= 0; --k) {
      // the first squaring's gradient starts from the base's, times the scale as the
      // shares added to it
      at::Tensor into = k == 0 && has_base ? checks::squaring_scaled_copy(base->contiguous(), scale)
                                           : at::zeros_like(a);
      const scalar_t* u = saved.data_ptr<scalar_t>() + k * field;
      // the first squaring's gradient, with respect to v: times the scale
      const SquaringScale<scalar_t> s = k == 0 ? squaring_scale<scalar_t>(scale.data(), scale.size()) : SquaringScale<scalar_t>{};
      if (D == 2)
        backward_step<scalar_t, 2>(a.data_ptr<scalar_t>(), u, into.data_ptr<scalar_t>(), N, P, size, s);
      else
        backward_step<scalar_t, 3>(a.data_ptr<scalar_t>(), u, into.data_ptr<scalar_t>(), N, P, size, s);
      a = into;
    }
  });
  return a;
}

}  // namespace cpu
}  // namespace simwarp

TORCH_LIBRARY_IMPL(simwarp, CPU, m) {
  m.impl("squaring_fwd", &simwarp::cpu::squaring_fwd);
  m.impl("squaring_bwd", &simwarp::cpu::squaring_bwd);
}
