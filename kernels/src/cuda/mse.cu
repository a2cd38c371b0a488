// Mean-squared error, forward and backward: a warp per row writes the row's gradient and its sum
// of squares (the host adds the rows in double, as the CPU reference does).
#include "launch.cuh"

namespace ddp::kernels::cuda {
namespace {

__global__ void mse_kernel(const float* y, const float* t, float* dy, float* sq_rows,
                           std::size_t rows, std::size_t cols, float scale) {
  const std::size_t warps_per_block = blockDim.x / 32;
  const std::size_t row = blockIdx.x * warps_per_block + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (row >= rows) return;
  float acc = 0.0f;
  for (std::size_t c = lane; c < cols; c += 32) {
    const std::size_t i = row * cols + c;
    const float d = y[i] - t[i];
    acc += d * d;
    dy[i] = scale * 2.0f * d;
  }
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) sq_rows[row] = acc;
}

}  // namespace

void mse(const float* y, const float* t, float* dy, float* sq_rows, std::size_t rows,
         std::size_t cols, float scale, Stream stream) {
  if (rows == 0 || cols == 0) return;
  constexpr unsigned kWarps = detail::kThreads / 32;
  const auto blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  mse_kernel<<<blocks, detail::kThreads, 0, stream>>>(y, t, dy, sq_rows, rows, cols, scale);
  DDP_CUDA_CHECK_LAUNCH("mse");
}

}  // namespace ddp::kernels::cuda
