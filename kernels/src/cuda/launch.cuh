// What every kernel file shares: the check macros (DDP_CUDA_CHECK_LAUNCH after each launch) and
// the grid of a grid-stride loop.
#pragma once

#include <cuda_runtime.h>

#include "ddp/kernels/check.hpp"
#include "ddp/kernels/cuda_ops.hpp"

namespace ddp::kernels::cuda::detail {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill the device, never zero.
inline unsigned grid_for(std::size_t n) {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 8192 ? (blocks == 0 ? 1 : blocks) : 8192);
}

}  // namespace ddp::kernels::cuda::detail
