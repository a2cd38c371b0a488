// Softmax cross-entropy, forward and backward in one pass per row: a warp per row, the max and
// the sum of exponentials reduced with shuffles (stable: the max is subtracted).
#include "launch.cuh"

namespace ddp::kernels::cuda {
namespace {

__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void softmax_xent_kernel(const float* logits, const std::uint8_t* labels, float* dlogits,
                                    float* loss_rows, std::size_t rows, std::size_t classes,
                                    float scale) {
  const std::size_t warps_per_block = blockDim.x / 32;
  const std::size_t row = blockIdx.x * warps_per_block + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps leave together
  const float* z = logits + row * classes;
  float* dz = dlogits + row * classes;
  float zmax = -INFINITY;
  for (std::size_t c = lane; c < classes; c += 32) zmax = fmaxf(zmax, z[c]);
  zmax = warp_max(zmax);
  float sum = 0.0f;
  for (std::size_t c = lane; c < classes; c += 32) sum += expf(z[c] - zmax);
  sum = warp_sum(sum);
  const float log_sum = logf(sum);
  const std::size_t label = labels[row];
  for (std::size_t c = lane; c < classes; c += 32) {
    const float p = expf(z[c] - zmax - log_sum);
    dz[c] = scale * (p - (c == label ? 1.0f : 0.0f));
  }
  if (lane == 0) loss_rows[row] = log_sum - (z[label] - zmax);
}

}  // namespace

void softmax_xent(const float* logits, const std::uint8_t* labels, float* dlogits, float* loss_rows,
                  std::size_t rows, std::size_t classes, float scale, Stream stream) {
  if (rows == 0 || classes == 0) return;
  constexpr unsigned kWarps = detail::kThreads / 32;
  const auto blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  softmax_xent_kernel<<<blocks, detail::kThreads, 0, stream>>>(logits, labels, dlogits, loss_rows,
                                                               rows, classes, scale);
  DDP_CUDA_CHECK_LAUNCH("softmax_xent");
}

}  // namespace ddp::kernels::cuda
