// How every kernel here is launched: a one-dimensional grid of kThreads-thread blocks with
// one thread per work item, through launch(); or, for the tiled kernels whose threads
// share memory and meet at barriers, a one-dimensional grid of blocks of a chosen size with
// dynamic shared memory, through launch_cooperative(). Under nvcc that is
// kernel<<<...>>>; in the host-shim build (../host_shim/cuda_runtime.h) launch() runs
// every block and thread in turn on the CPU, and launch_cooperative() the threads of each
// block as fibers that switch at every __syncthreads(), so the kernels' index logic and
// barriers are tested on machines without a GPU. No torch headers: the .cu files include
// it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
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

// kernel(args...) on `blocks` blocks of `threads` threads (at most 1024) with
// `shared_bytes` (at most 48 KiB, CUDA's limit without an opt-in) of dynamic shared memory
// each (SIMWARP_DYNAMIC_SHARED), on `stream`; the launch's error.
template <typename... Params>
cudaError_t launch_cooperative(void (*kernel)(Params...), int64_t blocks, int threads,
                               size_t shared_bytes, cudaStream_t stream,
                               typename same_type<Params>::type... args) {
  if (blocks < 1 || blocks > kMaxBlocks || threads < 1 || threads > 1024 ||
      shared_bytes > 48 * 1024)
    return cudaErrorInvalidConfiguration;
#ifdef SIMWARP_HOST_SHIM
  (void)stream;
  host_shim::launch_cooperative(kernel, static_cast<unsigned>(blocks),
                                static_cast<unsigned>(threads), shared_bytes, args...);
#else
  kernel<<<static_cast<unsigned>(blocks), threads, shared_bytes, stream>>>(args...);
#endif
  return cudaGetLastError();
}

// `T* name`: the block's dynamic shared memory (launch_cooperative's shared_bytes), 16-byte
// aligned. In the host shim, one buffer per block, NaN-filled (0xFF bytes) at its start.
#ifdef SIMWARP_HOST_SHIM
#define SIMWARP_DYNAMIC_SHARED(T, name) \
  T* name = reinterpret_cast<T*>(::simwarp::host_shim::dynamic_shared())
#else
#define SIMWARP_DYNAMIC_SHARED(T, name)                          \
  extern __shared__ __align__(16) unsigned char simwarp_smem_[]; \
  T* name = reinterpret_cast<T*>(simwarp_smem_)
#endif

// The global index of the calling thread.
__device__ __forceinline__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

}  // namespace cuda
}  // namespace simwarp
