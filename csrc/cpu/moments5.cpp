// CPU implementation of simwarp::moments5 and its registration: the five windowed moments
// of two images (W⋆a, W⋆b, W⋆a², W⋆b², W⋆ab), the engine of SSIM and local NCC
// (docs/maths.md §5.2; local NCC §2.2).
//
// The first (last-axis) pass reads a and b once per line, forms the three products in a
// line buffer and writes all five filtered lines; the other axes are plain separable
// passes over the five maps. The products never exist as full maps. In 2D the two passes
// are fused per band of rows (moments_2d), so no intermediate map exists at all.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "checks.h"
#include "correlate_axis.h"

namespace simwarp {
namespace cpu {
namespace {

// The five products of one line pair in line buffers: a², b², ab (a and b are read
// in place).
template <typename T>
inline void line_products(const T* a, const T* b, int64_t L, T* aa, T* bb, T* ab) {
  for (int64_t i = 0; i < L; ++i) {
    aa[i] = a[i] * a[i];
    bb[i] = b[i] * b[i];
    ab[i] = a[i] * b[i];
  }
}

template <typename T>
void moments_last_axis(const T* a, const T* b, T* out, int64_t lines, int64_t L,
                       const std::vector<T>& w) {
  const int64_t k = static_cast<int64_t>(w.size()), n = L - k + 1;
  const int64_t plane = lines * n;  // one moment's output size
  at::parallel_for(0, lines, 16, [&](int64_t l0, int64_t l1) {
    std::vector<T> aa(L), bb(L), ab(L);
    std::vector<const T*> shifted(k);
    for (int64_t l = l0; l < l1; ++l) {
      const T* al = a + l * L;
      const T* bl = b + l * L;
      line_products(al, bl, L, aa.data(), bb.data(), ab.data());
      const T* src[5] = {al, bl, aa.data(), bb.data(), ab.data()};
      for (int m = 0; m < 5; ++m) correlate_line(src[m], w, n, out + m * plane + l * n, shifted);
    }
  });
}

// 2D: both passes fused per band of output rows. The row pass of each input row goes
// into a ring of the last kh rows (5 maps each), and each output row is the column pass
// over the ring, so no full-size intermediate map exists (the separate passes wrote and
// re-read five of them). Same sums in the same order as the separate passes.
constexpr int64_t kMomentBandRows = 64;

template <typename T>
void moments_2d(const T* a, const T* b, T* out, int64_t B, int64_t Hp, int64_t Wp,
                const std::vector<T>& wh, const std::vector<T>& ww) {
  const int64_t kh = static_cast<int64_t>(wh.size()), kw = static_cast<int64_t>(ww.size());
  const int64_t H = Hp - kh + 1, W = Wp - kw + 1, plane = B * H * W;
  const int64_t bands = (H + kMomentBandRows - 1) / kMomentBandRows;
  at::parallel_for(0, B * bands, 1, [&](int64_t t0, int64_t t1) {
    std::vector<T> aa(Wp), bb(Wp), ab(Wp), ring(kh * 5 * W);
    std::vector<const T*> shifted(kw), rows(kh);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t img = t / bands, r0 = (t % bands) * kMomentBandRows;
      const int64_t r1 = std::min(H, r0 + kMomentBandRows);
      for (int64_t j = r0; j < r1 + kh - 1; ++j) {  // input rows of the band
        const T* al = a + (img * Hp + j) * Wp;
        const T* bl = b + (img * Hp + j) * Wp;
        line_products(al, bl, Wp, aa.data(), bb.data(), ab.data());
        const T* src[5] = {al, bl, aa.data(), bb.data(), ab.data()};
        T* slot = ring.data() + (j % kh) * 5 * W;
        for (int m = 0; m < 5; ++m) correlate_line(src[m], ww, W, slot + m * W, shifted);
        if (j < r0 + kh - 1) continue;
        const int64_t i = j - kh + 1;  // output row i: column pass over input rows i .. j
        for (int m = 0; m < 5; ++m) {
          for (int64_t q = 0; q < kh; ++q) rows[q] = ring.data() + ((i + q) % kh) * 5 * W + m * W;
          weighted_rows(rows.data(), wh.data(), kh, W, out + m * plane + (img * H + i) * W);
        }
      }
    }
  });
}

}  // namespace

// centered: (2, ...lead, *P) = [a, b] padded; returns (5, ...lead, *(P − k + 1)).
at::Tensor moments5(const at::Tensor& centered_in, at::ArrayRef<double> taps, at::IntArrayRef sizes) {
  checks::moments5(centered_in, taps, sizes);
  if (centered_in.numel() == 0)
    return at::zeros(checks::moments5_shape(centered_in.sizes(), sizes), centered_in.options());
  const at::Tensor centered = centered_in.contiguous();
  const int64_t d = static_cast<int64_t>(sizes.size());
  const int64_t first = centered.dim() - d;
  const int64_t L = centered.size(-1), k_last = sizes[d - 1];
  const int64_t per_image = centered.numel() / 2;
  const int64_t lines = per_image / L;
  auto out_sizes = centered.sizes().vec();
  out_sizes[0] = 5;
  out_sizes.back() = L - k_last + 1;
  if (d == 2) {  // the fused route
    const int64_t Hp = centered.size(-2), kh = sizes[0];
    out_sizes[out_sizes.size() - 2] = Hp - kh + 1;
    at::Tensor out = at::empty(out_sizes, centered.options());
    AT_DISPATCH_FLOATING_TYPES(centered.scalar_type(), "simwarp_moments5_2d", [&] {
      const std::vector<scalar_t> wh(taps.begin(), taps.begin() + kh);
      const std::vector<scalar_t> ww(taps.begin() + kh, taps.begin() + kh + k_last);
      const scalar_t* base = centered.data_ptr<scalar_t>();
      moments_2d<scalar_t>(base, base + per_image, out.data_ptr<scalar_t>(), per_image / (Hp * L),
                           Hp, L, wh, ww);
    });
    return out;
  }
  at::Tensor cur = at::empty(out_sizes, centered.options());
  int64_t offset = 0;
  for (int64_t a = 0; a < d - 1; ++a) offset += sizes[a];
  AT_DISPATCH_FLOATING_TYPES(centered.scalar_type(), "simwarp_moments5", [&] {
    std::vector<scalar_t> w(taps.begin() + offset, taps.begin() + offset + k_last);
    const scalar_t* base = centered.data_ptr<scalar_t>();
    moments_last_axis<scalar_t>(base, base + per_image, cur.data_ptr<scalar_t>(), lines, L, w);
  });
  offset = 0;
  for (int64_t a = 0; a < d - 1; ++a) {  // the leading axes: plain passes over the five maps
    const int64_t k = sizes[a], dim = first + a;
    const int64_t La = cur.size(dim);
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
