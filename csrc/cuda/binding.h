// What the CUDA bindings (cuda/*.cpp) share besides their argument checks (../checks.h): a
// launch's cudaError_t as a torch error, the (B, L, R) view of one axis, the device guard
// and stream, the registration block, and the tensor passes one op's binding borrows from
// another's. Torch headers: never included by a .cu.
//
// The host-shim build (SIMWARP_HOST_SHIM, ../host_shim/cuda_runtime.h) compiles these
// bindings as they are, on CPU tensors: no device to guard, no stream, and the ops
// registered as the CPU implementations of the simwarp_host_shim library instead of the
// CUDA ones of simwarp, so that tests call both sides of every op in one process.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#ifndef SIMWARP_HOST_SHIM
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstdint>

#ifdef SIMWARP_HOST_SHIM
#define SIMWARP_CUDA_LIBRARY_IMPL(m) TORCH_LIBRARY_IMPL(simwarp_host_shim, CPU, m)
#define SIMWARP_CUDA_ONLY_SCHEMAS(m) TORCH_LIBRARY_FRAGMENT(simwarp_host_shim, m)
#else
#define SIMWARP_CUDA_LIBRARY_IMPL(m) TORCH_LIBRARY_IMPL(simwarp, CUDA, m)
// The schemas of the ops with a CUDA implementation only (no CPU twin: the CPU runs the
// public op through other primitives), defined where they are implemented, so that the CPU
// library never holds an op it cannot run (tests/csrc/test_cuda_sources.py: CUDA_ONLY).
#define SIMWARP_CUDA_ONLY_SCHEMAS(m) TORCH_LIBRARY_FRAGMENT(simwarp, m)
#endif

namespace simwarp {
namespace cuda {

#ifdef SIMWARP_HOST_SHIM
struct DeviceGuard {
  explicit DeviceGuard(c10::Device) {}
};
inline cudaStream_t current_stream() { return nullptr; }
#else
using DeviceGuard = c10::cuda::CUDAGuard;
inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
#endif

inline void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, ": ", cudaGetErrorString(err));
}

// A contiguous tensor seen along `dim` as (B, L, R): B lines before it, R values after it.
struct Lines {
  int64_t B, L, R;
};

inline Lines lines_of(at::IntArrayRef sizes, int64_t dim) {
  Lines l{1, sizes[dim], 1};
  for (int64_t d = 0; d < dim; ++d) l.B *= sizes[d];
  for (int64_t d = dim + 1; d < static_cast<int64_t>(sizes.size()); ++d) l.R *= sizes[d];
  return l;
}

inline Lines lines_of(const at::Tensor& x, int64_t dim) { return lines_of(x.sizes(), dim); }

// One valid or full window-sum pass along `dim` of a contiguous tensor, into a new
// contiguous one (box_sum.cpp).
at::Tensor box_pass(const at::Tensor& x, int64_t dim, int64_t k, bool full);

// One correlation pass (valid, or its transpose) along `dim` of a contiguous tensor with
// the k taps at `taps` (host memory), into a new contiguous one (correlate.cpp); moments5.cpp
// filters its leading axes with it.
at::Tensor correlate_pass(const at::Tensor& x, int64_t dim, const double* taps, int64_t k,
                          bool transpose);

}  // namespace cuda
}  // namespace simwarp
