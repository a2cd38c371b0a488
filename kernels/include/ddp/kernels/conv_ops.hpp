// Host launchers of the convnet's CUDA kernels (conv2d.cu, maxpool.cu, dropout.cu,
// adadelta.cu): each the GPU twin of a CPU reference in conv_ref.hpp, same layouts and results,
// tested against it (tests/gpu/conv_kernels_test.cpp). As in cuda_ops.hpp: device pointers,
// asynchronous on `stream`, launch errors throw ddp::CudaError, zero-sized calls launch nothing;
// a bad shape throws ddp::ConfigError before any launch. Deterministic: no atomics, each output
// is summed by one thread or one block in a fixed order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddp/kernels/conv_ref.hpp"
#include "ddp/kernels/cuda_ops.hpp"

namespace ddp::kernels::cuda {

// y = conv(x, weight) + bias, one thread per output element (cpu::conv2d_forward); bias may be
// null.
void conv2d_forward(const float* x, const float* weight, const float* bias, float* y,
                    const Conv2dShape& s, Stream stream);
// dx = the input gradient (overwritten), one thread per input element
// (cpu::conv2d_backward_input).
void conv2d_backward_input(const float* dy, const float* weight, float* dx, const Conv2dShape& s,
                           Stream stream);
// dweight += the weight gradient, one block per weight element (cpu::conv2d_backward_weight).
void conv2d_backward_weight(const float* dy, const float* x, float* dweight, const Conv2dShape& s,
                            Stream stream);
// dbias += the bias gradient, one block per output channel (cpu::conv2d_backward_bias).
void conv2d_backward_bias(const float* dy, float* dbias, const Conv2dShape& s, Stream stream);

// k x k max-pool, stride k: y and the argmax within each input plane (cpu::maxpool_forward).
void maxpool_forward(const float* x, float* y, std::int32_t* argmax, const PoolShape& s,
                     Stream stream);
// dx (overwritten, whole) = dy at each window's argmax, 0 elsewhere (cpu::maxpool_backward).
void maxpool_backward(const float* dy, const std::int32_t* argmax, float* dx, const PoolShape& s,
                      Stream stream);

// Inverted dropout with the counter-based mask of conv_ref.hpp: the same mask as
// cpu::dropout_forward for the same (seed, offset). mask may be null; y may be x.
void dropout_forward(const float* x, float* y, std::uint8_t* mask, std::size_t n, float p,
                     std::uint64_t seed, std::uint64_t offset, Stream stream);
// dx = dy through the mask recomputed from (seed, offset) (cpu::dropout_backward); dx may be dy.
void dropout_backward(const float* dy, float* dx, std::size_t n, float p, std::uint64_t seed,
                      std::uint64_t offset, Stream stream);

// torch.optim.Adadelta in one pass (cpu::adadelta_step).
void adadelta_step(float* p, const float* g, float* sq, float* acc, std::size_t n, float lr,
                   float rho, float eps, Stream stream);

}  // namespace ddp::kernels::cuda
