// torch.optim.SGD with momentum, one pass over the parameters.
#include "launch.cuh"

namespace ddp::kernels::cuda {
namespace {

__global__ void sgd_kernel(float* p, const float* g, float* buf, std::size_t n, float lr,
                           float momentum, bool first_step) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    if (buf == nullptr) {
      p[i] -= lr * g[i];
    } else {
      const float b = first_step ? g[i] : momentum * buf[i] + g[i];
      buf[i] = b;
      p[i] -= lr * b;
    }
  }
}

}  // namespace

void sgd_step(float* p, const float* g, float* buf, std::size_t n, float lr, float momentum,
              bool first_step, Stream stream) {
  if (n == 0) return;
  sgd_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(
      p, g, momentum == 0.0f ? nullptr : buf, n, lr, momentum, first_step);
  DDP_CUDA_CHECK_LAUNCH("sgd_step");
}

}  // namespace ddp::kernels::cuda
