// Inverted dropout, one thread per element: the mask comes from the counter-based hash of
// conv_ref.hpp (dropout_bits), the very function the CPU reference calls, so both draw the same
// mask for the same (seed, offset) and backward recomputes it instead of storing it.
#include "launch.cuh"

#include "ddp/kernels/conv_ops.hpp"

namespace ddp::kernels::cuda {
namespace {

__global__ void dropout_kernel(const float* x, float* y, std::uint8_t* mask, std::size_t n,
                               std::uint32_t threshold, float scale, std::uint64_t seed,
                               std::uint64_t offset) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const bool keep = dropout_bits(seed, offset + i) >= threshold;
    y[i] = keep ? x[i] * scale : 0.0f;
    if (mask != nullptr) mask[i] = keep ? 1 : 0;
  }
}

}  // namespace

void dropout_forward(const float* x, float* y, std::uint8_t* mask, std::size_t n, float p,
                     std::uint64_t seed, std::uint64_t offset, Stream stream) {
  const std::uint32_t threshold = dropout_threshold(p);  // checks p on every call
  if (n == 0) return;
  dropout_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(
      x, y, mask, n, threshold, dropout_scale(p), seed, offset);
  DDP_CUDA_CHECK_LAUNCH("dropout_forward");
}

void dropout_backward(const float* dy, float* dx, std::size_t n, float p, std::uint64_t seed,
                      std::uint64_t offset, Stream stream) {
  const std::uint32_t threshold = dropout_threshold(p);
  if (n == 0) return;
  dropout_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(
      dy, dx, nullptr, n, threshold, dropout_scale(p), seed, offset);
  DDP_CUDA_CHECK_LAUNCH("dropout_backward");
}

}  // namespace ddp::kernels::cuda
