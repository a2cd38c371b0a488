// k x k max-pool with stride k: forward one thread per output (PyTorch's scan: a NaN wins, else
// the first maximum), backward one thread per input element, so dx is written whole without a
// memset or atomics. The reference is cpu::maxpool_forward / cpu::maxpool_backward.
#include "launch.cuh"

#include "ddp/kernels/conv_ops.hpp"

namespace ddp::kernels::cuda {
namespace {

struct Dims {
  std::size_t planes, in_h, in_w, k, out_h, out_w;
};

__global__ void maxpool_forward_kernel(const float* x, float* y, std::int32_t* argmax, Dims d) {
  const std::size_t total = d.planes * d.out_h * d.out_w;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t ox = i % d.out_w;
    const std::size_t oy = (i / d.out_w) % d.out_h;
    const std::size_t p = i / (d.out_w * d.out_h);
    const float* xp = x + p * d.in_h * d.in_w;
    std::size_t best = oy * d.k * d.in_w + ox * d.k;
    float top = -INFINITY;
    for (std::size_t ky = 0; ky < d.k; ++ky) {
      for (std::size_t kx = 0; kx < d.k; ++kx) {
        const std::size_t at = (oy * d.k + ky) * d.in_w + ox * d.k + kx;
        const float v = xp[at];
        if (v > top || isnan(v)) {
          top = v;
          best = at;
        }
      }
    }
    y[i] = top;
    argmax[i] = static_cast<std::int32_t>(best);
  }
}

__global__ void maxpool_backward_kernel(const float* dy, const std::int32_t* argmax, float* dx,
                                        Dims d) {
  const std::size_t total = d.planes * d.in_h * d.in_w;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t ix = i % d.in_w;
    const std::size_t iy = (i / d.in_w) % d.in_h;
    const std::size_t p = i / (d.in_w * d.in_h);
    const std::size_t oy = iy / d.k, ox = ix / d.k;
    float g = 0.0f;
    if (oy < d.out_h && ox < d.out_w) {  // rows and columns past the last window get nothing
      const std::size_t j = (p * d.out_h + oy) * d.out_w + ox;
      if (static_cast<std::size_t>(argmax[j]) == iy * d.in_w + ix) g = dy[j];
    }
    dx[i] = g;
  }
}

Dims dims_of(const PoolShape& s) { return {s.planes, s.in_h, s.in_w, s.k, s.out_h(), s.out_w()}; }

}  // namespace

void maxpool_forward(const float* x, float* y, std::int32_t* argmax, const PoolShape& s,
                     Stream stream) {
  check_shape(s);
  const std::size_t n = s.y_size();
  if (n == 0) return;
  maxpool_forward_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(x, y, argmax,
                                                                               dims_of(s));
  DDP_CUDA_CHECK_LAUNCH("maxpool_forward");
}

void maxpool_backward(const float* dy, const std::int32_t* argmax, float* dx, const PoolShape& s,
                      Stream stream) {
  check_shape(s);
  const std::size_t n = s.x_size();
  if (n == 0) return;
  maxpool_backward_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(dy, argmax, dx,
                                                                                dims_of(s));
  DDP_CUDA_CHECK_LAUNCH("maxpool_backward");
}

}  // namespace ddp::kernels::cuda
