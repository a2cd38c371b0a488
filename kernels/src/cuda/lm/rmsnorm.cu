// RMSNorm forward and backward. A warp per row for y, rstd and dx (the row's sum of squares, or
// of dy * w * x, reduced with shuffles); dw by blocks of 32 columns x 16 row groups, each group
// summing every 16th row in order and the groups then added in a fixed order: no atomics, so a
// run repeats bit for bit.
#include "../warp_reduce.cuh"

#include "ddp/kernels/lm_ops.hpp"

namespace ddp::kernels::cuda {
namespace {

constexpr unsigned kDwCols = 32;    // columns per dw block (a warp's width, coalesced)
constexpr unsigned kDwGroups = 16;  // row groups per dw block

__global__ void rmsnorm_forward_kernel(const float* x, const float* w, float* y, float* rstd,
                                       std::size_t rows, std::size_t dim, float eps) {
  const unsigned lane = threadIdx.x % 32;
  for (std::size_t row = detail::warp_start(); row < rows; row += detail::warp_step()) {
    const float* xr = x + row * dim;
    float ss = 0.0f;
    for (std::size_t c = lane; c < dim; c += 32) ss += xr[c] * xr[c];
    ss = detail::warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    float* yr = y + row * dim;
    for (std::size_t c = lane; c < dim; c += 32) yr[c] = xr[c] * rs * w[c];
    if (lane == 0) rstd[row] = rs;
  }
}

// dx_i = rstd * (dy_i w_i - x_i * rstd^2 * mean_j(dy_j w_j x_j)).
__global__ void rmsnorm_backward_dx_kernel(const float* dy, const float* x, const float* w,
                                           const float* rstd, float* dx, std::size_t rows,
                                           std::size_t dim) {
  const unsigned lane = threadIdx.x % 32;
  for (std::size_t row = detail::warp_start(); row < rows; row += detail::warp_step()) {
    const float* dyr = dy + row * dim;
    const float* xr = x + row * dim;
    float dot = 0.0f;
    for (std::size_t c = lane; c < dim; c += 32) dot += dyr[c] * w[c] * xr[c];
    dot = detail::warp_sum(dot);
    const float rs = rstd[row];
    const float coef = rs * rs * dot / static_cast<float>(dim);
    float* dxr = dx + row * dim;
    for (std::size_t c = lane; c < dim; c += 32) dxr[c] = rs * (dyr[c] * w[c] - xr[c] * coef);
  }
}

// Block (kDwCols x kDwGroups threads) per kDwCols columns.
__global__ void rmsnorm_backward_dw_kernel(const float* dy, const float* x, const float* rstd,
                                           float* dw, std::size_t rows, std::size_t dim) {
  __shared__ float partial[kDwGroups][kDwCols];
  for (std::size_t c0 = blockIdx.x * static_cast<std::size_t>(kDwCols); c0 < dim;
       c0 += static_cast<std::size_t>(gridDim.x) * kDwCols) {
    const std::size_t c = c0 + threadIdx.x;
    float acc = 0.0f;
    if (c < dim) {
      for (std::size_t r = threadIdx.y; r < rows; r += kDwGroups) {
        acc += dy[r * dim + c] * x[r * dim + c] * rstd[r];
      }
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < dim) {
      float sum = 0.0f;
      for (unsigned g = 0; g < kDwGroups; ++g) sum += partial[g][threadIdx.x];
      dw[c] += sum;
    }
    __syncthreads();  // before the next chunk overwrites `partial`
  }
}

}  // namespace

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, std::size_t rows,
                     std::size_t dim, float eps, Stream stream) {
  if (rows == 0 || dim == 0) return;
  rmsnorm_forward_kernel<<<detail::blocks_for(rows, detail::kThreads / 32), detail::kThreads, 0,
                           stream>>>(x, w, y, rstd, rows, dim, eps);
  DDP_CUDA_CHECK_LAUNCH("rmsnorm_forward");
}

void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                      float* dw, std::size_t rows, std::size_t dim, Stream stream) {
  if (rows == 0 || dim == 0) return;
  rmsnorm_backward_dx_kernel<<<detail::blocks_for(rows, detail::kThreads / 32), detail::kThreads, 0,
                               stream>>>(dy, x, w, rstd, dx, rows, dim);
  DDP_CUDA_CHECK_LAUNCH("rmsnorm_backward (dx)");
  rmsnorm_backward_dw_kernel<<<detail::blocks_for(dim, kDwCols), dim3(kDwCols, kDwGroups), 0,
                               stream>>>(dy, x, rstd, dw, rows, dim);
  DDP_CUDA_CHECK_LAUNCH("rmsnorm_backward (dw)");
}

}  // namespace ddp::kernels::cuda
