// CPU implementation of simwarp::correlate: separable correlation over the trailing axes
// (valid mode) and its transpose, with arbitrary taps per axis.
//
// Why not the per-element functions of include/simwarp/correlate.h here: on CPU the
// same sums run tap-major over whole contiguous rows, which the compiler vectorises (the
// CUDA kernels call the per-element form; both compute Σ_j w[j] x[i + j] in the same
// order, and the tests hold the CPU result to the float64 reference).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

namespace simwarp {
namespace cpu {
namespace {

// Along L of a contiguous (B, L, R) array. valid: n_out = L − k + 1; transpose: L + k − 1.
template <typename T>
void correlate_axis(const T* x, T* out, int64_t B, int64_t L, int64_t R, const std::vector<T>& w,
                    bool transpose, int64_t n_out) {
  const int64_t k = static_cast<int64_t>(w.size());
  if (R == 1) {
    at::parallel_for(0, B, 16, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const T* xl = x + b * L;
        T* ol = out + b * n_out;
        std::fill(ol, ol + n_out, T(0));
        for (int64_t j = 0; j < k; ++j) {
          const T wj = w[j];
          if (!transpose) {
            const T* src = xl + j;
            for (int64_t i = 0; i < n_out; ++i) ol[i] += wj * src[i];
          } else {
            T* dst = ol + j;  // out[m] += w[j] · y[m − j]  ⇔  out[i + j] += w[j] · y[i]
            for (int64_t i = 0; i < L; ++i) dst[i] += wj * xl[i];
          }
        }
      }
    });
    return;
  }
  // Inner axes: each output row is a weighted sum of k whole input rows (contiguous in R).
  constexpr int64_t kChunk = 1024;
  const int64_t chunks = (R + kChunk - 1) / kChunk;
  at::parallel_for(0, B * n_out * chunks, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c = t % chunks, rest = t / chunks;
      const int64_t i = rest % n_out, b = rest / n_out;
      const int64_t c0 = c * kChunk, cw = std::min(R, c0 + kChunk) - c0;
      T* orow = out + (b * n_out + i) * R + c0;
      std::fill(orow, orow + cw, T(0));
      const T* xb = x + b * L * R + c0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t src = transpose ? i - j : i + j;
        if (src < 0 || src >= L) continue;
        const T wj = w[j];
        const T* irow = xb + src * R;
        for (int64_t r = 0; r < cw; ++r) orow[r] += wj * irow[r];
      }
    }
  });
}

}  // namespace

at::Tensor correlate(const at::Tensor& x_in, at::ArrayRef<double> taps, at::IntArrayRef sizes,
                     bool transpose) {
  TORCH_CHECK(x_in.is_floating_point(), "correlate: x must be float32 or float64");
  int64_t total = 0;
  for (auto s : sizes) total += s;
  TORCH_CHECK(total == static_cast<int64_t>(taps.size()), "correlate: taps must hold sum(sizes) values");
  TORCH_CHECK(static_cast<int64_t>(sizes.size()) <= x_in.dim(), "correlate: too many axes");
  const int64_t first = x_in.dim() - static_cast<int64_t>(sizes.size());
  at::Tensor cur = x_in.contiguous();
  int64_t offset = 0;
  for (int64_t a = 0; a < static_cast<int64_t>(sizes.size()); ++a) {
    const int64_t k = sizes[a], dim = first + a;
    const int64_t L = cur.size(dim);
    TORCH_CHECK(k >= 1 && (transpose || k <= L), "correlate: window larger than the axis");
    int64_t B = 1, R = 1;
    for (int64_t d = 0; d < dim; ++d) B *= cur.size(d);
    for (int64_t d = dim + 1; d < cur.dim(); ++d) R *= cur.size(d);
    const int64_t n_out = transpose ? L + k - 1 : L - k + 1;
    auto out_sizes = cur.sizes().vec();
    out_sizes[dim] = n_out;
    at::Tensor out = at::empty(out_sizes, cur.options());
    AT_DISPATCH_FLOATING_TYPES(cur.scalar_type(), "simwarp_correlate", [&] {
      std::vector<scalar_t> w(taps.begin() + offset, taps.begin() + offset + k);
      correlate_axis<scalar_t>(cur.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), B, L, R, w,
                               transpose, n_out);
    });
    cur = out;
    offset += k;
  }
  return cur.is_same(x_in) ? x_in.clone() : cur;
}

}  // namespace cpu
}  // namespace simwarp

TORCH_LIBRARY_IMPL(simwarp, CPU, m) { m.impl("correlate", &simwarp::cpu::correlate); }
