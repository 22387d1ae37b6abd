// What the CUDA bindings (cuda/*.cpp) share besides their argument checks (../checks.h): a
// launch's cudaError_t as a torch error, the (B, L, R) view of one axis, and the tensor
// passes one op's binding borrows from another's. Torch headers: never included by a .cu.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace simwarp {
namespace cuda {

inline void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, ": ", cudaGetErrorString(err));
}

// A contiguous tensor seen along `dim` as (B, L, R): B lines before it, R values after it.
struct Lines {
  int64_t B, L, R;
};

inline Lines lines_of(const at::Tensor& x, int64_t dim) {
  Lines l{1, x.size(dim), 1};
  for (int64_t d = 0; d < dim; ++d) l.B *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) l.R *= x.size(d);
  return l;
}

// One valid or full window-sum pass along `dim` of a contiguous CUDA tensor, into a new
// contiguous one (box_sum.cpp); local_std.cpp runs its leading axes and its backward on it.
at::Tensor box_pass(const at::Tensor& x, int64_t dim, int64_t k, bool full);

// The correlate op's CUDA implementation (correlate.cpp); moments5.cpp filters its leading
// axes with it.
at::Tensor correlate(const at::Tensor& x, at::ArrayRef<double> taps, at::IntArrayRef sizes,
                     bool transpose);

}  // namespace cuda
}  // namespace simwarp
