// Launchers of cuda/squaring.cu, the kernels of simwarp::squaring_fwd / squaring_bwd
// (scaling and squaring, docs/maths.md §8.3). Raw pointers and a stream, no torch types,
// so the .cu compiles with nvcc alone.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "simwarp/squaring.h"

namespace simwarp {
namespace cuda {

// size holds the D (2 or 3) spatial sizes; fields are (N, D, P). Forward: `steps`
// squarings of u_0 = scale · v, squaring k written to outputs[k] (the caller's buffers;
// outputs[k] may alias outputs[k − 2]), one gather launch each; the first one reads v
// times the scale and, where saved0 is not null, writes u_0 there. Backward: from squaring
// steps − 1 down to 0, a zero fill of buffers[k] and one launch whose threads add, with
// atomics, their pixel's share of the gradient with respect to saved[k] (saved: the
// forward's inputs u_0 … u_{steps − 1}, one field after another; the first squaring's share
// times the scale: the gradient with respect to v, its buffer filled with scale · base
// instead of zeros where base is not null); grad is the gradient of the last squaring's
// output, and the result is in buffers[0]. Instantiated for float and double.
template <typename T>
cudaError_t launch_squaring_forward(const T* v, SquaringScale<T> scale, T* saved0,
                                    T* const* outputs, int64_t steps, int64_t N, int D,
                                    const int64_t* size, cudaStream_t stream);

template <typename T>
cudaError_t launch_squaring_backward(const T* grad, const T* saved, const T* base,
                                     SquaringScale<T> scale, T* const* buffers, int64_t steps,
                                     int64_t N, int D, const int64_t* size,
                                     cudaStream_t stream);

}  // namespace cuda
}  // namespace simwarp
