// The argument checks of every simwarp op, shared by the CPU bindings (cpu/*.cpp) and the
// CUDA bindings (cuda/*.cpp), so that both sides accept and refuse the same calls with the
// same messages. Each binding's first line is checks::<op>(...) for its op. Also the
// output shapes those checks imply. Torch headers: never included by a .cu file.
//
// Zero-size inputs: a binding whose (checked) input has no element returns zeros of its
// output shapes and runs no kernel. The result is empty, except in full / transpose mode,
// where it is the sums over nothing; CUDA refuses a launch of zero blocks, and the CPU
// follows the same rule so that both sides agree.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <tuple>
#include <vector>

namespace simwarp {
namespace checks {

// ---- shapes --------------------------------------------------------------------------

// `shape` with its trailing window.size() axes shrunk by k − 1 (valid mode) or grown by
// k − 1 (full mode, the adjoint; also correlate's transpose).
inline std::vector<int64_t> window_output_shape(at::IntArrayRef shape, at::IntArrayRef window,
                                                bool full) {
  std::vector<int64_t> out = shape.vec();
  const size_t first = out.size() - window.size();
  for (size_t a = 0; a < window.size(); ++a) out[first + a] += full ? window[a] - 1 : 1 - window[a];
  return out;
}

// moments5's result (5, ...lead, *(P − k + 1)) for centered (2, ...lead, *P).
inline std::vector<int64_t> moments5_shape(at::IntArrayRef centered, at::IntArrayRef sizes) {
  std::vector<int64_t> out = window_output_shape(centered, sizes, false);
  out[0] = 5;
  return out;
}

// A splat's den (N, 1, *S) for an image (N, C, *S).
inline std::vector<int64_t> splat_den_shape(at::IntArrayRef image) {
  std::vector<int64_t> out = image.vec();
  out[1] = 1;
  return out;
}

// N, the number of elements of a window.
inline int64_t window_volume(at::IntArrayRef window) {
  int64_t n = 1;
  for (auto k : window) n *= k;
  return n;
}

// (out, S1, flat) of a local std of a zero-size input, `shape` its output shape.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> local_std_zeros(at::IntArrayRef shape,
                                                                      const at::Tensor& x) {
  return {at::zeros(shape, x.options()), at::zeros(shape, x.options()),
          at::zeros(shape, x.options().dtype(at::kBool))};
}

// ---- one property at a time ------------------------------------------------------------

// A tensor argument and its name in the schema, for messages that say which one is wrong.
struct Arg {
  const char* name;
  const at::Tensor& tensor;
};

// The kernels are instantiated for float32 and float64 only (AT_DISPATCH_FLOATING_TYPES).
inline void floating(const char* op, Arg a) {
  const auto type = a.tensor.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kDouble, op, ": ", a.name,
              " must be float32 or float64, got ", type);
}

// The kernels read every tensor argument through raw pointers of the first one's dtype, on
// the first one's device. Undefined tensors (absent optional arguments) are skipped.
inline void like_first(const char* op, std::initializer_list<Arg> args) {
  const Arg& first = *args.begin();
  for (const Arg& a : args) {
    if (!a.tensor.defined()) continue;
    TORCH_CHECK(a.tensor.device() == first.tensor.device(), op, ": ", a.name, " is on ",
                a.tensor.device(), " but ", first.name, " is on ", first.tensor.device());
    TORCH_CHECK(a.tensor.scalar_type() == first.tensor.scalar_type(), op, ": ", a.name, " is ",
                a.tensor.scalar_type(), " but ", first.name, " is ", first.tensor.scalar_type());
  }
}

inline void shape(const char* op, Arg a, at::IntArrayRef expected) {
  TORCH_CHECK(a.tensor.sizes() == expected, op, ": ", a.name, " must have shape ", expected,
              ", got ", a.tensor.sizes());
}

// A window over the trailing window.size() axes of x, leaving its first `reserved` axes
// alone: every size at least 1 and, unless the op pads (full / transpose mode, a "same"
// padding), no longer than its axis.
inline void window(const char* op, const at::Tensor& x, at::IntArrayRef window, bool pads,
                   int64_t reserved = 0) {
  const int64_t d = static_cast<int64_t>(window.size());
  TORCH_CHECK(d <= x.dim() - reserved, op, ": a window of ", d, " axes needs at least ",
              d + reserved, " dimensions, got ", x.dim());
  for (int64_t a = 0; a < d; ++a) {
    TORCH_CHECK(window[a] >= 1, op, ": window sizes must be at least 1, got ", window);
    TORCH_CHECK(pads || window[a] <= x.size(x.dim() - d + a), op,
                ": window larger than the axis (window ", window, ", shape ", x.sizes(), ")");
  }
}

// Ops that form one window sum per output need at least one windowed axis.
inline void some_window(const char* op, at::IntArrayRef window) {
  TORCH_CHECK(!window.empty(), op, ": the window must cover at least one axis");
}

// Separable taps, concatenated per axis: sizes[a] values for axis a.
inline void taps(const char* op, at::ArrayRef<double> taps, at::IntArrayRef sizes) {
  int64_t total = 0;
  for (auto k : sizes) total += k;
  TORCH_CHECK(total == static_cast<int64_t>(taps.size()), op, ": taps must hold sum(sizes) = ",
              total, " values, got ", taps.size());
}

// What the forward of a local std saved and its backward reads back: grad, out and s1 in
// x's dtype, flat in bool, all of the forward's output shape, all on x's device.
inline void local_std_saved(const char* op, const at::Tensor& grad, const at::Tensor& out,
                            const at::Tensor& s1, const at::Tensor& flat, const at::Tensor& x,
                            at::IntArrayRef out_shape) {
  like_first(op, {{"x", x}, {"grad", grad}, {"out", out}, {"s1", s1}});
  TORCH_CHECK(flat.device() == x.device(), op, ": flat is on ", flat.device(), " but x is on ",
              x.device());
  TORCH_CHECK(flat.scalar_type() == at::kBool, op, ": flat must be bool, got ", flat.scalar_type());
  for (Arg a : {Arg{"grad", grad}, Arg{"out", out}, Arg{"s1", s1}, Arg{"flat", flat}})
    shape(op, a, out_shape);
}

// ---- per op: the first line of its CPU and its CUDA binding ----------------------------

inline void box_sum(const at::Tensor& x, at::IntArrayRef window, bool full) {
  floating("box_sum", {"x", x});
  checks::window("box_sum", x, window, /*pads=*/full);
}

inline void correlate(const at::Tensor& x, at::ArrayRef<double> taps, at::IntArrayRef sizes,
                      bool transpose) {
  floating("correlate", {"x", x});
  checks::taps("correlate", taps, sizes);
  window("correlate", x, sizes, /*pads=*/transpose);
}

// centered (2, ...lead, *P) stacks the two images [a, b] on dim 0.
inline void moments5(const at::Tensor& centered, at::ArrayRef<double> taps, at::IntArrayRef sizes) {
  floating("moments5", {"centered", centered});
  TORCH_CHECK(centered.dim() >= 1 && centered.size(0) == 2,
              "moments5: centered must stack [a, b] on dim 0, got shape ", centered.sizes());
  some_window("moments5", sizes);
  checks::taps("moments5", taps, sizes);
  window("moments5", centered, sizes, /*pads=*/false, /*reserved=*/1);
}

// The fused 2-D SSIM (CUDA only, cuda/ssim.cpp): a and b (..., H, W) float32 of one shape,
// a window of two odd sizes up to max_taps (the kernels' shared memory) and the axis.
inline void ssim_fwd(const at::Tensor& a, const at::Tensor& b, at::ArrayRef<double> taps,
                     at::IntArrayRef sizes, int64_t max_taps) {
  TORCH_CHECK(a.scalar_type() == at::kFloat, "ssim_fwd: a must be float32, got ", a.scalar_type());
  like_first("ssim_fwd", {{"a", a}, {"b", b}});
  shape("ssim_fwd", {"b", b}, a.sizes());
  TORCH_CHECK(sizes.size() == 2 && a.dim() >= 2, "ssim_fwd: a 2-D window over (..., H, W), got ",
              "window ", sizes, " for shape ", a.sizes());
  checks::taps("ssim_fwd", taps, sizes);
  window("ssim_fwd", a, sizes, /*pads=*/false);
  for (auto k : sizes)
    TORCH_CHECK(k % 2 == 1 && k <= max_taps, "ssim_fwd: window sizes must be odd and at most ",
                max_taps, ", got ", sizes);
}

// Its backward: grad one value or a's shape, partials (4, ...a), shifts (2, images, tiles
// along H, tiles along W), all float32 on a's device.
inline void ssim_bwd(const at::Tensor& grad, const at::Tensor& a, const at::Tensor& b,
                     const at::Tensor& partials, const at::Tensor& shifts,
                     at::ArrayRef<double> taps, at::IntArrayRef sizes, int64_t max_taps,
                     int64_t tile) {
  ssim_fwd(a, b, taps, sizes, max_taps);
  like_first("ssim_bwd", {{"a", a}, {"grad", grad}, {"partials", partials}, {"shifts", shifts}});
  TORCH_CHECK(grad.numel() == 1 || grad.sizes() == a.sizes(),
              "ssim_bwd: grad must hold one value or have shape ", a.sizes(), ", got ", grad.sizes());
  std::vector<int64_t> four = a.sizes().vec();
  four.insert(four.begin(), 4);
  shape("ssim_bwd", {"partials", partials}, four);
  const int64_t H = a.size(-2), W = a.size(-1), images = H * W ? a.numel() / (H * W) : 0;
  shape("ssim_bwd", {"shifts", shifts},
        {2, images, (H + tile - 1) / tile, (W + tile - 1) / tile});
}

// The fused local NCC (CUDA only, cuda/local_ncc.cpp): a and b (..., H, W) or (..., D, H,
// W) float32 of one shape, a window of two or three odd sizes up to max_taps (the kernels'
// shared memory) and the axis.
inline void local_ncc_fwd(const at::Tensor& a, const at::Tensor& b, at::ArrayRef<double> taps,
                          at::IntArrayRef sizes, int64_t max_taps) {
  const char* op = "local_ncc_fwd";
  TORCH_CHECK(a.scalar_type() == at::kFloat, op, ": a must be float32, got ", a.scalar_type());
  like_first(op, {{"a", a}, {"b", b}});
  shape(op, {"b", b}, a.sizes());
  TORCH_CHECK((sizes.size() == 2 || sizes.size() == 3) &&
                  a.dim() >= static_cast<int64_t>(sizes.size()),
              op, ": a 2-D or 3-D window over (..., [D,] H, W), got window ", sizes,
              " for shape ", a.sizes());
  checks::taps(op, taps, sizes);
  window(op, a, sizes, /*pads=*/false);
  for (auto k : sizes)
    TORCH_CHECK(k % 2 == 1 && k <= max_taps, op, ": window sizes must be odd and at most ",
                max_taps, ", got ", sizes);
}

// Its backward: grad one value or a's shape, partials (5, ...a), shifts (2, images, tiles
// along D, H and W), all float32 on a's device.
inline void local_ncc_bwd(const at::Tensor& grad, const at::Tensor& a, const at::Tensor& b,
                          const at::Tensor& partials, const at::Tensor& shifts,
                          at::ArrayRef<double> taps, at::IntArrayRef sizes, int64_t max_taps,
                          at::IntArrayRef tiles) {
  const char* op = "local_ncc_bwd";
  local_ncc_fwd(a, b, taps, sizes, max_taps);
  like_first(op, {{"a", a}, {"grad", grad}, {"partials", partials}, {"shifts", shifts}});
  TORCH_CHECK(grad.numel() == 1 || grad.sizes() == a.sizes(), op,
              ": grad must hold one value or have shape ", a.sizes(), ", got ", grad.sizes());
  std::vector<int64_t> five = a.sizes().vec();
  five.insert(five.begin(), 5);
  shape(op, {"partials", partials}, five);
  shape(op, {"shifts", shifts}, tiles);
}

// The fused 2-D local std (CUDA only, cuda/local_std_fused.cpp): x (..., H, W) float32, its
// images' shifts (images,), an odd box window up to max_window and the axis, SciPy's
// padding names.
inline void local_std_fused_fwd(const at::Tensor& x, const at::Tensor& shift,
                                at::IntArrayRef window, c10::string_view padding,
                                int64_t max_window) {
  const char* op = "local_std_fused";
  TORCH_CHECK(x.scalar_type() == at::kFloat, op, ": x must be float32, got ", x.scalar_type());
  like_first(op, {{"x", x}, {"shift", shift}});
  TORCH_CHECK(x.dim() >= 2 && window.size() == 2, op, ": x must be (..., H, W), window (kh, kw)");
  checks::window(op, x, window, /*pads=*/false);
  for (auto k : window)
    TORCH_CHECK(k % 2 == 1 && k <= max_window, op, ": window sizes must be odd and at most ",
                max_window, ", got ", window);
  TORCH_CHECK(padding == "reflect" || padding == "mirror" || padding == "nearest" ||
                  padding == "constant",
              op, ": padding must be reflect, mirror, nearest or constant, got ", padding);
  const int64_t plane = x.size(-1) * x.size(-2);
  shape(op, {"shift", shift}, {plane ? x.numel() / plane : 0});
}

inline void local_std_fused_bwd(const at::Tensor& grad, const at::Tensor& out,
                                const at::Tensor& s1, const at::Tensor& flat,
                                const at::Tensor& x, const at::Tensor& shift,
                                at::IntArrayRef window, c10::string_view padding,
                                int64_t max_window) {
  local_std_fused_fwd(x, shift, window, padding, max_window);
  local_std_saved("local_std_fused", grad, out, s1, flat, x, x.sizes());
}

inline void local_std_fwd(const at::Tensor& xp, at::IntArrayRef window) {
  floating("local_std_fwd", {"xp", xp});
  some_window("local_std_fwd", window);
  checks::window("local_std_fwd", xp, window, /*pads=*/false);
}

inline void local_std_bwd(const at::Tensor& grad, const at::Tensor& out, const at::Tensor& s1,
                          const at::Tensor& flat, const at::Tensor& xp, at::IntArrayRef window) {
  local_std_fwd(xp, window);
  local_std_saved("local_std_bwd", grad, out, s1, flat, xp,
                  window_output_shape(xp.sizes(), window, false));
}

// x (..., H, W) with a window (kh, kw); `valid`: no padding, so the window must fit.
inline void local_std_2d_fwd(const at::Tensor& x, at::IntArrayRef window, bool valid) {
  floating("local_std_2d", {"x", x});
  TORCH_CHECK(x.dim() >= 2 && window.size() == 2,
              "local_std_2d: x must be (..., H, W), window (kh, kw)");
  checks::window("local_std_2d", x, window, /*pads=*/!valid);
}

inline void local_std_2d_bwd(const at::Tensor& grad, const at::Tensor& out, const at::Tensor& s1,
                             const at::Tensor& flat, const at::Tensor& x, at::IntArrayRef window,
                             bool valid) {
  local_std_2d_fwd(x, window, valid);
  local_std_saved("local_std_2d_bwd", grad, out, s1, flat, x,
                  valid ? window_output_shape(x.sizes(), window, false) : x.sizes().vec());
}

// image (N, C, *S) and displacement (N, D, *S), D = len(S) = 2 or 3.
inline void splat_fwd(const at::Tensor& image, const at::Tensor& displacement) {
  floating("splat", {"image", image});
  like_first("splat", {{"image", image}, {"displacement", displacement}});
  const int64_t D = image.dim() - 2;
  TORCH_CHECK(D == 2 || D == 3, "splat: image must be (N, C, H, W) or (N, C, D, H, W), got shape ",
              image.sizes());
  std::vector<int64_t> expected = image.sizes().vec();
  expected[1] = D;
  shape("splat", {"displacement", displacement}, expected);
}

// The forward's arguments and results, and the gradients of the results (either may be
// absent: no gradient flows into it).
inline void splat_bwd(const std::optional<at::Tensor>& v_out, const std::optional<at::Tensor>& v_den,
                      const at::Tensor& image, const at::Tensor& displacement, const at::Tensor& out,
                      const at::Tensor& den) {
  splat_fwd(image, displacement);
  const at::Tensor none;
  const at::Tensor& vo = v_out.has_value() ? *v_out : none;
  const at::Tensor& vd = v_den.has_value() ? *v_den : none;
  like_first("splat_bwd", {{"image", image}, {"out", out}, {"den", den}, {"v_out", vo},
                           {"v_den", vd}});
  const std::vector<int64_t> den_shape = splat_den_shape(image.sizes());
  shape("splat_bwd", {"out", out}, image.sizes());
  shape("splat_bwd", {"den", den}, den_shape);
  if (vo.defined()) shape("splat_bwd", {"v_out", vo}, image.sizes());
  if (vd.defined()) shape("splat_bwd", {"v_den", vd}, den_shape);
}

// ---- parzen_fwd / parzen_bwd (the mutual information's Parzen histogram) --------------

// The most bins the kernels take (the CUDA score kernel keeps both marginals in a block's
// shared memory); ops/mutual_information.py runs more through torch.
constexpr int64_t kParzenMaxBins = 1024;

// a, b (M, P) intensities; weight (M, P) or absent; bins ≥ 4; value_range empty or (lo, hi).
inline void parzen_fwd(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& weight,
                       int64_t bins, at::ArrayRef<double> value_range) {
  floating("parzen", {"a", a});
  const at::Tensor w = weight.has_value() ? *weight : at::Tensor();
  like_first("parzen", {{"a", a}, {"b", b}, {"weight", w}});
  TORCH_CHECK(a.dim() == 2, "parzen: a must be (M, P), got shape ", a.sizes());
  shape("parzen", {"b", b}, a.sizes());
  if (w.defined()) shape("parzen", {"weight", w}, a.sizes());
  TORCH_CHECK(bins >= 4 && bins <= kParzenMaxBins, "parzen: bins must be between 4 and ",
              kParzenMaxBins, ", got ", bins);
  TORCH_CHECK(value_range.empty() || (value_range.size() == 2 && value_range[1] > value_range[0]),
              "parzen: value_range must be empty or (low, high) with high > low");
}

// The forward's arguments, its score (M,), grad_joint (M, bins, bins) and frame (M, 4),
// and the score's gradient grad_score (M,).
inline void parzen_bwd(const at::Tensor& grad_score, const at::Tensor& score,
                       const at::Tensor& grad_joint, const at::Tensor& a, const at::Tensor& b,
                       const std::optional<at::Tensor>& weight, const at::Tensor& frame,
                       int64_t bins) {
  parzen_fwd(a, b, weight, bins, {});
  like_first("parzen_bwd", {{"a", a}, {"grad_score", grad_score}, {"score", score},
                            {"grad_joint", grad_joint}, {"frame", frame}});
  const int64_t M = a.size(0);
  shape("parzen_bwd", {"grad_score", grad_score}, {M});
  shape("parzen_bwd", {"score", score}, {M});
  shape("parzen_bwd", {"grad_joint", grad_joint}, {M, bins, bins});
  shape("parzen_bwd", {"frame", frame}, {M, 4});
}


// ---- squaring_fwd / squaring_bwd (scaling and squaring, ops/integrate_velocity.py) ------

// The most squarings (ops/integrate_velocity.py MAX_STEPS).
constexpr int64_t kSquaringMaxSteps = 30;

// squaring_fwd's saved fields (count, N, D, *S): with keep=True, count = steps (u and each
// squaring but the last, what the backward reads); else 0.
inline std::vector<int64_t> squaring_saved_shape(at::IntArrayRef u, int64_t count) {
  std::vector<int64_t> out{count};
  out.insert(out.end(), u.begin(), u.end());
  return out;
}

// u (N, D, *S), D = len(S) = 2 or 3, in pixels along array axes; scale empty or D
// factors, one per component; 0 ≤ steps ≤ 30.
inline void squaring_fwd(const at::Tensor& u, at::ArrayRef<double> scale, int64_t steps) {
  floating("squaring", {"u", u});
  const int64_t D = u.dim() - 2;  // u.size(1) read only where u has 4 or 5 axes
  TORCH_CHECK((D == 2 || D == 3) && u.size(1) == D,
              "squaring: u must be (N, 2, H, W) or (N, 3, D, H, W), got shape ", u.sizes());
  TORCH_CHECK(scale.empty() || static_cast<int64_t>(scale.size()) == D,
              "squaring: scale must be empty or hold one factor per component (", D,
              "), got ", scale.size());
  TORCH_CHECK(steps >= 0 && steps <= kSquaringMaxSteps, "squaring: steps must be between 0 and ",
              kSquaringMaxSteps, ", got ", steps);
}

// grad (N, D, *S), the gradient of the last squaring; saved (steps, N, D, *S) the
// forward's saved fields with keep=True; scale the forward's; base absent or like grad.
inline void squaring_bwd(const at::Tensor& grad, const at::Tensor& saved,
                         at::ArrayRef<double> scale, const std::optional<at::Tensor>& base) {
  squaring_fwd(grad, scale, 0);
  const at::Tensor none;
  const at::Tensor& b = base.has_value() ? *base : none;
  like_first("squaring_bwd", {{"grad", grad}, {"saved", saved}, {"base", b}});
  TORCH_CHECK(saved.dim() == grad.dim() + 1 && saved.size(0) <= kSquaringMaxSteps,
              "squaring_bwd: saved must be (steps, *grad.shape) with 0 <= steps <= ",
              kSquaringMaxSteps, ", got shape ", saved.sizes());
  shape("squaring_bwd", {"saved", saved}, squaring_saved_shape(grad.sizes(), saved.size(0)));
  if (b.defined()) shape("squaring_bwd", {"base", b}, grad.sizes());
}

// x (N, D, *S) times scale, one factor per component (a copy of x for no scale): either
// op's result where there is no squaring (or no pixel) to fold the scale into.
inline at::Tensor squaring_scaled_copy(const at::Tensor& x, at::ArrayRef<double> scale) {
  at::Tensor out = x.clone();
  for (size_t c = 0; c < scale.size(); ++c) out.select(1, static_cast<int64_t>(c)).mul_(scale[c]);
  return out;
}

}  // namespace checks
}  // namespace simwarp
