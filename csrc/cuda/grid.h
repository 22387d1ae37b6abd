// The launch shape of every kernel here: one thread per output element (or per line), in
// blocks of kThreads, and enough blocks to cover n of them. No torch headers: the .cu files
// include it.
#pragma once

#include <cstdint>

namespace simwarp {
namespace cuda {

constexpr int kThreads = 256;

// n must be positive: a launch of zero blocks is an error (the bindings return before
// launching anything on zero-size inputs, checks.h).
inline unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

}  // namespace cuda
}  // namespace simwarp
