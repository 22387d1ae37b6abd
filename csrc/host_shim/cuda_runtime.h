// The host shim: the little of the CUDA runtime that csrc/cuda/ uses, as plain C++, so that
// the .cu kernels and the CUDA bindings build with the host compiler and run on the CPU
// (tests/csrc/test_host_shim.py compares every op so built with the CPU kernels).
//
// The host-shim build (ops/_kernels/_build.py, kind "host_shim") puts this folder first on
// the include path, so `#include <cuda_runtime.h>` finds this file, and defines
// SIMWARP_HOST_SHIM. Two launches (cuda/launch.h):
//
// - launch(): every block, then every thread of the block, in turn, on the calling thread;
//   atomicAdd is a plain add. That is one legal CUDA schedule, so it is exact for kernels
//   without shared memory, barriers or warp intrinsics. __syncthreads() called under it
//   fails the launch (cudaErrorLaunchFailure) instead of passing silently.
// - launch_cooperative(): blocks in turn; the threads of a block as fibers (ucontext) on
//   the calling thread, switched at every __syncthreads(). A round resumes each live
//   thread until it reaches the barrier or returns; the next round starts only once every
//   live thread has reached it, so no thread passes a barrier before all have arrived:
//   the guarantee CUDA gives, and every write before it is seen after it (one OS thread).
//   A block whose threads do not all meet the same barriers (some return while others
//   wait, which CUDA leaves undefined) fails the launch with cudaErrorLaunchFailure.
//   Between barriers the threads run one after another, which is again one legal
//   schedule: exact for race-free kernels (a race, a read of what another thread writes in
//   the same phase, gives the result of this one order, which a GPU may not).
//
// Shared memory. Dynamic shared memory (SIMWARP_DYNAMIC_SHARED, cuda/launch.h) is one
// buffer per block, filled with 0xFF bytes (NaN as float or double) before each block:
// a kernel that reads shared memory it has not written in that block sees NaN, as it
// would see garbage on a GPU. Static `__shared__` arrays are function-local
// `static thread_local` here: one per kernel instantiation and OS thread, shared by the
// block's fibers (one OS thread), kept between blocks and launches, not poisoned: a kernel
// must write them before reading them in each block (CUDA leaves them undefined too), and
// the shim cannot see it if one does not; new kernels use the dynamic buffer. No warp
// intrinsics (__shfl_*) are defined, so a kernel that starts to use one fails to build
// here instead of going untested.
#pragma once

#ifndef SIMWARP_HOST_SHIM
#error "csrc/host_shim/cuda_runtime.h is the host shim; build with -DSIMWARP_HOST_SHIM"
#endif

#include <ucontext.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

// CUDA's function qualifiers: every function is an ordinary host function here.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// See "Shared memory" above: per OS thread, shared by a block's fibers.
#define __shared__ static thread_local

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719,
};

inline const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (host shim: a barrier outside a cooperative "
             "launch, or one that not every thread of the block reached)";
  }
  return "unknown error";
}

struct CUstream_st;
typedef CUstream_st* cudaStream_t;

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The built-in index variables, set by the shim's launch before each thread runs (or
// resumes: the fibers of a block share the OS thread, hence these variables).
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
// Each fiber's stack: kernels keep tap blocks (taps.h) and a few locals there.
constexpr std::size_t kFiberStack = 256 * 1024;
// CUDA's default limit on a block's dynamic shared memory (more needs an opt-in there).
constexpr std::size_t kMaxDynamicShared = 48 * 1024;

// The block being run by launch_cooperative on this OS thread (null outside one).
struct Block {
  ucontext_t scheduler;
  std::vector<ucontext_t> threads;
  std::vector<unsigned char> done;
  unsigned current = 0;
  bool failed = false;
  const std::function<void()>* body = nullptr;
};
inline thread_local Block* cooperative_block = nullptr;
// The dynamic shared memory of the block being run (SIMWARP_DYNAMIC_SHARED).
inline thread_local std::vector<unsigned char> dynamic_shared_buffer;
// Fiber stacks, kept between launches on this OS thread.
inline thread_local std::vector<std::unique_ptr<char[]>> fiber_stacks;

inline void* dynamic_shared() { return dynamic_shared_buffer.data(); }

// The barrier: back to the scheduler, which resumes this thread in the next round, once
// every live thread of the block has reached a barrier.
inline void sync_threads() {
  Block* block = cooperative_block;
  if (block == nullptr) {  // launch(): threads run to completion, a barrier cannot hold
    simwarp_host_shim_last_error = cudaErrorLaunchFailure;
    return;
  }
  swapcontext(&block->threads[block->current], &block->scheduler);
}

inline void fiber_entry() {
  Block* block = cooperative_block;
  (*block->body)();
  block->done[block->current] = 1;
  // returning resumes uc_link, the scheduler
}

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

// kernel(args...) on `blocks` blocks of `threads` threads, whose threads may meet at
// __syncthreads(), with `shared_bytes` of dynamic shared memory per block (see the top).
template <typename Kernel, typename... Args>
void launch_cooperative(Kernel kernel, unsigned blocks, unsigned threads,
                        std::size_t shared_bytes, const Args&... args) {
  if (blocks == 0 || blocks > kMaxBlocks || threads == 0 || threads > kMaxThreadsPerBlock ||
      shared_bytes > kMaxDynamicShared || cooperative_block != nullptr) {
    simwarp_host_shim_last_error = cudaErrorInvalidConfiguration;
    return;
  }
  while (fiber_stacks.size() < threads)
    fiber_stacks.emplace_back(new char[kFiberStack]);
  const std::function<void()> body = [&]() { kernel(args...); };
  Block block;
  block.threads.resize(threads);
  block.done.resize(threads);
  block.body = &body;
  cooperative_block = &block;
  gridDim = dim3(blocks);
  blockDim = dim3(threads);
  dynamic_shared_buffer.assign(shared_bytes, 0xFF);
  for (unsigned b = 0; b < blocks && !block.failed; ++b) {
    blockIdx = dim3(b);
    std::memset(dynamic_shared_buffer.data(), 0xFF, shared_bytes);
    for (unsigned t = 0; t < threads; ++t) {
      ucontext_t& ctx = block.threads[t];
      getcontext(&ctx);
      ctx.uc_stack.ss_sp = fiber_stacks[t].get();
      ctx.uc_stack.ss_size = kFiberStack;
      ctx.uc_link = &block.scheduler;
      makecontext(&ctx, &fiber_entry, 0);
      block.done[t] = 0;
    }
    unsigned live = threads;
    while (live > 0) {  // one round: every live thread to its next barrier or its end
      unsigned finished = 0;
      for (unsigned t = 0; t < threads; ++t) {
        if (block.done[t]) continue;
        block.current = t;
        threadIdx = dim3(t);
        swapcontext(&block.scheduler, &block.threads[t]);
        finished += block.done[t];
      }
      // Some returned while others wait at a barrier: the barrier is not met by all.
      if (finished != 0 && finished != live) block.failed = true;
      live -= finished;
    }
  }
  cooperative_block = nullptr;
  if (block.failed) simwarp_host_shim_last_error = cudaErrorLaunchFailure;
}

}  // namespace host_shim
}  // namespace simwarp

// CUDA's block barrier (see launch_cooperative above).
inline void __syncthreads() { simwarp::host_shim::sync_threads(); }
