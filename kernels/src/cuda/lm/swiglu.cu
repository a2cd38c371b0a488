// SwiGLU's gate, forward and backward, element-wise: s = silu(g) * u with
// silu(x) = x * sigmoid(x); backward dg = ds * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))) and
// du = ds * silu(g).
#include "../launch.cuh"

#include "ddp/kernels/lm_ops.hpp"

namespace ddp::kernels::cuda {
namespace {

__global__ void swiglu_forward_kernel(const float* g, const float* u, float* s, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float x = g[i];
    s[i] = x / (1.0f + expf(-x)) * u[i];
  }
}

__global__ void swiglu_backward_kernel(const float* ds, const float* g, const float* u, float* dg,
                                       float* du, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float x = g[i];
    const float sig = 1.0f / (1.0f + expf(-x));
    const float d = ds[i];
    dg[i] = d * u[i] * sig * (1.0f + x * (1.0f - sig));
    du[i] = d * x * sig;
  }
}

}  // namespace

void swiglu_forward(const float* g, const float* u, float* s, std::size_t n, Stream stream) {
  if (n == 0) return;
  swiglu_forward_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(g, u, s, n);
  DDP_CUDA_CHECK_LAUNCH("swiglu_forward");
}

void swiglu_backward(const float* ds, const float* g, const float* u, float* dg, float* du,
                     std::size_t n, Stream stream) {
  if (n == 0) return;
  swiglu_backward_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(ds, g, u, dg, du, n);
  DDP_CUDA_CHECK_LAUNCH("swiglu_backward");
}

}  // namespace ddp::kernels::cuda
