// Token embedding: the forward gathers a table row per token; the backward adds each token's
// gradient row onto its table row. Deterministic without atomics or a sort: one block per
// vocabulary row scans the tokens a tile at a time (skipping tiles where its token is absent)
// and adds the matching rows in row order, which is the CPU reference's order, so the result is
// the same bit for bit.
#include "../launch.cuh"

#include "ddp/kernels/lm_ops.hpp"

namespace ddp::kernels::cuda {
namespace {

__global__ void embedding_forward_kernel(const std::int32_t* tokens, const float* table, float* out,
                                         std::size_t rows, std::size_t dim) {
  const std::size_t n = rows * dim;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = i / dim, c = i % dim;
    out[i] = table[static_cast<std::size_t>(tokens[r]) * dim + c];
  }
}

// Block b handles vocabulary rows b, b + gridDim.x, ...; thread t the columns t, t + blockDim.x,
// ... of it. Per column chunk the tokens go through shared memory blockDim.x at a time.
__global__ void embedding_backward_kernel(const std::int32_t* tokens, const float* dout,
                                          float* dtable, std::size_t rows, std::size_t dim,
                                          std::size_t vocab) {
  __shared__ std::int32_t tile[detail::kThreads];
  for (std::size_t v = blockIdx.x; v < vocab; v += gridDim.x) {  // the same for the whole block
    const auto token = static_cast<std::int32_t>(v);
    for (std::size_t c0 = 0; c0 < dim; c0 += blockDim.x) {
      const std::size_t c = c0 + threadIdx.x;
      float acc = c < dim ? dtable[v * dim + c] : 0.0f;
      bool touched = false;
      for (std::size_t r0 = 0; r0 < rows; r0 += blockDim.x) {
        const std::size_t r = r0 + threadIdx.x;
        const std::int32_t t = r < rows ? tokens[r] : -1;
        tile[threadIdx.x] = t;
        if (__syncthreads_or(t == token) == 0) continue;  // a barrier too: the tile is complete
        const std::size_t n = rows - r0 < blockDim.x ? rows - r0 : blockDim.x;
        if (c < dim) {
          for (std::size_t j = 0; j < n; ++j) {
            if (tile[j] == token) acc += dout[(r0 + j) * dim + c];
          }
        }
        touched = true;
        __syncthreads();  // everyone is done with the tile before it is overwritten
      }
      if (c < dim && touched) dtable[v * dim + c] = acc;
    }
  }
}

}  // namespace

void embedding_forward(const std::int32_t* tokens, const float* table, float* out, std::size_t rows,
                       std::size_t dim, Stream stream) {
  if (rows * dim == 0) return;
  embedding_forward_kernel<<<detail::grid_for(rows * dim), detail::kThreads, 0, stream>>>(
      tokens, table, out, rows, dim);
  DDP_CUDA_CHECK_LAUNCH("embedding_forward");
}

void embedding_backward(const std::int32_t* tokens, const float* dout, float* dtable,
                        std::size_t rows, std::size_t dim, std::size_t vocab, Stream stream) {
  if (rows * dim * vocab == 0) return;
  const auto blocks = static_cast<unsigned>(vocab < 65535 ? vocab : 65535);
  embedding_backward_kernel<<<blocks, detail::kThreads, 0, stream>>>(tokens, dout, dtable, rows,
                                                                     dim, vocab);
  DDP_CUDA_CHECK_LAUNCH("embedding_backward");
}

}  // namespace ddp::kernels::cuda
