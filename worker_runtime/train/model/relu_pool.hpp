// ReLU, 2x2 max-pool and dropout as one pass over the convolution's output (the convnet's conv2),
// and its backward as one scatter: the same values, choices and gradients, bit for bit, as the
// three reference passes (cpu::relu_forward, cpu::maxpool_forward, cpu::dropout_forward and their
// backwards), which read and write the 4x larger pre-pool tensor three times more.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddp/kernels/conv_ref.hpp"

namespace ddp::train {

// For planes [0, s.planes) of z (pre-activation, s.k must be 2): y[j] = the largest of the
// window's relu(z) (the first in the window's row-major order on ties, as maxpool_forward over
// relu'd values), argmax[j] its position in the plane; then, when p > 0, dropout(p) on y with
// counter offset + j (dropout_forward's mask). z is not written.
void relu_maxpool2_dropout_forward(const float* z, float* y, std::int32_t* argmax,
                                   const kernels::PoolShape& s, float p, std::uint64_t seed,
                                   std::uint64_t offset);

// dz (overwritten, s.x_size()) = dy[j] * scale routed to argmax[j] where y[j] > 0 (y: the
// forward's output, after dropout), 0 elsewhere: dropout's, the pool's and the ReLU's backward.
// scale: dropout_scale(p) of the forward's p, or 1 without dropout (then no product is taken).
void relu_maxpool2_dropout_backward(const float* dy, const float* y, const std::int32_t* argmax,
                                    float* dz, const kernels::PoolShape& s, float scale,
                                    bool dropout);

}  // namespace ddp::train
