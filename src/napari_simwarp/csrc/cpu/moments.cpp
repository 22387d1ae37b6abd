// CPU implementation of simwarp::moments5: the five windowed moments of two images
// (W⋆a, W⋆b, W⋆a², W⋆b², W⋆ab), the forward of SSIM and local NCC (SPEC §2, §5).
//
// The first (last-axis) pass reads a and b once per line, forms the three products in a
// line buffer and writes all five filtered lines; the other axes are plain separable
// passes over the five maps. The products never exist as full maps.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "correlate_axis.h"

namespace simwarp {
namespace cpu {
namespace {

template <typename T>
void moments_last_axis(const T* a, const T* b, T* out, int64_t lines, int64_t L,
                       const std::vector<T>& w) {
  const int64_t k = static_cast<int64_t>(w.size()), n = L - k + 1;
  const int64_t plane = lines * n;  // one moment's output size
  at::parallel_for(0, lines, 16, [&](int64_t l0, int64_t l1) {
    std::vector<T> aa(L), bb(L), ab(L);
    for (int64_t l = l0; l < l1; ++l) {
      const T* al = a + l * L;
      const T* bl = b + l * L;
      for (int64_t i = 0; i < L; ++i) {
        aa[i] = al[i] * al[i];
        bb[i] = bl[i] * bl[i];
        ab[i] = al[i] * bl[i];
      }
      const T* src[5] = {al, bl, aa.data(), bb.data(), ab.data()};
      for (int m = 0; m < 5; ++m) {
        T* o = out + m * plane + l * n;
        std::fill(o, o + n, T(0));
        for (int64_t j = 0; j < k; ++j) {
          const T wj = w[j];
          const T* s = src[m] + j;
          for (int64_t i = 0; i < n; ++i) o[i] += wj * s[i];
        }
      }
    }
  });
}

}  // namespace

// centred: (2, ...lead, *P) = [a, b] padded; returns (5, ...lead, *(P − k + 1)).
at::Tensor moments5(const at::Tensor& centred_in, at::ArrayRef<double> taps, at::IntArrayRef sizes) {
  TORCH_CHECK(centred_in.is_floating_point(), "moments5: centred must be float32 or float64");
  TORCH_CHECK(centred_in.size(0) == 2, "moments5: centred must stack [a, b] on dim 0");
  const at::Tensor centred = centred_in.contiguous();
  const int64_t d = static_cast<int64_t>(sizes.size());
  const int64_t first = centred.dim() - d;
  const int64_t L = centred.size(-1), k_last = sizes[d - 1];
  TORCH_CHECK(k_last <= L, "moments5: window larger than the axis");
  const int64_t per_image = centred.numel() / 2;
  const int64_t lines = per_image / L;
  auto out_sizes = centred.sizes().vec();
  out_sizes[0] = 5;
  out_sizes.back() = L - k_last + 1;
  at::Tensor cur = at::empty(out_sizes, centred.options());
  int64_t offset = 0;
  for (int64_t a = 0; a < d - 1; ++a) offset += sizes[a];
  AT_DISPATCH_FLOATING_TYPES(centred.scalar_type(), "simwarp_moments5", [&] {
    std::vector<scalar_t> w(taps.begin() + offset, taps.begin() + offset + k_last);
    const scalar_t* base = centred.data_ptr<scalar_t>();
    moments_last_axis<scalar_t>(base, base + per_image, cur.data_ptr<scalar_t>(), lines, L, w);
  });
  offset = 0;
  for (int64_t a = 0; a < d - 1; ++a) {  // the leading axes: plain passes over the five maps
    const int64_t k = sizes[a], dim = first + a;
    const int64_t La = cur.size(dim);
    TORCH_CHECK(k <= La, "moments5: window larger than the axis");
    int64_t B = 1, R = 1;
    for (int64_t q = 0; q < dim; ++q) B *= cur.size(q);
    for (int64_t q = dim + 1; q < cur.dim(); ++q) R *= cur.size(q);
    auto sz = cur.sizes().vec();
    sz[dim] = La - k + 1;
    at::Tensor next = at::empty(sz, cur.options());
    AT_DISPATCH_FLOATING_TYPES(cur.scalar_type(), "simwarp_moments5_axis", [&] {
      std::vector<scalar_t> w(taps.begin() + offset, taps.begin() + offset + k);
      correlate_axis<scalar_t>(cur.data_ptr<scalar_t>(), next.data_ptr<scalar_t>(), B, La, R, w,
                               false, La - k + 1);
    });
    cur = next;
    offset += k;
  }
  return cur;
}

}  // namespace cpu
}  // namespace simwarp

TORCH_LIBRARY_IMPL(simwarp, CPU, m) { m.impl("moments5", &simwarp::cpu::moments5); }
