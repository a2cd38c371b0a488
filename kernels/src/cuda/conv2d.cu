// conv2d (stride 1, no padding) forward and backward, direct: one thread per output element
// for y and dx, one block per weight (or bias) element for the gradients, reduced in a fixed
// order (no atomics, so runs repeat bit for bit). No cuDNN; the reference is cpu::conv2d_*.
#include "launch.cuh"

#include "ddp/kernels/conv_ops.hpp"

namespace ddp::kernels::cuda {
namespace {

// The shape as plain numbers for the kernels (Conv2dShape's helpers are host code).
struct Dims {
  std::size_t batch, in_c, in_h, in_w, out_c, kh, kw, out_h, out_w;
};

Dims dims_of(const Conv2dShape& s) {
  return {s.batch,    s.in_channels, s.in_h,    s.in_w,   s.out_channels,
          s.kernel_h, s.kernel_w,    s.out_h(), s.out_w()};
}

__device__ std::size_t grid_stride_start() {
  return blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
}
__device__ std::size_t grid_stride_step() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

__global__ void conv2d_forward_kernel(const float* x, const float* w, const float* bias, float* y,
                                      Dims d) {
  const std::size_t total = d.batch * d.out_c * d.out_h * d.out_w;
  for (std::size_t i = grid_stride_start(); i < total; i += grid_stride_step()) {
    const std::size_t ox = i % d.out_w;
    std::size_t t = i / d.out_w;
    const std::size_t oy = t % d.out_h;
    t /= d.out_h;
    const std::size_t o = t % d.out_c;
    const std::size_t b = t / d.out_c;
    float acc = bias != nullptr ? bias[o] : 0.0f;
    for (std::size_t c = 0; c < d.in_c; ++c) {
      const float* xp = x + ((b * d.in_c + c) * d.in_h + oy) * d.in_w + ox;
      const float* wp = w + (o * d.in_c + c) * d.kh * d.kw;
      for (std::size_t ky = 0; ky < d.kh; ++ky) {
        for (std::size_t kx = 0; kx < d.kw; ++kx) acc += wp[ky * d.kw + kx] * xp[ky * d.in_w + kx];
      }
    }
    y[i] = acc;
  }
}

__global__ void conv2d_backward_input_kernel(const float* dy, const float* w, float* dx, Dims d) {
  const std::size_t total = d.batch * d.in_c * d.in_h * d.in_w;
  for (std::size_t i = grid_stride_start(); i < total; i += grid_stride_step()) {
    const std::size_t ix = i % d.in_w;
    std::size_t t = i / d.in_w;
    const std::size_t iy = t % d.in_h;
    t /= d.in_h;
    const std::size_t c = t % d.in_c;
    const std::size_t b = t / d.in_c;
    // The kernel taps that put this input under an output: oy = iy - ky in [0, out_h).
    const std::size_t ky_lo = iy >= d.out_h ? iy - d.out_h + 1 : 0;
    const std::size_t ky_hi = iy + 1 < d.kh ? iy + 1 : d.kh;
    const std::size_t kx_lo = ix >= d.out_w ? ix - d.out_w + 1 : 0;
    const std::size_t kx_hi = ix + 1 < d.kw ? ix + 1 : d.kw;
    float acc = 0.0f;
    for (std::size_t o = 0; o < d.out_c; ++o) {
      const float* dyp = dy + (b * d.out_c + o) * d.out_h * d.out_w;
      const float* wp = w + (o * d.in_c + c) * d.kh * d.kw;
      for (std::size_t ky = ky_lo; ky < ky_hi; ++ky) {
        for (std::size_t kx = kx_lo; kx < kx_hi; ++kx) {
          acc += wp[ky * d.kw + kx] * dyp[(iy - ky) * d.out_w + (ix - kx)];
        }
      }
    }
    dx[i] = acc;
  }
}

// The sum of v over the block (blockDim.x a multiple of 32, at most 1024), valid in thread 0.
// Every thread of the block must call it; it may be called again after it returns.
__device__ float block_sum(float v, float* shared32) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();  // a previous call's readers are done with shared32
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.x == 0) {
    for (unsigned k = 0; k < warps; ++k) total += shared32[k];
  }
  return total;
}

// dweight[o][c][ky][kx] += sum over (b, oy, ox) of dy[b][o][oy][ox] * x[b][c][oy+ky][ox+kx].
__global__ void conv2d_backward_weight_kernel(const float* dy, const float* x, float* dw, Dims d) {
  __shared__ float partial[32];
  const std::size_t weights = d.out_c * d.in_c * d.kh * d.kw;
  const std::size_t plane = d.out_h * d.out_w, terms = d.batch * plane;
  for (std::size_t wi = blockIdx.x; wi < weights; wi += gridDim.x) {
    const std::size_t kx = wi % d.kw;
    std::size_t t = wi / d.kw;
    const std::size_t ky = t % d.kh;
    t /= d.kh;
    const std::size_t c = t % d.in_c;
    const std::size_t o = t / d.in_c;
    float acc = 0.0f;
    for (std::size_t j = threadIdx.x; j < terms; j += blockDim.x) {
      const std::size_t b = j / plane, r = j % plane;
      const std::size_t oy = r / d.out_w, ox = r % d.out_w;
      acc += dy[(b * d.out_c + o) * plane + r] *
             x[((b * d.in_c + c) * d.in_h + oy + ky) * d.in_w + ox + kx];
    }
    const float total = block_sum(acc, partial);
    if (threadIdx.x == 0) dw[wi] += total;
  }
}

// dbias[o] += sum over (b, oy, ox) of dy[b][o][oy][ox].
__global__ void conv2d_backward_bias_kernel(const float* dy, float* dbias, Dims d) {
  __shared__ float partial[32];
  const std::size_t plane = d.out_h * d.out_w, terms = d.batch * plane;
  for (std::size_t o = blockIdx.x; o < d.out_c; o += gridDim.x) {
    float acc = 0.0f;
    for (std::size_t j = threadIdx.x; j < terms; j += blockDim.x) {
      const std::size_t b = j / plane, r = j % plane;
      acc += dy[(b * d.out_c + o) * plane + r];
    }
    const float total = block_sum(acc, partial);
    if (threadIdx.x == 0) dbias[o] += total;
  }
}

// One block per reduced element, at most 65535 blocks (the rest by the grid-stride loop).
unsigned blocks_for(std::size_t outputs) {
  return static_cast<unsigned>(outputs < 65535 ? outputs : 65535);
}

}  // namespace

void conv2d_forward(const float* x, const float* weight, const float* bias, float* y,
                    const Conv2dShape& s, Stream stream) {
  check_shape(s);
  const std::size_t n = s.y_size();
  if (n == 0) return;
  conv2d_forward_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(x, weight, bias, y,
                                                                              dims_of(s));
  DDP_CUDA_CHECK_LAUNCH("conv2d_forward");
}

void conv2d_backward_input(const float* dy, const float* weight, float* dx, const Conv2dShape& s,
                           Stream stream) {
  check_shape(s);
  const std::size_t n = s.x_size();
  if (n == 0) return;
  conv2d_backward_input_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(dy, weight, dx,
                                                                                     dims_of(s));
  DDP_CUDA_CHECK_LAUNCH("conv2d_backward_input");
}

void conv2d_backward_weight(const float* dy, const float* x, float* dweight, const Conv2dShape& s,
                            Stream stream) {
  check_shape(s);
  const std::size_t n = s.w_size();
  if (n == 0) return;
  conv2d_backward_weight_kernel<<<blocks_for(n), detail::kThreads, 0, stream>>>(dy, x, dweight,
                                                                                dims_of(s));
  DDP_CUDA_CHECK_LAUNCH("conv2d_backward_weight");
}

void conv2d_backward_bias(const float* dy, float* dbias, const Conv2dShape& s, Stream stream) {
  check_shape(s);
  if (s.out_channels == 0) return;
  conv2d_backward_bias_kernel<<<blocks_for(s.out_channels), detail::kThreads, 0, stream>>>(
      dy, dbias, dims_of(s));
  DDP_CUDA_CHECK_LAUNCH("conv2d_backward_bias");
}

}  // namespace ddp::kernels::cuda
