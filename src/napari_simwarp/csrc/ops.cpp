// Schemas of every simwarp custom op, defined once. Implementations register per dispatch
// key in cpu/*.cpp (always) and cuda/bindings.cpp (when built with CUDA); fake (meta)
// implementations and autograd formulas are registered from Python (ops/_compiled.py).
#include <torch/library.h>

TORCH_LIBRARY(simwarp, m) {
  // Window sums over the trailing len(window) axes; full=True is the adjoint (zero-padded).
  m.def("box_sum(Tensor x, int[] window, bool full=False) -> Tensor");
  // Separable correlation over the trailing len(sizes) axes, taps concatenated per axis;
  // transpose=True is the adjoint of the valid correlation (output grows by k − 1).
  m.def("correlate(Tensor x, float[] taps, int[] sizes, bool transpose=False) -> Tensor");
  // Local std on a padded input, valid mode: returns (out, S1, S2).
  m.def("local_std_fwd(Tensor xp, int[] window, float eps, bool normalized) -> (Tensor, Tensor, Tensor)");
  m.def("local_std_bwd(Tensor grad, Tensor out, Tensor s1, Tensor s2, Tensor xp, int[] window, bool normalized) -> Tensor");
}
