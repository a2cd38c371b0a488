// Bias add fused with the activation (forward), and the activation's backward.
#include "launch.cuh"

namespace ddp::kernels::cuda {
namespace {

__global__ void bias_act_forward_kernel(float* y, const float* b, std::size_t rows,
                                        std::size_t cols, int act) {
  const std::size_t n = rows * cols;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float v = y[i] + b[i % cols];
    if (act == 1) v = v > 0.0f ? v : 0.0f;
    if (act == 2) v = 1.0f / (1.0f + expf(-v));
    y[i] = v;
  }
}

__global__ void act_backward_kernel(float* dy, const float* y, std::size_t n, int act) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    if (act == 1) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
    if (act == 2) dy[i] *= y[i] * (1.0f - y[i]);
  }
}

}  // namespace

void bias_act_forward(float* y, const float* b, std::size_t rows, std::size_t cols, Act act,
                      Stream stream) {
  if (rows * cols == 0) return;
  bias_act_forward_kernel<<<detail::grid_for(rows * cols), detail::kThreads, 0, stream>>>(
      y, b, rows, cols, static_cast<int>(act));
  DDP_CUDA_CHECK_LAUNCH("bias_act_forward");
}

void act_backward(float* dy, const float* y, std::size_t n, Act act, Stream stream) {
  if (n == 0 || act == Act::none) return;
  act_backward_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(dy, y, n,
                                                                            static_cast<int>(act));
  DDP_CUDA_CHECK_LAUNCH("act_backward");
}

}  // namespace ddp::kernels::cuda
