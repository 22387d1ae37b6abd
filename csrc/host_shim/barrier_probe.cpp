// A test op of the host-shim build only (tests/csrc/test_host_shim.py): a block-level tree
// reduction in dynamic shared memory, whose result is right only if every __syncthreads()
// holds every thread of the block until all have reached it. It proves that the shim's
// cooperative launch enforces the barrier (with the barrier skipped, thread 0 reads its
// partners' slots before they are written: NaN, the shim's shared-memory fill), and that
// it refuses barriers it cannot honour. Registered as simwarp_host_shim::barrier_probe.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "launch.h"

namespace simwarp {
namespace host_shim_probe {
namespace {

// mode 0: no barrier; 1: a barrier after each step; 2: the barrier in the first threads
// only (a divergent barrier).
__global__ void block_sums_kernel(const double* x, double* out, int64_t n, int64_t mode) {
  SIMWARP_DYNAMIC_SHARED(double, partial);
  const unsigned t = threadIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + t;
  partial[t] = i < n ? x[i] : 0.0;
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (mode == 1 || (mode == 2 && t < 4)) __syncthreads();
    if (t < stride) partial[t] += partial[t + stride];
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}

// The same reduction in a static __shared__ array (with the barrier): the shim's other kind
// of shared memory (cuda_runtime.h: a static thread_local, not refilled between blocks).
__global__ void block_sums_static_kernel(const double* x, double* out, int64_t n) {
  __shared__ double partial[1024];
  const unsigned t = threadIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + t;
  partial[t] = i < n ? x[i] : 0.0;
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    __syncthreads();
    if (t < stride) partial[t] += partial[t + stride];
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}

// One sum per block of `threads` (a power of two) consecutive elements of x (float64,
// 1-D). mode 0-2 as the kernel's, launched cooperatively; mode 3: mode 1's kernel through
// the plain launch(), which cannot honour a barrier and must fail; mode 4: the static
// __shared__ kernel, launched cooperatively.
at::Tensor barrier_probe(const at::Tensor& x_in, int64_t threads, int64_t mode) {
  TORCH_CHECK(x_in.dim() == 1 && x_in.scalar_type() == at::kDouble && x_in.numel() > 0,
              "barrier_probe: x must be a non-empty 1-D float64 tensor");
  TORCH_CHECK(threads >= 1 && threads <= 1024 && (threads & (threads - 1)) == 0,
              "barrier_probe: threads must be a power of two up to 1024, got ", threads);
  TORCH_CHECK(mode >= 0 && mode <= 4, "barrier_probe: mode must be 0 to 4, got ", mode);
  const at::Tensor x = x_in.contiguous();
  const int64_t n = x.numel(), blocks = (n + threads - 1) / threads;
  at::Tensor out = at::empty({blocks}, x.options());
  cudaError_t err;
  if (mode == 3) {
    host_shim::launch(&block_sums_kernel, static_cast<unsigned>(blocks),
                      static_cast<unsigned>(threads), x.data_ptr<double>(),
                      out.data_ptr<double>(), n, int64_t{1});
    err = cudaGetLastError();
  } else if (mode == 4) {
    err = cuda::launch_cooperative(&block_sums_static_kernel, blocks, static_cast<int>(threads),
                                   0, nullptr, x.data_ptr<double>(), out.data_ptr<double>(), n);
  } else {
    err = cuda::launch_cooperative(&block_sums_kernel, blocks, static_cast<int>(threads),
                                   threads * sizeof(double), nullptr, x.data_ptr<double>(),
                                   out.data_ptr<double>(), n, mode);
  }
  TORCH_CHECK(err == cudaSuccess, "barrier_probe: ", cudaGetErrorString(err));
  return out;
}

}  // namespace
}  // namespace host_shim_probe
}  // namespace simwarp

TORCH_LIBRARY_FRAGMENT(simwarp_host_shim, m) {
  m.def("barrier_probe(Tensor x, int threads, int mode) -> Tensor");
}

TORCH_LIBRARY_IMPL(simwarp_host_shim, CPU, m) {
  m.impl("barrier_probe", &simwarp::host_shim_probe::barrier_probe);
}
