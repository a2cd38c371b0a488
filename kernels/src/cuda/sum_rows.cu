// Column sums of a [rows][cols] gradient into the bias gradient: one thread per column, so a
// warp reads 32 neighbouring floats of a row at a time.
#include "launch.cuh"

namespace ddp::kernels::cuda {
namespace {

__global__ void sum_rows_kernel(const float* dy, float* db, std::size_t rows, std::size_t cols) {
  for (std::size_t c = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (std::size_t r = 0; r < rows; ++r) acc += dy[r * cols + c];
    db[c] += acc;
  }
}

}  // namespace

void sum_rows(const float* dy, float* db, std::size_t rows, std::size_t cols, Stream stream) {
  if (rows == 0 || cols == 0) return;
  sum_rows_kernel<<<detail::grid_for(cols), detail::kThreads, 0, stream>>>(dy, db, rows, cols);
  DDP_CUDA_CHECK_LAUNCH("sum_rows");
}

}  // namespace ddp::kernels::cuda
