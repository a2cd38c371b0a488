// Host launchers of ddp-train's CUDA kernels: one operation per file in kernels/src/cuda/, each
// the GPU twin of a CPU reference in cpu_ref.hpp, and tested against it (tests/gpu/). Pointers
// are device memory; each launch goes on `stream`, is asynchronous, and is checked: a launch
// error throws ddp::CudaError naming the kernel (ddp/kernels/check.hpp). Zero-sized calls launch
// nothing.
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace ddp::kernels::cuda {

using Stream = CUstream_st*;  // cudaStream_t; nullptr is the default stream

enum class Act : int { none = 0, relu = 1, sigmoid = 2 };

// y[r][c] = act(y[r][c] + b[c]): bias add and activation fused (cpu::add_bias + *_forward).
void bias_act_forward(float* y, const float* b, std::size_t rows, std::size_t cols, Act act,
                      Stream stream);
// dy *= act'(y), y being the activation's output (cpu::relu_backward, cpu::sigmoid_backward).
void act_backward(float* dy, const float* y, std::size_t n, Act act, Stream stream);
// db[c] += sum over r of dy[r][c] (cpu::sum_rows).
void sum_rows(const float* dy, float* db, std::size_t rows, std::size_t cols, Stream stream);
// Softmax cross-entropy, forward and backward fused, one warp per row: dlogits = scale *
// (softmax - onehot), loss_rows[r] = -log softmax[label] (cpu::softmax_xent sums them).
void softmax_xent(const float* logits, const std::uint8_t* labels, float* dlogits, float* loss_rows,
                  std::size_t rows, std::size_t classes, float scale, Stream stream);
// MSE: dy = scale * 2 (y - t); sq_rows[r] = sum over the row of (y - t)^2 (cpu::mse sums them).
void mse(const float* y, const float* t, float* dy, float* sq_rows, std::size_t rows,
         std::size_t cols, float scale, Stream stream);
// x *= factor (cpu::scale): the 1/WORLD_SIZE of averaged gradients.
void scale(float* x, std::size_t n, float factor, Stream stream);
// torch.optim.SGD in one pass (cpu::sgd_step); buf may be null when momentum is 0.
void sgd_step(float* p, const float* g, float* buf, std::size_t n, float lr, float momentum,
              bool first_step, Stream stream);
// torch.optim.Adam in one pass (cpu::adam_step); t is the step number, from 1.
void adam_step(float* p, const float* g, float* m, float* v, std::size_t n, float lr, float beta1,
               float beta2, float eps, std::int64_t t, Stream stream);
// fp32 <-> bf16 (round to nearest even; cpu::f32_to_bf16 and cpu::bf16_to_f32). bf16 travels as
// its 16 bits.
void f32_to_bf16(const float* in, std::uint16_t* out, std::size_t n, Stream stream);
void bf16_to_f32(const std::uint16_t* in, float* out, std::size_t n, Stream stream);

}  // namespace ddp::kernels::cuda
