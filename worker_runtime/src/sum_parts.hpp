// The reduction of the sharded collectives (gloo, shm): out = ((src[0] + src[1]) + src[2]) + ...,
// elementwise, in rank order, through a block on the stack, so out may be one of the sources.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace ddp::worker::detail {

inline constexpr std::size_t kSumBlock = 2048;  // floats: 8 KiB, stays in L1

// A fixed trip count, so that -O2 (GCC's very-cheap vectorizer model) vectorizes it.
inline void add_block(float* __restrict acc, const float* __restrict s) {
  for (std::size_t i = 0; i < kSumBlock; ++i) acc[i] += s[i];
}

inline void add_tail(float* __restrict acc, const float* __restrict s, std::size_t m) {
  for (std::size_t i = 0; i < m; ++i) acc[i] += s[i];
}

// srcs[0..n) each hold `count` floats; n >= 1.
inline void sum_in_rank_order(const float* const* srcs, int n, float* out, std::size_t count) {
  alignas(64) float acc[kSumBlock];
  for (std::size_t b = 0; b < count; b += kSumBlock) {
    const std::size_t m = std::min(kSumBlock, count - b);
    std::memcpy(acc, srcs[0] + b, m * sizeof(float));
    for (int k = 1; k < n; ++k) {
      if (m == kSumBlock) {
        add_block(acc, srcs[k] + b);
      } else {
        add_tail(acc, srcs[k] + b, m);
      }
    }
    std::memcpy(out + b, acc, m * sizeof(float));
  }
}

}  // namespace ddp::worker::detail
