// The language model's cross-entropy, forward and backward in one pass per row: a block per
// row (any vocabulary size), the max and the sum of exponentials reduced over the block in a
// fixed order (stable: the max is subtracted), so runs repeat bit for bit. A target outside
// [0, vocab) gives a NaN loss and no one-hot (nothing is read out of bounds).
#include "../warp_reduce.cuh"

#include "ddp/kernels/lm_ops.hpp"

namespace ddp::kernels::cuda {
namespace {

__global__ void lm_xent_kernel(const float* logits, const std::int32_t* targets, float* dlogits,
                               float* loss_rows, std::size_t rows, std::size_t vocab, float scale) {
  __shared__ float scratch[32];
  for (std::size_t row = blockIdx.x; row < rows; row += gridDim.x) {  // the same for the block
    const float* z = logits + row * vocab;
    float zmax = -INFINITY;
    for (std::size_t c = threadIdx.x; c < vocab; c += blockDim.x) zmax = fmaxf(zmax, z[c]);
    zmax = detail::block_max(zmax, scratch);
    float sum = 0.0f;
    for (std::size_t c = threadIdx.x; c < vocab; c += blockDim.x) sum += expf(z[c] - zmax);
    sum = detail::block_sum(sum, scratch);
    const float log_sum = logf(sum);
    const std::int32_t t = targets[row];
    const bool valid = t >= 0 && static_cast<std::size_t>(t) < vocab;
    const std::size_t target = valid ? static_cast<std::size_t>(t) : vocab;  // vocab: none
    if (dlogits != nullptr) {  // as the reference: exp(z - max) * (scale / sum) - scale onehot
      const float factor = scale / sum;
      float* dz = dlogits + row * vocab;
      for (std::size_t c = threadIdx.x; c < vocab; c += blockDim.x) {
        const float p = expf(z[c] - zmax) * factor;
        dz[c] = c == target ? p - scale : p;
      }
    }
    if (threadIdx.x == 0) loss_rows[row] = valid ? log_sum - (z[target] - zmax) : NAN;
  }
}

}  // namespace

void lm_cross_entropy(const float* logits, const std::int32_t* targets, float* dlogits,
                      float* loss_rows, std::size_t rows, std::size_t vocab, float scale,
                      Stream stream) {
  if (rows == 0 || vocab == 0) return;
  lm_xent_kernel<<<detail::blocks_for(rows, 1), detail::kThreads, 0, stream>>>(
      logits, targets, dlogits, loss_rows, rows, vocab, scale);
  DDP_CUDA_CHECK_LAUNCH("lm_cross_entropy");
}

}  // namespace ddp::kernels::cuda
