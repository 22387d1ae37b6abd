// Schemas of every simwarp custom op, defined once. Each op registers its implementation
// per dispatch key in a file of its own, named after it less any _fwd / _bwd: cpu/<op>.cpp
// (always) and cuda/<op>.cpp (when built with CUDA; local_std_2d_* are CPU only). Both
// sides run the same argument checks (checks.h).
// Fake (meta) implementations and autograd formulas are registered from Python
// (src/napari_simwarp/ops/_kernels/_registrations.py).
//
// ops.cpp defines them as the simwarp library; the host-shim build (host_shim/library.cpp)
// defines the same schemas as the simwarp_host_shim library, which the CUDA bindings built
// as host code implement.
#pragma once

#include <torch/library.h>

namespace simwarp {

inline void define_ops(torch::Library& m) {
  // Window sums over the trailing len(window) axes; full=True is the adjoint (zero-padded).
  m.def("box_sum(Tensor x, int[] window, bool full=False) -> Tensor");
  // Separable correlation over the trailing len(sizes) axes, taps concatenated per axis;
  // transpose=True is the adjoint of the valid correlation (output grows by k − 1).
  m.def("correlate(Tensor x, float[] taps, int[] sizes, bool transpose=False) -> Tensor");
  // The five windowed moments (W⋆a, W⋆b, W⋆a², W⋆b², W⋆ab) of centered = [a, b] (dim 0),
  // valid mode, taps concatenated per trailing axis: returns (5, ...).
  m.def("moments5(Tensor centered, float[] taps, int[] sizes) -> Tensor");
  // Local std of a padded, centered input, valid mode: returns (out, S1, flat). Sums and
  // V = S2 − S1²/N in double on CPU, compensated in the data's type on CUDA; V <=
  // flat_factor · S2 counts as flat (0, no gradient). S1 is what the backward needs: the
  // CPU's 2D route returns it for values centered on the plane's first row.
  m.def("local_std_fwd(Tensor xp, int[] window, float eps, bool normalize, float flat_factor) -> (Tensor, Tensor, Tensor)");
  // Splatting (docs/maths.md §4) of image (N, C, *S) by displacement (N, D, *S): returns (out, den).
  m.def("splat_fwd(Tensor image, Tensor displacement, bool normalize, float eps) -> (Tensor, Tensor)");
  m.def("splat_bwd(Tensor? v_out, Tensor? v_den, Tensor image, Tensor displacement, Tensor out, Tensor den, bool normalize, float eps) -> (Tensor, Tensor)");
  m.def("local_std_bwd(Tensor grad, Tensor out, Tensor s1, Tensor flat, Tensor xp, int[] window, bool normalize) -> Tensor");
  // Local std of an image (..., H, W) with its padding ("reflect", "mirror", "nearest", "constant":
  // SciPy's names; output (..., H, W)) or "valid", centered and padded on the fly: returns
  // (out, S1, flat) as local_std_fwd. CPU only; elsewhere the caller pads and centers.
  m.def("local_std_2d_fwd(Tensor x, int[] window, str padding, float eps, bool normalize, float flat_factor) -> (Tensor, Tensor, Tensor)");
  m.def("local_std_2d_bwd(Tensor grad, Tensor out, Tensor s1, Tensor flat, Tensor x, int[] window, str padding, bool normalize) -> Tensor");
  // The mutual information's B-spline Parzen joint histogram of a, b (M, P) (weight (M, P)
  // optional; value_range empty: each row's own frame): returns (score (M,), ∂score/∂joint
  // (M, bins, bins), frame (M, 4)); the backward returns the gradients of a and b.
  m.def("parzen_fwd(Tensor a, Tensor b, Tensor? weight, int bins, bool normalize, float[] value_range) -> (Tensor, Tensor, Tensor)");
  m.def("parzen_bwd(Tensor grad_score, Tensor score, Tensor grad_joint, Tensor a, Tensor b, Tensor? weight, Tensor frame, int bins) -> (Tensor, Tensor)");
  // Scaling and squaring: `steps` squarings u ← u + u(x + u(x)) of u = scale · v (v: (N, D,
  // *S), pixels, array-axis order; scale: one factor per component, or empty for none;
  // grid_sampler's bilinear sampling, border padding): returns (the last squaring, saved);
  // saved is (steps, N, D, *S) with keep=True (u and every squaring but the last: the
  // backward's input), (0, N, D, *S) otherwise. The backward returns the gradient with
  // respect to v, base (N, D, *S) added where given: a gradient with respect to u (saved[0])
  // from outside the squarings, which then takes no sum of its own.
  m.def("squaring_fwd(Tensor v, float[] scale, int steps, bool keep) -> (Tensor, Tensor)");
  m.def("squaring_bwd(Tensor grad, Tensor saved, float[] scale, Tensor? base) -> Tensor");
}

}  // namespace simwarp
