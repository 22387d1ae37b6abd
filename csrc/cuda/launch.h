// How every kernel here is launched: a one-dimensional grid of kThreads-thread blocks with
// one thread per work item, through launch(). Under nvcc that is kernel<<<...>>>; in the
// host-shim build (../host_shim/cuda_runtime.h) it runs every block and thread in turn on
// the CPU, so the kernels' index logic is tested on machines without a GPU. No torch
// headers: the .cu files include it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace simwarp {
namespace cuda {

constexpr int kThreads = 256;
// CUDA's limit on gridDim.x.
constexpr int64_t kMaxBlocks = 2147483647;

// Blocks of kThreads covering n work items.
inline int64_t blocks_for(int64_t n) { return (n + kThreads - 1) / kThreads; }

// A type in a non-deduced context: launch's arguments convert to the kernel's parameters.
template <typename T>
struct same_type {
  using type = T;
};

// kernel(args...) on n threads (n >= 1; the bindings return before launching anything on
// zero-size inputs) on `stream`; the launch's error, as cudaGetLastError gives it.
template <typename... Params>
cudaError_t launch(void (*kernel)(Params...), int64_t n, cudaStream_t stream,
                   typename same_type<Params>::type... args) {
  const int64_t blocks = blocks_for(n);
  if (blocks < 1 || blocks > kMaxBlocks) return cudaErrorInvalidConfiguration;
#ifdef SIMWARP_HOST_SHIM
  (void)stream;
  host_shim::launch(kernel, static_cast<unsigned>(blocks), kThreads, args...);
#else
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args...);
#endif
  return cudaGetLastError();
}

// The global index of the calling thread.
__device__ __forceinline__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

}  // namespace cuda
}  // namespace simwarp
