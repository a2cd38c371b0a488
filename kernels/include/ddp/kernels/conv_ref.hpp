// The MNIST convnet's layers on the CPU (issue 19): conv2d, 2x2 max-pool, dropout and the
// Adadelta step, each the reference its CUDA kernel (conv_ops.hpp) is checked against. NCHW
// float buffers, PyTorch's layouts and semantics; no allocation.
#pragma once

#include <cstddef>
#include <cstdint>

// Functions shared verbatim by the CPU reference and the CUDA kernels (the dropout hash).
#if defined(__CUDACC__)
#define DDP_HOST_DEVICE __host__ __device__
#else
#define DDP_HOST_DEVICE
#endif

namespace ddp::kernels {

// A 2-D convolution, stride 1, no padding, no dilation (torch.nn.Conv2d(c_in, c_out, k)):
// x [batch][in_channels][in_h][in_w], weight [out_channels][in_channels][kernel_h][kernel_w],
// bias [out_channels], y [batch][out_channels][out_h][out_w].
struct Conv2dShape {
  std::size_t batch = 0;
  std::size_t in_channels = 0;
  std::size_t in_h = 0;
  std::size_t in_w = 0;
  std::size_t out_channels = 0;
  std::size_t kernel_h = 0;
  std::size_t kernel_w = 0;

  std::size_t out_h() const { return in_h - kernel_h + 1; }
  std::size_t out_w() const { return in_w - kernel_w + 1; }
  std::size_t x_size() const { return batch * in_channels * in_h * in_w; }
  std::size_t w_size() const { return out_channels * in_channels * kernel_h * kernel_w; }
  std::size_t y_size() const { return batch * out_channels * out_h() * out_w(); }
};

// Max-pooling over k x k windows with stride k, floor mode (torch.nn.functional.max_pool2d(x,
// k)): x [planes][in_h][in_w] with planes = batch * channels, y [planes][in_h/k][in_w/k]. The
// rows and columns past the last whole window are ignored, as PyTorch does.
struct PoolShape {
  std::size_t planes = 0;
  std::size_t in_h = 0;
  std::size_t in_w = 0;
  std::size_t k = 2;

  std::size_t out_h() const { return in_h / k; }
  std::size_t out_w() const { return in_w / k; }
  std::size_t x_size() const { return planes * in_h * in_w; }
  std::size_t y_size() const { return planes * out_h() * out_w(); }
};

// Throws ddp::ConfigError naming the field when a shape is unusable: a zero kernel, a kernel
// larger than the input, or a pool window larger than the input.
void check_shape(const Conv2dShape& s);
void check_shape(const PoolShape& s);

// The dropout mask as a pure function of (seed, counter), so the CPU and the GPU draw the same
// mask without sharing state: element i of a call with `offset` uses counter offset + i.
// splitmix64's finalizer, a bijection of 64-bit words, applied to the seed and then to the seed's
// hash xor the counter.
DDP_HOST_DEVICE inline std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// 24 uniform bits in [0, 2^24) for (seed, counter).
DDP_HOST_DEVICE inline std::uint32_t dropout_bits(std::uint64_t seed, std::uint64_t counter) {
  return static_cast<std::uint32_t>(mix64(mix64(seed) ^ counter) >> 40);
}

// An element is kept when its 24 bits are >= threshold: threshold = round(p * 2^24), so each
// element is dropped with probability p (to 2^-24). p must lie in [0, 1].
std::uint32_t dropout_threshold(float p);
// What kept elements are multiplied by: 1 / (1 - p) in float; 0 when p is 1 (all dropped).
float dropout_scale(float p);

}  // namespace ddp::kernels

namespace ddp::kernels::cpu {

// y = conv(x, weight) + bias (bias may be null: no bias).
void conv2d_forward(const float* x, const float* weight, const float* bias, float* y,
                    const Conv2dShape& s);
// dx = the gradient of the input (overwritten): the full correlation of dy with the flipped
// weight.
void conv2d_backward_input(const float* dy, const float* weight, float* dx, const Conv2dShape& s);
// dweight += the gradient of the weight: sum over batch and output positions of dy * x.
void conv2d_backward_weight(const float* dy, const float* x, float* dweight, const Conv2dShape& s);
// dbias[o] += sum over batch and output positions of dy[.][o] (accumulates, as sum_rows does).
void conv2d_backward_bias(const float* dy, float* dbias, const Conv2dShape& s);

// y = the max of each window; argmax[j] = the index within its input plane (row * in_w + col)
// of the element chosen: the first of equal maxima in row-major order, or the last NaN of a
// window holding one (PyTorch's rule, on the CPU and the GPU).
void maxpool_forward(const float* x, float* y, std::int32_t* argmax, const PoolShape& s);
// dx (overwritten) = dy routed to the argmax of each window, 0 elsewhere.
void maxpool_backward(const float* dy, const std::int32_t* argmax, float* dx, const PoolShape& s);

// Inverted dropout (torch.nn.functional.dropout in training): y[i] = x[i] * dropout_scale(p)
// where element i is kept, else 0; mask[i] = 1 kept, 0 dropped (mask may be null). y may be x.
void dropout_forward(const float* x, float* y, std::uint8_t* mask, std::size_t n, float p,
                     std::uint64_t seed, std::uint64_t offset);
// dx = dy through the same mask, recomputed from (seed, offset): nothing is stored between
// forward and backward. dx may be dy.
void dropout_backward(const float* dy, float* dx, std::size_t n, float p, std::uint64_t seed,
                      std::uint64_t offset);

// torch.optim.Adadelta (no weight decay, not maximize), one step on flat arrays:
//   sq = rho sq + (1 - rho) g^2;  delta = sqrt(acc + eps) / sqrt(sq + eps) * g;
//   acc = rho acc + (1 - rho) delta^2;  p -= lr delta.
// sq and acc start at zero (PyTorch's state); PyTorch's defaults are rho 0.9, eps 1e-6.
void adadelta_step(float* p, const float* g, float* sq, float* acc, std::size_t n, float lr,
                   float rho, float eps);

}  // namespace ddp::kernels::cpu
