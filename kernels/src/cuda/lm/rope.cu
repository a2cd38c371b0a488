// Rotary position embedding (LLaMA's interleaved pairs), forward and backward in place: a
// thread per (row, head, pair). The angle is computed in fp32 exactly as cpu::rope_forward and
// torch's precompute_freqs_cis do: freq = 1 / powf(theta, float(2j) / float(head_dim)),
// angle = float(pos) * freq. Backward rotates by -angle.
#include <string>

#include "../launch.cuh"

#include "ddp/kernels/lm_ops.hpp"

namespace ddp::kernels::cuda {
namespace {

// direction +1 rotates by +angle (forward), -1 by -angle (backward).
__global__ void rope_kernel(float* x, std::size_t rows, std::size_t seq, std::size_t heads,
                            std::size_t head_dim, float theta, float direction) {
  const std::size_t half = head_dim / 2;
  const std::size_t n = rows * heads * half;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t j = i % half;
    const std::size_t t = i / half;  // row * heads + head
    const std::size_t row = t / heads;
    const std::size_t pos = row % seq;
    const float freq = 1.0f / powf(theta, static_cast<float>(2 * j) / static_cast<float>(head_dim));
    const float angle = static_cast<float>(pos) * freq;
    const float cs = cosf(angle), sn = direction * sinf(angle);
    float* p = x + t * head_dim + 2 * j;  // row * heads * head_dim + head * head_dim + 2j
    const float a = p[0], b = p[1];
    p[0] = a * cs - b * sn;
    p[1] = a * sn + b * cs;
  }
}

void rope(float* x, std::size_t rows, std::size_t seq, std::size_t heads, std::size_t head_dim,
          float theta, float direction, const char* name, Stream stream) {
  if (head_dim % 2 != 0) {
    DDP_THROW(::ddp::ConfigError,
              std::string(name) + ": head_dim " + std::to_string(head_dim) + " is odd");
  }
  if (rows * heads * head_dim == 0 || seq == 0) return;
  rope_kernel<<<detail::grid_for(rows * heads * (head_dim / 2)), detail::kThreads, 0, stream>>>(
      x, rows, seq, heads, head_dim, theta, direction);
  DDP_CUDA_CHECK_LAUNCH("rope");
}

}  // namespace

void rope_forward(float* x, std::size_t rows, std::size_t seq, std::size_t heads,
                  std::size_t head_dim, float theta, Stream stream) {
  rope(x, rows, seq, heads, head_dim, theta, 1.0f, "rope_forward", stream);
}

void rope_backward(float* dx, std::size_t rows, std::size_t seq, std::size_t heads,
                   std::size_t head_dim, float theta, Stream stream) {
  rope(dx, rows, seq, heads, head_dim, theta, -1.0f, "rope_backward", stream);
}

}  // namespace ddp::kernels::cuda
