// Warp and block reductions, and the grid of a warp-per-row loop, shared by the transformer's
// kernels (rmsnorm.cu, attention.cu, lm_xent.cu). Butterfly shuffles: every lane gets the result,
// and the order of the additions is fixed, so a sum repeats bit for bit.
#pragma once

#include "launch.cuh"

namespace ddp::kernels::cuda::detail {

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sum (or max) over the whole block, returned to every thread. blockDim.x is a multiple of
// 32, at most 1024; `scratch` is 32 floats of shared memory, free again when this returns.
__device__ inline float block_sum(float v, float* scratch) {
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warp_sum(lane < warps ? scratch[lane] : 0.0f);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  v = scratch[0];
  __syncthreads();
  return v;
}

__device__ inline float block_max(float v, float* scratch) {
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warp_max(lane < warps ? scratch[lane] : -INFINITY);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  v = scratch[0];
  __syncthreads();
  return v;
}

// The first warp of this thread and the number of warps in the grid, for a loop that gives each
// warp whole rows (the loop's condition is the same for every lane, so warps leave whole).
__device__ inline std::size_t warp_start() {
  return (blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x) / 32;
}
__device__ inline std::size_t warp_step() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x / 32;
}

// Blocks for `n` items of which a block handles `per_block` at a time: never zero, at most
// 65535 (the loops stride over the rest).
inline unsigned blocks_for(std::size_t n, std::size_t per_block) {
  const std::size_t blocks = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 65535 ? (blocks == 0 ? 1 : blocks) : 65535);
}

}  // namespace ddp::kernels::cuda::detail
