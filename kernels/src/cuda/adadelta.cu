// torch.optim.Adadelta, one pass over the parameters (cpu::adadelta_step): the squared-gradient
// and squared-update averages and the parameter updated together, one thread per element.
#include "launch.cuh"

#include "ddp/kernels/conv_ops.hpp"

namespace ddp::kernels::cuda {
namespace {

__global__ void adadelta_kernel(float* p, const float* g, float* sq, float* acc, std::size_t n,
                                float lr, float rho, float eps) {
  const float one_minus_rho = 1.0f - rho;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    const float sqi = sq[i] * rho + one_minus_rho * gi * gi;
    const float delta = sqrtf(acc[i] + eps) / sqrtf(sqi + eps) * gi;
    sq[i] = sqi;
    acc[i] = acc[i] * rho + one_minus_rho * delta * delta;
    p[i] -= lr * delta;
  }
}

}  // namespace

void adadelta_step(float* p, const float* g, float* sq, float* acc, std::size_t n, float lr,
                   float rho, float eps, Stream stream) {
  if (n == 0) return;
  adadelta_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(p, g, sq, acc, n, lr, rho,
                                                                        eps);
  DDP_CUDA_CHECK_LAUNCH("adadelta_step");
}

}  // namespace ddp::kernels::cuda
