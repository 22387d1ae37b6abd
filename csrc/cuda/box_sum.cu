// CUDA kernel of simwarp::box_sum: window sums along one axis (window_pass.h), as
// compensated sums in the data's type.
#include "box_sum.h"
#include "simwarp/compensated.h"
#include "window_pass.h"

namespace simwarp {
namespace cuda {
namespace {

template <typename T>
struct BoxPolicy {
  using Acc = Compensated<T>;
  const T* x;
  T* out;
  PassIndex at;

  __device__ T load(int64_t b, int64_t j, int64_t r) const { return x[at.in(b, j, r)]; }
  __device__ void store(int64_t b, int64_t i, int64_t r, const Acc& acc) const {
    out[at.out(b, i, r)] = acc.value();
  }
};

}  // namespace

template <typename T>
cudaError_t launch_box_axis(const T* x, T* out, int64_t B, int64_t L, int64_t R, int64_t k,
                            bool full, cudaStream_t stream) {
  const AxisPass pass = axis_pass(B, L, R, k, full);
  return launch_window_pass(pass, BoxPolicy<T>{x, out, pass_index(pass)}, stream);
}

template cudaError_t launch_box_axis<float>(const float*, float*, int64_t, int64_t, int64_t,
                                            int64_t, bool, cudaStream_t);
template cudaError_t launch_box_axis<double>(const double*, double*, int64_t, int64_t, int64_t,
                                             int64_t, bool, cudaStream_t);

}  // namespace cuda
}  // namespace simwarp
