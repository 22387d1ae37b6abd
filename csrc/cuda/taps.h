// The taps of a correlation pass, handed to a kernel by value: a kernel parameter costs no
// host-to-device copy, no stream synchronization, and is recorded when a CUDA graph is
// captured (torch.compile's "reduce-overhead"). A window of more than kMaxTaps taps runs
// as several launches over consecutive blocks of them, each adding to the last. No torch
// headers: the .cu files include it.
#pragma once

#include <cstdint>

namespace simwarp {
namespace cuda {

constexpr int64_t kMaxTaps = 64;

template <typename T>
struct TapBlock {
  T w[kMaxTaps];
  int64_t first;  // index of w[0] among the pass's taps
  int64_t count;  // taps held, at most kMaxTaps
};

// Taps [first, first + count) of `taps` (host memory), count <= kMaxTaps.
template <typename T>
TapBlock<T> tap_block(const double* taps, int64_t first, int64_t count) {
  TapBlock<T> block{};
  for (int64_t j = 0; j < count; ++j) block.w[j] = static_cast<T>(taps[first + j]);
  block.first = first;
  block.count = count;
  return block;
}

// How many launches a pass of k taps takes.
inline int64_t tap_blocks(int64_t k) { return (k + kMaxTaps - 1) / kMaxTaps; }

// The b-th block of a pass of k taps.
template <typename T>
TapBlock<T> nth_tap_block(const double* taps, int64_t k, int64_t b) {
  const int64_t first = b * kMaxTaps;
  return tap_block<T>(taps, first, k - first < kMaxTaps ? k - first : kMaxTaps);
}

}  // namespace cuda
}  // namespace simwarp
