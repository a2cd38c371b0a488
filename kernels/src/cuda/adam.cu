// torch.optim.Adam, one pass over the parameters; the bias corrections are computed once on
// the host, in double, as the CPU reference does.
#include <cmath>

#include "launch.cuh"

namespace ddp::kernels::cuda {
namespace {

__global__ void adam_kernel(float* p, const float* g, float* m, float* v, std::size_t n,
                            float step_size, float bc2_sqrt, float beta1, float beta2, float eps) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
  }
}

}  // namespace

void adam_step(float* p, const float* g, float* m, float* v, std::size_t n, float lr, float beta1,
               float beta2, float eps, std::int64_t t, Stream stream) {
  if (n == 0) return;
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
  adam_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(
      p, g, m, v, n, static_cast<float>(lr / bc1), static_cast<float>(std::sqrt(bc2)), beta1, beta2,
      eps);
  DDP_CUDA_CHECK_LAUNCH("adam_step");
}

}  // namespace ddp::kernels::cuda
