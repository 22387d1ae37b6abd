// Fused 2D local standard deviation on CPU, padding and centering included: the loops
// (local_std_2d_forward / _backward) and the ops over them (local_std_2d.cpp), which
// local_std.cpp also runs for its 2D windows.
//
// The image is read in place: a padded row or column is an index (include/simwarp/
// padding.h), never a copy, and the values are centered on the fly. Forward: per band of
// output rows, running column sums of y and y² (y = x − c) slide down the rows, and a
// running sum along each row gives S1, S2 and the output. Backward: per band of padded
// rows, the per-element vjp of each output row is summed along the row (full mode),
// folded back onto the image's columns, slid down the rows, folded onto the image's rows
// and combined. Bands have a fixed size and border rows are folded in a fixed order after
// the bands, so the result is bitwise the same on any number of threads. Sums are double
// whatever the data type (docs/maths.md §1.3). The per-element maths is
// include/simwarp/local_std.h, shared with the CUDA kernels.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "simwarp/local_std.h"
#include "simwarp/padding.h"

namespace simwarp {
namespace cpu {

constexpr int64_t kBandRows = 128;

// B images of (Hin, Win), padded to (Hp, Wp) (pads before: ph, pw) and summed over a
// (kh, kw) window in valid mode: output (H, W). The "same" paddings give (H, W) = (Hin,
// Win); kValid takes the input as already padded.
struct Plane2d {
  int64_t B, Hin, Win, kh, kw;
  Padding mode;
  int64_t ph, pw, Hp, Wp, H, W;

  Plane2d(int64_t B_, int64_t Hin_, int64_t Win_, int64_t kh_, int64_t kw_, Padding mode_)
      : B(B_), Hin(Hin_), Win(Win_), kh(kh_), kw(kw_), mode(mode_) {
    const bool same = mode != Padding::kValid;
    ph = same ? kh / 2 : 0;
    pw = same ? kw / 2 : 0;
    Hp = same ? Hin + kh - 1 : Hin;
    Wp = same ? Win + kw - 1 : Win;
    H = Hp - kh + 1;
    W = Wp - kw + 1;
  }
  // Source row of padded row p, or −1 for a row of zeros.
  int64_t source_row(int64_t p) const { return pad_source(p - ph, Hin, mode); }
  int64_t source_column(int64_t q) const { return pad_source(q - pw, Win, mode); }
  bool interior_row(int64_t p) const { return p >= ph && p < ph + Hin; }
};

// The value an image's sums are centered on: the mean of its first row. The variance is
// shift-invariant; any value inside the data's range keeps S2 − S1²/N well conditioned
// in double, and forward and backward recompute the same one from the same input.
template <typename T>
double plane_center(const T* image, int64_t Win) {
  double s = 0.0;
  for (int64_t j = 0; j < Win; ++j) s += static_cast<double>(image[j]);
  return s / static_cast<double>(Win);
}

// a1 += Σ y, a2 += Σ y² over one row entering (and one leaving) the window, y = v − c.
template <typename T>
inline void add_row(double* a1, double* a2, const T* in, double c, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const double y = static_cast<double>(in[j]) - c;
    a1[j] += y;
    a2[j] += y * y;
  }
}

template <typename T>
inline void slide_row(double* a1, double* a2, const T* in, const T* out, double c, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const double y = static_cast<double>(in[j]) - c, z = static_cast<double>(out[j]) - c;
    a1[j] += y - z;
    a2[j] += y * y - z * z;
  }
}

// Padded columns of the column sums (a1, a2: Wp entries): copies of the columns they
// mirror, or kh zeros (centered: −c each) under zero padding.
inline void fill_border_columns(double* a1, double* a2, const Plane2d& g, double c) {
  for (int64_t q = 0; q < g.Wp; ++q) {
    if (q == g.pw) q = g.pw + g.Win;  // skip the interior
    if (q >= g.Wp) break;
    const int64_t s = g.source_column(q);
    a1[q] = s >= 0 ? a1[g.pw + s] : -static_cast<double>(g.kh) * c;
    a2[q] = s >= 0 ? a2[g.pw + s] : static_cast<double>(g.kh) * c * c;
  }
}

// Valid window sums of length k along R rows at once (n entries each). The entering
// minus the leaving value is formed first, so each running sum has one dependent add per
// element, and the R independent sums hide that add's latency.
template <int R>
inline void window_sums_rows(const double* const* in, int64_t n, int64_t k, double* const* out) {
  double run[R];
  for (int m = 0; m < R; ++m) {
    run[m] = 0.0;
    for (int64_t q = 0; q < k; ++q) run[m] += in[m][q];
    out[m][0] = run[m];
  }
  for (int64_t o = 1; o < n; ++o) {
    for (int m = 0; m < R; ++m) {
      run[m] += in[m][o + k - 1] - in[m][o - 1];
      out[m][o] = run[m];
    }
  }
}

// One output row from the column sums: running window sums along the row and the
// per-element forward, in one loop.
template <typename T>
inline void row_forward(const double* a1, const double* a2, const Plane2d& g, double inv_n,
                        double eps, double flat_factor, bool normalized, T* out, T* s1_out,
                        bool* flat) {
  double s1 = 0.0, s2 = 0.0;
  for (int64_t q = 0; q < g.kw; ++q) { s1 += a1[q]; s2 += a2[q]; }
  for (int64_t o = 0; o < g.W; ++o) {
    if (o > 0) {
      s1 += a1[o + g.kw - 1] - a1[o - 1];
      s2 += a2[o + g.kw - 1] - a2[o - 1];
    }
    out[o] = static_cast<T>(local_std_forward<double>(s1, s2, inv_n, eps, flat_factor,
                                                      normalized, flat + o));
    s1_out[o] = static_cast<T>(s1);
  }
}

// x (B, Hin, Win) -> out, s1, flat (B, H, W).
template <typename T>
void local_std_2d_forward(const T* x, T* out, T* s1_out, bool* flat, const Plane2d& g,
                          double eps, double flat_factor, bool normalized) {
  const int64_t bands = (g.H + kBandRows - 1) / kBandRows;
  const double inv_n = 1.0 / static_cast<double>(g.kh * g.kw);
  const std::vector<T> zero_row(g.Win, T(0));
  at::parallel_for(0, g.B * bands, 1, [&](int64_t t0, int64_t t1) {
    std::vector<double> acc1(g.Wp), acc2(g.Wp);
    double* a1 = acc1.data() + g.pw;  // the image's columns
    double* a2 = acc2.data() + g.pw;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / bands, r0 = (t % bands) * kBandRows;
      const int64_t r1 = std::min(g.H, r0 + kBandRows);
      const T* image = x + b * g.Hin * g.Win;
      const double c = plane_center(image, g.Win);
      auto row = [&](int64_t p) {
        const int64_t s = g.source_row(p);
        return s >= 0 ? image + s * g.Win : zero_row.data();
      };
      std::fill(acc1.begin(), acc1.end(), 0.0);
      std::fill(acc2.begin(), acc2.end(), 0.0);
      for (int64_t p = r0; p < r0 + g.kh; ++p) add_row(a1, a2, row(p), c, g.Win);
      for (int64_t i = r0; i < r1; ++i) {  // output row i sums padded rows i .. i + kh − 1
        if (i > r0) slide_row(a1, a2, row(i + g.kh - 1), row(i - 1), c, g.Win);
        fill_border_columns(acc1.data(), acc2.data(), g, c);
        const int64_t o = (b * g.H + i) * g.W;
        row_forward(acc1.data(), acc2.data(), g, inv_n, eps, flat_factor, normalized, out + o,
                    s1_out + o, flat + o);
      }
    }
  });
}

// Which padded rows the backward keeps for the fold onto the image's rows. Border rows
// that read an image row, and the interior rows of the image rows they read, get a slot;
// groups[k] = (image row, its slots in ascending padded row). All other interior rows are
// combined as soon as they are complete.
struct RowFold {
  std::vector<int64_t> slot;  // per padded row: slot, or −1 (interior, combine now; or dropped)
  std::vector<std::pair<int64_t, std::vector<int64_t>>> groups;
  int64_t slots = 0;

  explicit RowFold(const Plane2d& g) : slot(g.Hp, -1) {
    std::vector<int64_t> group_of(g.Hin, -1);
    for (int64_t p = 0; p < g.Hp; ++p) {
      const int64_t s = g.source_row(p);
      if (g.interior_row(p) || s < 0 || group_of[s] >= 0) continue;
      group_of[s] = static_cast<int64_t>(groups.size());
      groups.push_back({s, {}});
    }
    for (int64_t p = 0; p < g.Hp; ++p) {  // ascending p: a fixed summation order
      const int64_t s = g.source_row(p);
      if (s < 0 || group_of[s] < 0) continue;
      slot[p] = slots++;
      groups[group_of[s]].second.push_back(slot[p]);
    }
  }
};

// The padded columns' sums (Wp entries) added onto the image columns they read (Win).
inline void fold_columns(const double* padded, const Plane2d& g, double* folded) {
  std::copy(padded + g.pw, padded + g.pw + g.Win, folded);
  for (int64_t q = 0; q < g.Wp; ++q) {
    if (q == g.pw) q = g.pw + g.Win;
    if (q >= g.Wp) break;
    const int64_t s = g.source_column(q);
    if (s >= 0) folded[s] += padded[q];
  }
}

// ∂L/∂x = F1 + 2 y F2 for one image row, F the folded window sums of the partials.
template <typename T>
inline void combine_row(const double* f1, const double* f2, const T* x, double c, int64_t n,
                        T* dx) {
  for (int64_t j = 0; j < n; ++j)
    dx[j] = static_cast<T>(local_std_combine<double>(f1[j], f2[j], static_cast<double>(x[j]) - c));
}

// ∂L/∂x (B, Hin, Win) from grad, out, s1, flat (B, H, W) and x.
template <typename T>
void local_std_2d_backward(const T* grad, const T* out, const T* s1, const bool* flat,
                           const T* x, T* dx, const Plane2d& g, bool normalized) {
  const RowFold fold(g);
  const int64_t bands = (g.Hp + kBandRows - 1) / kBandRows;
  const int64_t Win = g.Win, kh = g.kh;
  const T inv_n = T(1) / static_cast<T>(g.kh * g.kw);
  std::vector<double> kept(g.B * fold.slots * 2 * Win);
  at::parallel_for(0, g.B * bands, 1, [&](int64_t t0, int64_t t1) {
    // Rows go through the horizontal pass in pairs (window_sums_rows: four running sums
    // at once). Each row's vjp sits between kw − 1 zeros on each side, so its full-mode
    // window sums (the adjoint of the valid ones) are valid sums.
    constexpr int kPair = 2;
    const int64_t zn = g.W + 2 * (g.kw - 1);
    std::vector<double> z(2 * kPair * zn, 0.0), full(2 * kPair * g.Wp), fresh(2 * kPair * Win);
    std::vector<double> ring(2 * kh * Win), acc(2 * Win);
    const double* z_rows[2 * kPair];
    double* full_rows[2 * kPair];
    for (int m = 0; m < 2 * kPair; ++m) {
      z_rows[m] = z.data() + m * zn;
      full_rows[m] = full.data() + m * g.Wp;
    }
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / bands, p0 = (t % bands) * kBandRows;
      const int64_t p1 = std::min(g.Hp, p0 + kBandRows);
      const T* image = x + b * g.Hin * Win;
      const double c = plane_center(image, Win);
      std::fill(ring.begin(), ring.end(), 0.0);
      std::fill(acc.begin(), acc.end(), 0.0);
      // Output row i reaches padded rows i .. i + kh − 1: padded row p sums rows
      // p − kh + 1 .. p, so the rows of the band need output rows from p0 − kh + 1.
      for (int64_t i0 = p0 - kh + 1; i0 < p1; i0 += kPair) {
        const int rows = static_cast<int>(std::min<int64_t>(kPair, p1 - i0));
        for (int r = 0; r < rows; ++r) {
          double* z1 = z.data() + 2 * r * zn + g.kw - 1;
          double* z2 = z1 + zn;
          const int64_t i = i0 + r;
          if (i < 0 || i >= g.H) {
            std::fill(z1, z1 + g.W, 0.0);
            std::fill(z2, z2 + g.W, 0.0);
            continue;
          }
          const int64_t o = (b * g.H + i) * g.W;
          for (int64_t j = 0; j < g.W; ++j) {
            T d1, d2;
            local_std_vjp(grad[o + j], out[o + j], s1[o + j], inv_n, normalized, flat[o + j],
                          &d1, &d2);
            z1[j] = static_cast<double>(d1);
            z2[j] = static_cast<double>(d2);
          }
        }
        if (rows == kPair) {
          window_sums_rows<2 * kPair>(z_rows, g.Wp, g.kw, full_rows);
        } else {
          window_sums_rows<2>(z_rows, g.Wp, g.kw, full_rows);
        }
        for (int r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          double* row_fresh = fresh.data() + 2 * r * Win;
          fold_columns(full_rows[2 * r], g, row_fresh);
          fold_columns(full_rows[2 * r + 1], g, row_fresh + Win);
          double* leaving = ring.data() + (((i % kh) + kh) % kh) * 2 * Win;  // row i − kh
          for (int64_t j = 0; j < 2 * Win; ++j) {
            acc[j] += row_fresh[j] - leaving[j];
            leaving[j] = row_fresh[j];
          }
          if (i < p0) continue;
          const int64_t p = i;  // acc now holds padded row p's sums
          if (fold.slot[p] >= 0) {
            std::copy(acc.begin(), acc.end(),
                      kept.begin() + (b * fold.slots + fold.slot[p]) * 2 * Win);
          } else if (g.interior_row(p)) {
            const int64_t s = (b * g.Hin + p - g.ph) * Win;
            combine_row(acc.data(), acc.data() + Win, x + s, c, Win, dx + s);
          }
        }
      }
    }
  });
  const int64_t groups = static_cast<int64_t>(fold.groups.size());
  at::parallel_for(0, g.B * groups, 1, [&](int64_t t0, int64_t t1) {
    std::vector<double> total(2 * Win);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / groups;
      const auto& [row, slots] = fold.groups[t % groups];
      std::fill(total.begin(), total.end(), 0.0);
      for (int64_t k : slots) {
        const double* src = kept.data() + (b * fold.slots + k) * 2 * Win;
        for (int64_t j = 0; j < 2 * Win; ++j) total[j] += src[j];
      }
      const T* image = x + b * g.Hin * Win;
      const int64_t s = (b * g.Hin + row) * Win;
      combine_row(total.data(), total.data() + Win, x + s, plane_center(image, Win), Win, dx + s);
    }
  });
}

// The ops (local_std_2d.cpp): padding "valid", "reflect", "mirror", "nearest" or "constant".
std::tuple<at::Tensor, at::Tensor, at::Tensor> local_std_2d_fwd(const at::Tensor& x,
                                                                 at::IntArrayRef window,
                                                                 c10::string_view padding,
                                                                 double eps, bool normalized,
                                                                 double flat_factor);
at::Tensor local_std_2d_bwd(const at::Tensor& grad, const at::Tensor& out, const at::Tensor& s1,
                            const at::Tensor& flat, const at::Tensor& x, at::IntArrayRef window,
                            c10::string_view padding, bool normalized);

}  // namespace cpu
}  // namespace simwarp
