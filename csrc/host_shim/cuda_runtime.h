// The host shim: the little of the CUDA runtime that csrc/cuda/ uses, as plain C++, so that
// the .cu kernels and the CUDA bindings build with the host compiler and run on the CPU
// (tests/csrc/test_host_shim.py compares every op so built with the CPU kernels).
//
// The host-shim build (ops/_kernels/_build.py, kind "host_shim") puts this folder first on
// the include path, so `#include <cuda_runtime.h>` finds this file, and defines
// SIMWARP_HOST_SHIM. A launch (cuda/launch.h) runs every block, then every thread of the
// block, in turn, on the calling thread; atomicAdd is a plain add. That is one legal CUDA
// schedule, so it is exact for kernels without shared memory, barriers or warp
// intrinsics: the kernels here use none, and this shim defines none of them
// (__shared__, __syncthreads, __shfl_*), so a kernel that starts to use one fails to build
// here instead of going untested.
#pragma once

#ifndef SIMWARP_HOST_SHIM
#error "csrc/host_shim/cuda_runtime.h is the host shim; build with -DSIMWARP_HOST_SHIM"
#endif

#include <cstddef>

// CUDA's function qualifiers: every function is an ordinary host function here.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
};

inline const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
  }
  return "unknown error";
}

struct CUstream_st;
typedef CUstream_st* cudaStream_t;

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The built-in index variables, set by the shim's launch before each thread runs.
inline thread_local dim3 gridDim, blockDim, blockIdx, threadIdx;

// Each launch reports its configuration error here, as CUDA's launch does.
inline thread_local cudaError_t simwarp_host_shim_last_error = cudaSuccess;

inline cudaError_t cudaGetLastError() {
  const cudaError_t err = simwarp_host_shim_last_error;
  simwarp_host_shim_last_error = cudaSuccess;
  return err;
}

// One thread at a time: an atomic add is an add. Returns the old value, as CUDA's does.
template <typename T>
inline T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}

namespace simwarp {
namespace host_shim {

// CUDA's limits on a one-dimensional launch.
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlocks = 2147483647u;

// kernel(args...) for every thread of `blocks` blocks of `threads`, block by block.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, unsigned blocks, unsigned threads, const Args&... args) {
  if (blocks == 0 || blocks > kMaxBlocks || threads == 0 || threads > kMaxThreadsPerBlock) {
    simwarp_host_shim_last_error = cudaErrorInvalidConfiguration;
    return;
  }
  gridDim = dim3(blocks);
  blockDim = dim3(threads);
  for (unsigned b = 0; b < blocks; ++b) {
    blockIdx = dim3(b);
    for (unsigned t = 0; t < threads; ++t) {
      threadIdx = dim3(t);
      kernel(args...);
    }
  }
}

}  // namespace host_shim
}  // namespace simwarp
