// x *= factor: averaging all-reduced gradients over the ranks.
#include "launch.cuh"

namespace ddp::kernels::cuda {
namespace {

__global__ void scale_kernel(float* x, std::size_t n, float factor) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    x[i] *= factor;
  }
}

}  // namespace

void scale(float* x, std::size_t n, float factor, Stream stream) {
  if (n == 0) return;
  scale_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(x, n, factor);
  DDP_CUDA_CHECK_LAUNCH("scale");
}

}  // namespace ddp::kernels::cuda
