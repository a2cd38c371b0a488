// fp32 <-> bf16 casts (round to nearest even), for bf16 compute with fp32 master weights.
#include <cuda_bf16.h>

#include "launch.cuh"

namespace ddp::kernels::cuda {
namespace {

__global__ void f32_to_bf16_kernel(const float* in, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
  }
}

__global__ void bf16_to_f32_kernel(const std::uint16_t* in, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    out[i] = __bfloat162float(__ushort_as_bfloat16(in[i]));
  }
}

}  // namespace

void f32_to_bf16(const float* in, std::uint16_t* out, std::size_t n, Stream stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(in, out, n);
  DDP_CUDA_CHECK_LAUNCH("f32_to_bf16");
}

void bf16_to_f32(const std::uint16_t* in, float* out, std::size_t n, Stream stream) {
  if (n == 0) return;
  bf16_to_f32_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(in, out, n);
  DDP_CUDA_CHECK_LAUNCH("bf16_to_f32");
}

}  // namespace ddp::kernels::cuda
